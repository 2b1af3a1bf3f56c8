"""A new active coordinator's reinitialization: everything its term starts from, loaded before it serves
(docs/architecture.md "The coordinator: election, epochs, fencing").

Tables, bucket assignments (a bucket that existed then waits one leader lease before a new leader serves:
coordinator/leader_leases.py), the leaders' log ends, snapshot handles and leases (ZooKeeper + their files, or
a standby's exact mirror); then the refcounts, orphan lease files, failover grace for leases that expired
during the gap, the history a data loss dropped, and the snapshots no one keeps.
"""

from __future__ import annotations

import logging
import time

from kvlease.common import zkpaths
from kvlease.coordinator.fencing import FencedWriter

log = logging.getLogger("kvlease.coordinator.controller")  # its lines log as they did from the controller


def reinitialize(c, writer: FencedWriter, mirror=None, defer_orphans: bool = False) -> dict:
    """Load tables, snapshot handles and leases into the parts of ``c`` (a
    :class:`~kvlease.coordinator.controller.Controller`); rebuild refcounts; clean up. Before serving.

    ``mirror``: a standby's :class:`~kvlease.leases.mirror.LeaseMirror`, asked for the
    exact persisted leases instead of reading them all again. ``defer_orphans``:
    leave orphan lease files for :class:`~kvlease.coordinator.requests.RemoveOrphanLeaseFiles`
    (listed in the background once serving) instead of listing them now.
    """
    for part in (c.lease_shell, c.snapshot_commits, c.members, c.tables, c.partitions, c.schemas):
        part.writer = writer
    phases = _Phases()
    for path in zkpaths.ROOTS + (zkpaths.TABLES,):
        c.zk.ensure_path(path)
    c.catalog.load(c.zk)
    phases.done("tables")
    # the snapshot listings (a read per bucket) travel while the assignments and log ends are read and parsed
    listings = c.snapshot_commits.start_load(c.catalog.physical.values())
    c.members.load()
    phases.done("assignments")
    c.losses.ends.writer = writer
    c.losses.ends.load(c.zk, c.catalog.physical)
    phases.done("log_ends")
    c.snapshot_commits.finish_load(listings)
    phases.done("snapshots")
    refs = None
    if mirror is not None:
        loaded, layout = mirror.exact()
        refs = mirror.refs  # the index of exactly those leases: not built again
        c.lease_store.adopt(layout, mirror.unreadable)
    else:
        loaded = c.lease_store.load_all(c.zk)
    orphans = [] if defer_orphans else c.lease_store.remove_orphans()
    restored = c.lease_shell.restore(loaded, c.clock_ms(), c.grace_ms, refs)
    phases.done("leases")
    for table_id, buckets in sorted(c.assignments.by_table.items()):  # a crash may have left them kept
        for bucket, state in sorted(buckets.items()):
            if state.losses and table_id in c.catalog.physical:
                c.snapshot_commits.drop_lost_history(c.catalog.physical[table_id].bucket(bucket), state.losses)
    dangling = [(tb, sid) for tb, sid in c.leases.refs.leased() if not c.snapshots.holds(tb, sid)]
    for tb, sid in dangling:
        log.warning("lease refers to snapshot %s of %s which is not stored", sid, tb)
    c.snapshot_commits.reclaim({h.bucket for h in c.snapshots.all()})
    c.snapshots.validate(c.is_protected)
    phases.done("checks")
    stats = {"tables": len(c.catalog.by_id), "partitions": len(c.catalog.physical) - sum(
                 not t.partitioned for t in c.catalog.by_id.values()), "snapshots": sum(1 for _ in c.snapshots.all()),
             "leases": len(loaded), "graced": len(restored.graced), "expired": len(restored.expired),
             "orphan_files": "deferred" if defer_orphans else len(orphans),
             "dangling": len(dangling), "unreadable_leases": sorted(c.lease_store.unreadable),
             "ms": phases.ms}
    log.info("reinitialized: %s", stats)
    c.refresh_metrics()
    return stats


class _Phases:
    """How long each step of a reinitialization took (ms, in its stats: where a slow failover's time went)."""

    def __init__(self) -> None:
        self.ms: dict[str, int] = {}
        self._last = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = round((now - self._last) * 1000)
        self._last = now
