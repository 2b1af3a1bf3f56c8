"""The active coordinator's state, and the dispatcher that routes a batch of requests.

Everything here runs on the event loop's one thread. Each request type has
one registered handler (:func:`kvlease.common.statemachine.on`), which hands it to
the part that owns its concept:

- lease events (:mod:`kvlease.leases.state`) -> :class:`~kvlease.coordinator.lease_shell.LeaseShell`:
  gathered over the batch, their writes persisted together at the end of it
  (or at the next barrier), and only then answered;
- queries: answered from memory at once;
- barriers (tables, snapshot commits, tablet servers, orphan lease files): pending lease writes are
  flushed first, then :class:`~kvlease.coordinator.tables.Tables`, :class:`~kvlease.coordinator.
  snapshot_commits.SnapshotCommits` or :class:`~kvlease.coordinator.membership.Membership` carry them out;
- partition, data-loss and schema requests go to the dispatchers that own them (``partition_requests``,
  ``data_loss_requests``, ``schemas``: :class:`~kvlease.coordinator.schemas.Schemas`).
"""

from __future__ import annotations

import functools
import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooClient

from kvlease.common import errors
from kvlease.common.model import Lease, TableBucket
from kvlease.common.statemachine import Dispatcher, on
from kvlease.common.storage import RemoteStorage
from kvlease.common.tls import TlsFiles
from kvlease.coordinator import election_plan
from kvlease.coordinator import reinit
from kvlease.coordinator import requests as rq
from kvlease.coordinator.assignment import Assignments
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.data_loss import DataLossShell
from kvlease.coordinator.data_loss_requests import DataLossRequests
from kvlease.coordinator.fencing import FencedWriter
from kvlease.coordinator.file_gc import FileCollector
from kvlease.coordinator.lease_shell import LeaseShell
from kvlease.coordinator.partition_requests import PartitionRequests
from kvlease.coordinator.partitions import Partitions
from kvlease.coordinator.loop import Item, settle
from kvlease.coordinator.membership import Membership, Notify
from kvlease.coordinator.moves import Moves
from kvlease.coordinator.orphan_files import OrphanFiles
from kvlease.coordinator.preferred_leaders import PreferredLeaders
from kvlease.coordinator.schemas import Schemas
from kvlease.coordinator.snapshot_checks import LeaderLogEnds, check_epoch
from kvlease.coordinator.snapshot_commits import SnapshotCommits
from kvlease.coordinator.snapshots import SnapshotStore
from kvlease.coordinator.tables import Tables
from kvlease.leases import state as ls
from kvlease.leases.store import LeaseStore

log = logging.getLogger(__name__)

_FATAL = (errors.CoordinatorFencedError, errors.OutcomeUnknownError)  # the coordinator steps down


@dataclass(frozen=True)
class LeaderRebalance:
    """auto.leader-rebalance.enabled, leader.imbalance.check-interval, leader.imbalance.per-server.percentage."""

    enabled: bool = True
    check_interval_ms: int = 30_000
    threshold_pct: float = 10.0


def _query(method):
    """A query: answered from memory at once."""
    @functools.wraps(method)
    def answer(self: "Controller", request, future: Future | None) -> None:
        settle(future, method(self, request))
    return answer


def _barrier(method):
    """A barrier: every gathered lease write is persisted (and answered) before it runs."""
    @functools.wraps(method)
    def run(self: "Controller", request, future: Future | None) -> None:
        self.lease_shell.flush()
        settle(future, method(self, request))
    return run


class Controller(Dispatcher):
    def __init__(self, zk: KazooClient, storage: RemoteStorage, *, num_retained: int, max_lease_ms: int,
                 grace_ms: int, clock_ms: Callable[[], int], metrics=None, notify: Notify | None = None,
                 tls: TlsFiles | None = None, credentials: tuple[str, str] | None = None,
                 default_replication: tuple[int, int] = (1, 1), unclean_election: bool = False,
                 leader_rebalance: LeaderRebalance = LeaderRebalance(), leader_lease_ms: int = 4000,
                 orphans: tuple[int, int] = (3_600_000, 3_600_000), auto_partition_interval_ms: int = 600_000) -> None:
        """``tls`` and ``credentials`` (the cluster's own): how commits' log ends are asked of leaders.
        ``default_replication``: (default.replication-factor, min.insync-replicas) of a table created without
        its own; ``unclean_election``: unclean.leader-election; ``leader_rebalance``: the automatic
        preferred-leader elections' settings; ``leader_lease_ms``: a tablet server's leader lease when its
        registration does not say (coordinator/leader_leases.py); ``orphans``: (kv.snapshot.orphan-grace,
        kv.snapshot.orphan-check-interval) in ms; ``auto_partition_interval_ms``: auto-partition.check-interval."""
        self.zk = zk
        self.storage = storage
        self.clock_ms = clock_ms
        self.grace_ms = grace_ms
        self.metrics = metrics
        self.files = FileCollector(storage)
        catalog = TableCatalog()
        self.members = Membership(zk, catalog, notify, unclean_election=unclean_election, metrics=metrics,
                                  leader_lease_ms=leader_lease_ms)
        self.moves = Moves(self.members)  # replica moves (issue 31): completed as their new replicas catch up
        self.preferred = PreferredLeaders(self.members, clock_ms, enabled=leader_rebalance.enabled,
                                          check_interval_ms=leader_rebalance.check_interval_ms,
                                          threshold_pct=leader_rebalance.threshold_pct, metrics=metrics)
        self.lease_shell = LeaseShell(ls.LeaseState(self, max_lease_ms), LeaseStore(storage), clock_ms=clock_ms,
                                      on_freed=self._freed, metrics=metrics)
        self.snapshot_commits = SnapshotCommits(
            zk, self.files, num_retained=num_retained, clock_ms=clock_ms,
            is_protected=self.is_protected,
            holders=lambda tb, sid: self.leases.refs.holders(tb, sid),
            reclaimed=lambda path: self.orphans.deleted(path))  # a commit naming a file the reclaim deleted
        self.partitions = Partitions(catalog, self.members, self.lease_shell, self.snapshot_commits, clock_ms)
        self.partition_requests = PartitionRequests(self.partitions, self.lease_shell, clock_ms,
                                                    auto_partition_interval_ms)
        self.tables = Tables(catalog, self.members, self.lease_shell, self.snapshot_commits, clock_ms,
                             default_replication, self.partitions)
        self.partitions.on_removed = lambda partition_id: self.losses.ends.table_dropped(partition_id)
        self.schemas = Schemas(catalog, self.members, self.lease_shell, clock_ms)  # coordinator/schemas.py
        self.losses = DataLossShell(self.members, lambda: self.snapshots, clock_ms, metrics,
                                    on_resolved=lambda tb, losses: self.snapshot_commits.drop_lost_history(tb, losses))
        self.loss_requests = DataLossRequests(self.losses, catalog, self.lease_shell)
        #: Commits' log-end checks (gRPC handler threads, never the loop), over channels kept while active.
        self.log_ends = LeaderLogEnds(tls=tls, credentials=credentials)
        #: Remote files no stored snapshot names, deleted after a grace (its timer: the expiry tick).
        self.orphans = OrphanFiles(storage, grace_ms=orphans[0], interval_ms=orphans[1], clock_ms=clock_ms,
                                   catalog=lambda: self.catalog, snapshots=lambda: self.snapshots,
                                   is_protected=self.is_protected, metrics=metrics)

    def is_protected(self, tb: TableBucket, snapshot_id: int) -> bool:
        """Leased (or about to be), or of a table an unreadable lease names (it may hold any of them)."""
        store = self.lease_shell.store
        return (self.leases.is_protected(tb, snapshot_id)
                or bool(store.unreadable) and tb.table_id in store.unreadable_tables())

    def close(self) -> None:
        self.orphans.close()
        self.log_ends.close()
        self.lease_shell.close()
        self.files.close()
        self.lease_shell.store.close()

    # -- the parts' state, by the names callers know -----------------------------------

    @property
    def leases(self) -> ls.LeaseState:
        return self.lease_shell.state

    @property
    def lease_store(self) -> LeaseStore:
        return self.lease_shell.store

    @property
    def snapshots(self) -> SnapshotStore:
        return self.snapshot_commits.store

    @property
    def catalog(self) -> TableCatalog:
        return self.tables.catalog

    @property
    def assignments(self) -> Assignments:
        return self.members.assignments

    @property
    def servers(self) -> dict[int, str]:
        return self.members.servers

    # -- the Catalog protocol of LeaseState ----------------------------------------------

    def buckets_of(self, tb: TableBucket) -> tuple[str, int]:
        """For the lease rules (:class:`kvlease.leases.checks.Catalog`)."""
        table = self.catalog.resolve(tb.table_id, tb.partition_id)
        return table.where, table.buckets

    def table_path(self, table_id: int) -> str | None:
        return self.catalog.table_path(table_id)

    def has_snapshot(self, tb: TableBucket, snapshot_id: int) -> bool:
        return self.snapshots.has_snapshot(tb, snapshot_id)

    # -- reinitialization ------------------------------------------------------------

    def reinitialize(self, writer: FencedWriter, mirror=None, defer_orphans: bool = False) -> dict:
        """Load everything this coordinator's term starts from, before serving (:func:`kvlease.coordinator.reinit.reinitialize`)."""
        return reinit.reinitialize(self, writer, mirror, defer_orphans)

    # -- the batch entry point ---------------------------------------------------------

    def process(self, items: list[Item]) -> list[Item]:
        """Handle a batch; returns the items to hand in again (deferred)."""
        for request, future in items:
            if future is not None and not future.running() and not future.set_running_or_notify_cancel():
                continue  # cancelled by its caller before it ran
            try:
                if type(request) is rq.Guarded:
                    request.guard(self)
                    request = request.request
                self.dispatch(request, future)
            except errors.KvLeaseError as exc:
                settle(future, error=exc)
                if isinstance(exc, _FATAL):
                    raise
        self.preferred.run_queued()  # the elections the batch's AlterIsrs queued, once those are answered
        self.lease_shell.flush()
        self.partition_requests.after_batch()
        deferred, self.lease_shell.deferred = self.lease_shell.deferred, []
        return deferred

    def dispatch(self, request: object, future: Future | None) -> None:
        for part in (self.partition_requests, self.loss_requests, self.schemas):
            if part.handles(request):
                return part.dispatch(request, future)
        if type(request) not in self._handlers:
            raise errors.InvalidRequestError(f"unknown request {type(request).__name__}")
        return super().dispatch(request, future)

    def _freed(self, buckets) -> None:
        """Lease changes freed ``buckets``: their snapshots may be reclaimed, a partition kept past retention
        for them dropped."""
        self.snapshot_commits.reclaim(buckets)
        self.partition_requests.freed(buckets)

    def fail_all(self, error: Exception) -> None:
        """The coordinator steps down: answer every request still waiting."""
        self.lease_shell.fail_all(error)

    def push_all(self) -> None:
        """Tell every live tablet server what it leads (after becoming active)."""
        self.members.push_all()

    # -- lease writes: answered once persisted -------------------------------------------

    @on(ls.Acquire, ls.Renew, ls.Release, ls.Drop)
    def _lease_write(self, event, future: Future | None) -> None:
        self.lease_shell.submit(event, future)

    @on(rq.AcquireLatest)
    def _acquire_latest(self, request: rq.AcquireLatest, future: Future | None) -> None:
        """The snapshots chosen here, on the loop, and acquired in the same batch: none goes in between."""
        table, views = self.catalog.views_named(request.table_id, request.partition_id)
        self.lease_shell.submit(request.acquire(self.snapshot_commits.latest_ids(views), table, views), future)

    @on(ls.Expire)
    def _expire(self, event: ls.Expire, future: Future | None) -> None:
        self.refresh_metrics()
        self.moves.tick()
        self.members.repush()
        self.preferred.tick()
        self.losses.ends.flush()
        self.orphans.tick()
        self.partition_requests.tick()
        self.lease_shell.submit(event, future)

    # -- queries ---------------------------------------------------------------------------

    @on(rq.ListTables)
    @_query
    def _list_tables(self, request: rq.ListTables):
        return self.tables.list(request)

    @on(rq.GetTable)
    @_query
    def _get_table(self, request: rq.GetTable):
        return self.tables.get(request)

    @on(rq.ListSnapshots)
    @_query
    def _list_snapshots(self, request: rq.ListSnapshots):
        _table, views = self.catalog.views_named(request.table_id, request.partition_id)
        return [row for view in views for row in self.snapshot_commits.rows(view, request.latest_only)]

    @on(rq.ListLeases)
    @_query
    def _list_leases(self, _request: rq.ListLeases) -> list[Lease]:
        """The live leases: one past its deadline is hidden before the expiry timer drops it."""
        return self.leases.live_leases(self.clock_ms())

    @on(rq.DescribeLease)
    @_query
    def _describe_lease(self, request: rq.DescribeLease) -> Lease:
        lease = self.leases.live(request.lease_id, self.clock_ms())
        if lease is None:
            raise errors.LeaseNotFoundError(f"lease {errors.show(request.lease_id)} not found",
                                            lease_id=request.lease_id)
        return lease

    @on(rq.GetTableAssignment)
    @_query
    def _table_assignment(self, request: rq.GetTableAssignment):
        table, views = self.catalog.views_named(request.table_id, request.partition_id)
        shown = views[0] if request.partition_id is not None else table  # one partition's: its view
        return shown, [row for view in views for row in self.members.assignment_rows(view)]

    @on(rq.ListTabletServers)
    @_query
    def _list_servers(self, _request: rq.ListTabletServers):
        """(server rows, offline buckets, under-replicated buckets, decommissioned server ids); buckets as
        (table, bucket, offline reason)."""
        offline, under = self.members.health()
        def named(buckets):
            return [(self.catalog.physical[t], b, self.assignments.table(t)[b].offline_reason) for t, b in buckets
                    if t in self.catalog.physical]
        return self.members.server_rows(), named(offline), named(under), sorted(self.members.decommissioned.ids)

    # -- barriers --------------------------------------------------------------------------

    @on(rq.CreateTable)
    @_barrier
    def _create_table(self, request: rq.CreateTable):
        return self.tables.create(request)

    @on(rq.DropTable)
    @_barrier
    def _drop_table(self, request: rq.DropTable):
        before = set(self.catalog.physical)
        self.tables.drop(request)
        for table_id in before - set(self.catalog.physical):
            self.losses.ends.table_dropped(table_id)

    @on(rq.CommitSnapshot)
    @_barrier
    def _commit_snapshot(self, request: rq.CommitSnapshot):
        handle = request.handle
        table = self.catalog.resolve(handle.bucket.table_id, handle.bucket.partition_id)

        def fence() -> None:  # a deposed leader's snapshot of a lost history (coordinator/snapshot_checks.py)
            state = self.assignments.table(table.physical_id).get(handle.bucket.bucket)
            if state is not None:
                check_epoch(handle, state, request.leader_epoch, request.server_id)

        return self.snapshot_commits.commit(table, handle, fence)

    @on(rq.TabletServersChanged)
    @_barrier
    def _servers_changed(self, request: rq.TabletServersChanged):
        servers = self.members.read_servers() if request.servers is None else dict(request.servers)
        return self.members.servers_changed(servers)

    @on(rq.PushDelivered)
    def _push_delivered(self, request: rq.PushDelivered, future: Future | None) -> None:
        self.members.push_delivered(request.server_id, request.seq)
        settle(future)

    @on(rq.PushUndelivered)
    def _push_undelivered(self, request: rq.PushUndelivered, future: Future | None) -> None:
        self.members.push_undelivered(request.server_id)
        settle(future)

    @on(rq.AlterIsr)
    @_barrier
    def _alter_isr(self, request: rq.AlterIsr):
        before = self.assignments.table(request.table_id).get(request.bucket)
        after = self.members.alter_isr(request.server_id, request.table_id, request.bucket, request.leader_epoch,
                                       request.bucket_epoch, request.isr)
        self.preferred.isr_changed(request.table_id, request.bucket, before)
        return after

    @on(rq.ControlledShutdown)
    @_barrier
    def _controlled_shutdown(self, request: rq.ControlledShutdown) -> int:
        return self.members.controlled_shutdown(request.server_id)

    @on(rq.ResignLeadership)
    @_barrier
    def _resign_leadership(self, r: rq.ResignLeadership) -> list:
        """A leader that cannot write hands buckets to other live in-sync replicas (one write), or keeps those with
        none: each one's Resignation, or the error that refused it."""
        changes, outcomes = election_plan.resign_leaderships(
            self.assignments, r.server_id, [(t, b, epoch) for t, b, epoch, _why in r.buckets], set(self.servers),
            {t: table.where for t, table in self.catalog.physical.items()})
        if changes:
            self.members.apply(changes)
        for (table_id, bucket, _epoch, why), outcome in zip(r.buckets, outcomes):
            if isinstance(outcome, election_plan.Resignation) and not outcome.refused:
                self.preferred.resigned(r.server_id)  # not handed back at once (coordinator/preferred_leaders.py)
            if isinstance(outcome, election_plan.Resignation):  # refusals are asked again: logged quieter
                log.log(logging.INFO if outcome.refused else logging.WARNING, "tablet server %d cannot write bucket "
                        "%d of table %d (%s): %s", r.server_id, bucket, table_id, why,
                        outcome.refused or f"tablet server {outcome.state.leader} leads it now")
        return outcomes

    @on(rq.ReassignBucket)
    @_barrier
    def _reassign(self, request: rq.ReassignBucket):
        table = self.catalog.get(request.database, request.name)
        if request.partition:
            view = self.catalog.partition(table, self.partitions.name_of(table, request.partition, check_time=False))
            if view is None:
                raise errors.PartitionNotExistsError(f"partition {request.partition} of table {table.path} does not "
                                                     f"exist", table=table.path)
        else:
            view = self.catalog.resolve(table.table_id, request.partition_id)
        return self.moves.reassign(view, request.bucket, request.replicas)

    @on(rq.DecommissionTablet)
    @_barrier
    def _decommission(self, request: rq.DecommissionTablet):
        return self.moves.decommission(request.tablet_id)

    @on(rq.RecommissionTablet)
    @_barrier
    def _recommission(self, request: rq.RecommissionTablet) -> bool:
        return self.moves.recommission(request.tablet_id)

    @on(rq.Rebalance)
    @_barrier
    def _rebalance(self, request: rq.Rebalance):
        return self.moves.rebalance(request.leaders_only)

    @on(rq.ListReassignments)
    @_query
    def _list_reassignments(self, _request: rq.ListReassignments):
        return self.moves.in_progress()

    @on(rq.RemoveOrphanLeaseFiles)
    @_barrier
    def _remove_orphans(self, request: rq.RemoveOrphanLeaseFiles) -> list[str]:
        """Delete the listed lease files that no lease points at.

        A barrier (lease writes flushed before): no lease write is in flight, and
        a file is only ever pointed at by the write that created it, so a listed
        file no persisted lease names now is an orphan for good.
        """
        orphans = self.lease_store.unreferenced(request.listed)
        if orphans:
            log.info("removing %d orphan lease files", len(orphans))
            self.files.delete(orphans)
        return orphans

    # -- metrics ------------------------------------------------------------------------------

    def refresh_metrics(self) -> None:
        """Publish the lease counts (every expiry tick): O(tables + partitions held), from counts the state keeps."""
        if self.metrics is None:
            return
        (leases, per_table), refs = self.leases.lease_counts(), self.leases.refs
        self.metrics.set_lease_counts(leases, refs.leased_count(), per_table, dict(refs.leased_count_by_table()))
        self.metrics.set_partition_lease_counts(self.leases.partition_lease_counts(),
                                                refs.leased_count_by_partition(), self.catalog.physical)
        self.metrics.lease_files_unreadable.set(sum(map(len, self.lease_store.unreadable.values())))
