"""Snapshots and changelog retention of the buckets a tablet server holds: :class:`ReplicaSnapshots`, a part
:class:`~kvlease.tablet.replicas.manager.ReplicaManager` owns (its ``snapshot`` and ``snapshot_changed`` call it).

A snapshot is taken by a bucket's leader only, from committed state (its
RocksDB holds nothing above the HW): RocksDB checkpoint -> upload of the SST
files the last committed snapshot does not have + a manifest ->
CommitKvSnapshot. Before each step after the checkpoint (the upload's claim
of the id, every file, the commit) :func:`still_leads` asks whether this
server still leads the bucket at the epoch the checkpoint was taken under; a
deposed leader stops and deletes what it uploaded (``docs/snapshots.md``).
Changelog retention is the same on every replica (any of them may lead next):
segments below the lowest kept snapshot's log offset and older than
``log.retention`` go.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Callable

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.kvsnapshot import missing_files
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.storage import RemoteStorage
from kvlease.tablet.replicas.replica import Replica
from kvlease.tablet.replication.leader_lease import LeaderLease
from kvlease.tablet.store.snapshot import upload_and_commit

log = logging.getLogger(__name__)

PARTITION_LISTINGS_MAX = 8  # a retention round asks per partition up to this many partitions of a table, else once


def still_leads(replica: Replica, leader_epoch: int, lease: LeaderLease) -> None:
    """Raises NotLeaderError unless this server still leads ``replica`` at ``leader_epoch`` (the epoch its
    snapshot's checkpoint was taken under) and its leader ``lease`` is valid. The one check a snapshot
    makes before each of its steps: a push that deposed it or named a newer epoch, a replica closed under
    it, or a lease that lapsed (a leader paused or cut off, which may have been deposed without hearing it:
    docs/architecture.md, "Leader leases"). Should it still go on, the coordinator refuses its commit (its
    epoch is older than the bucket's) and its files carry names of their own."""
    role = replica.role
    if (replica.closed or not replica.leads or replica.store.following
            or (role is not None and role.leader_epoch != leader_epoch)):
        raise errors.NotLeaderError(f"this tablet server no longer leads {replica.where} at leader epoch "
                                    f"{leader_epoch} (its snapshot stops)", **replica.details)
    if not lease.valid():
        raise errors.NotLeaderError(f"this tablet server's leader lease lapsed: it may have been deposed as leader "
                                    f"of {replica.where} (its snapshot stops)", **replica.details)


class ReplicaSnapshots:
    """The snapshots and changelog retention of the replicas a tablet server holds (see the module docstring).

    ``admin``: a :class:`kvlease.client.admin.AdminClient` (the latest snapshots, commits, the kept snapshots);
    ``storage``: the remote storage; ``config``: the server's (``snapshot.*``, ``log.retention``);
    ``lease``: the server's leader lease; ``server_id``: this server's; ``bucket_dir(physical_id, bucket)``:
    a bucket's local dir (its checkpoints are made under it).

    A bucket's latest snapshot is asked of the coordinator with its table's id and its partition's (None for
    an unpartitioned table), so the answer lists that partition's buckets only; the kept snapshots (changelog
    retention) are asked once per table, or per partition for a few (:meth:`apply_retention`), and each
    replica takes those of its own bucket (:attr:`Replica.tb`, with its partition)."""

    def __init__(self, admin, storage: RemoteStorage, config: cfg.Config, lease: LeaderLease, server_id: int,
                 bucket_dir: Callable[[int, int], str]) -> None:
        self.admin = admin
        self.storage = storage
        self.config = config
        self.lease = lease
        self.server_id = server_id
        self.bucket_dir = bucket_dir
        self._every_bucket_at = 0.0  # monotonic time the next retention of every bucket held is due

    # -- snapshots ---------------------------------------------------------------------------

    def learn_base(self, replica: Replica) -> None:
        """Learn the bucket's latest committed snapshot from the coordinator, once: the next snapshot
        id follows it and its SST files are not uploaded again. Raises the coordinator's error."""
        if replica.base_known:
            return
        # a partition's bucket asks for its partition's snapshots only (not every partition's of its table)
        latest = self.admin.get_latest_kv_snapshots(replica.table.table_id, replica.table.partition_id)
        info = latest.get(replica.tb)
        with replica.snapshot_lock:
            if replica.base_known:
                return
            if info is not None:
                replica.uploader.mark_committed(info.handle)
                replica.next_snapshot_id = max(replica.next_snapshot_id, info.handle.snapshot_id + 1)
                replica.snapshot_offset = info.handle.log_offset
            loss = replica.role.latest_loss if replica.role is not None else None
            if loss is not None:  # the ids of snapshots a loss dropped are never used again
                replica.next_snapshot_id = max(replica.next_snapshot_id, loss.next_snapshot_id)
            replica.base_known = True

    def snapshot(self, replica: Replica, force: bool = False) -> SnapshotHandle | None:
        """Checkpoint, upload and commit one bucket, then apply its changelog retention; None when
        it has not changed."""
        (result,) = self.snapshot_each([replica], force)
        if isinstance(result, Exception):
            raise result
        return result

    def snapshot_each(self, replicas: list[Replica], force: bool = False, verify: bool = False
                      ) -> list[SnapshotHandle | None | errors.KvLeaseError]:
        """:meth:`snapshot` of each bucket in turn, a failure answered in its place (the others go on),
        then the changelog retention of those that committed, asking the coordinator for the kept
        snapshots once per table. ``verify``: an unchanged bucket whose latest snapshot lost a file on
        remote storage is snapshotted anyway (one listing per bucket; an explicit trigger does this,
        the periodic round does not)."""
        results: list[SnapshotHandle | None | errors.KvLeaseError] = []
        for replica in replicas:
            try:
                results.append(self._snapshot(replica, force, verify))
            except errors.KvLeaseError as exc:
                results.append(exc)
            except Exception as exc:  # a bug or a local I/O failure: answered, the others go on
                log.exception("snapshot of %s failed", replica.tb)
                results.append(errors.UnknownServerError(f"snapshot of bucket {replica.bucket} failed: {exc}"))
        self.apply_retention([r for r, h in zip(replicas, results) if isinstance(h, SnapshotHandle)])
        return results

    def _snapshot(self, replica: Replica, force: bool, verify: bool = False) -> SnapshotHandle | None:
        self.learn_base(replica)  # the snapshot id must follow the committed ones
        if replica.replicated:
            replica.leadership()  # its store leads (at the role's epoch) before it is stamped: NotLeaderError if not
        with replica.snapshot_lock:
            if not force and not replica.changed() and not (verify and self._lost_files(replica)):
                return None
            snapshot_id = replica.next_snapshot_id
            work = os.path.join(self.bucket_dir(*replica.key), "checkpoints")
            os.makedirs(work, exist_ok=True)
            target = os.path.join(work, f"snap-{snapshot_id}")
            shutil.rmtree(target, ignore_errors=True)
            replica.next_snapshot_id = snapshot_id + 1  # never reused, even if this attempt fails
            try:
                log_offset, epoch = replica.store.leader_checkpoint(target)  # the coordinator fences by epoch
                writers = replica.store.writer_batches(log_offset)  # a replica rebuilt from it knows them
                said = epoch if epoch >= 0 else None

                def commit(handle: SnapshotHandle) -> None:
                    self.admin.commit_kv_snapshot(handle, leader_epoch=said, server_id=self.server_id)

                handle = upload_and_commit(replica.uploader, commit, target, snapshot_id, log_offset, writers,
                                           leader_epoch=said, check=lambda: still_leads(replica, epoch, self.lease),
                                           reuse_pending_ms=self.config[cfg.SNAPSHOT_ORPHAN_GRACE] // 2)
            finally:
                shutil.rmtree(target, ignore_errors=True)
            replica.snapshot_offset = log_offset
            log.info("snapshot %d of %s committed at log offset %d", snapshot_id, replica.tb, log_offset)
        return handle

    def _lost_files(self, replica: Replica) -> bool:
        """Whether the latest committed snapshot misses a file on remote storage (then a new one is due)."""
        base = replica.uploader.base
        if base is None:
            return False
        missing = missing_files(self.storage, base.files)
        if missing:
            log.warning("snapshot %d of %s lost %d files on remote storage (e.g. %s): taking a new one",
                        base.snapshot_id, replica.tb, len(missing), missing[0][0])
        return bool(missing)

    def snapshot_changed(self, led: Callable[[], list[Replica]], followed: Callable[[], list[Replica]]) -> int:
        """Snapshot every led bucket that changed since its last snapshot, then apply the changelog
        retention of those committed, and once every ``log.retention.check-interval`` of every bucket held
        (followed ones, and led ones that did not change: their segments age past ``log.retention`` too);
        returns how many committed. ``led()``: the replicas led now, ``followed()`` those followed (asked
        once the snapshots are taken)."""
        committed, unchanged = [], []
        for replica in led():
            if not replica.store.files.known:
                continue  # not opened since this server started: the keeper opens it, the next round looks
            try:
                (committed if self._snapshot(replica, force=False) is not None else unchanged).append(replica)
            except Exception as exc:  # retried at the next interval
                log.warning("snapshot of %s failed: %s", replica.tb, exc)
        checked = committed
        if self._every_bucket_due():
            checked = committed + unchanged + [r for r in followed() if r.store.files.known]
        self.apply_retention(checked)
        return len(committed)

    def _every_bucket_due(self) -> bool:
        """Whether the retention of every bucket held is due (the first round, then once an interval)."""
        now = time.monotonic()
        if now < self._every_bucket_at:
            return False
        self._every_bucket_at = now + self.config[cfg.LOG_RETENTION_CHECK_INTERVAL] / 1000.0
        return True

    # -- changelog retention ------------------------------------------------------------------

    def apply_retention(self, replicas: list[Replica]) -> int:
        """Delete changelog segments of each bucket below the lowest log offset of its kept
        snapshots (leased ones included) that are also older than ``log.retention``; returns how many
        segments went. A bucket whose changelog is known to be empty is skipped (nothing to delete, no
        question asked). The coordinator is asked for the kept snapshots once per table, or once per
        partition when the buckets are of a few partitions of a partitioned table (the usual round: writes
        go to the latest partitions). A bucket whose changelog cannot be read now (its files failed and do
        not reopen: a full disk) is left for the next round; the others go on."""
        by_table: dict[int, list[Replica]] = {}
        for replica in replicas:
            known = replica.store.files.known_offsets()
            if known is None or known[0] < known[1]:
                by_table.setdefault(replica.table.table_id, []).append(replica)
        deleted = 0
        for table_id, group in sorted(by_table.items()):
            try:
                kept = self._kept_by_bucket(table_id, group)
            except errors.KvLeaseError as exc:
                log.warning("cannot learn the kept snapshots of table %d: %s", table_id, exc)
                continue
            for replica in group:
                try:
                    deleted += self._truncate_log(replica, kept.get(replica.tb, ()))
                except Exception as exc:  # its files failed (a full disk): the next round tries again
                    log.warning("changelog retention of %s failed: %s", replica.tb, exc)
        return deleted

    def _kept_by_bucket(self, table_id: int, group: list[Replica]) -> dict[TableBucket, list]:
        """The kept snapshots of the buckets of ``group`` (replicas of table ``table_id``), by bucket."""
        partitions = {replica.table.partition_id for replica in group}
        if None in partitions or len(partitions) > PARTITION_LISTINGS_MAX:
            listings = [self.admin.list_kv_snapshots(table_id)]
        else:
            listings = [self.admin.list_kv_snapshots(table_id, pid) for pid in sorted(partitions)]
        kept: dict[TableBucket, list] = {}
        for listing in listings:
            for info in listing:
                kept.setdefault(info.bucket, []).append(info)
        return kept

    def _truncate_log(self, replica: Replica, kept) -> int:
        if not kept:
            return 0  # no snapshot: the changelog is the only copy
        keep_from = min(s.log_offset for s in kept)
        known = replica.store.files.known_offsets()  # from memory while parked
        if known is not None and known[0] >= keep_from:
            return 0  # no record below keep_from: nothing to delete, and a parked bucket is not opened to list
        cutoff_s = time.time() - self.config[cfg.LOG_RETENTION] / 1000.0
        segments = replica.store.log_segments()
        old_enough = [s for s in segments if s.end_offset <= keep_from and s.mtime <= cutoff_s]
        if not old_enough:
            return 0
        return replica.store.truncate_log_before(max(s.end_offset for s in old_enough))
