"""The active coordinator's state and how requests change it.

Everything here runs on the event loop's one thread. Lease changes go through
the pure :class:`~leases.state.LeaseState`; the writes it asks for are
gathered over a batch of requests, their metadata files written in parallel,
and their ZooKeeper operations sent together (epoch-fenced multi-ops, each
write succeeding or failing alone); only then is memory changed and the callers
answered. Tables and snapshot commits are barriers: pending lease writes are
flushed before them.
"""

from __future__ import annotations

import itertools
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from common import errors, zkpaths
from common.storage import RemoteStorage
from common.tables import validate_spec
from common.zk import ZkOp, dumps, loads
from coordinator import requests as rq
from coordinator.assignment import UNASSIGNED, Assignments
from coordinator.catalog import TableCatalog
from coordinator.fencing import FencedWriter
from coordinator.snapshots import SnapshotStore
from leases import state as ls
from common.model import Lease, SnapshotHandle, TableBucket
from leases.store import LeaseStore, PreparedWrite

log = logging.getLogger(__name__)

MAX_OPS_PER_MULTI = 500
MAX_BYTES_PER_MULTI = 256 * 1024  # well under ZooKeeper's default request limit (jute.maxbuffer, 1 MiB)
Item = tuple[object, "Future | None"]
#: notify(server_id, address, [(table, bucket, leader_epoch)], dropped_table_ids): push leadership
Notify = Callable[[int, str, list, list], None]


class Controller:
    def __init__(self, zk: KazooClient, storage: RemoteStorage, *, num_retained: int, max_lease_ms: int,
                 grace_ms: int, clock_ms: Callable[[], int], metrics=None, notify: Notify | None = None) -> None:
        self.zk = zk
        self.storage = storage
        self.clock_ms = clock_ms
        self.grace_ms = grace_ms
        self.metrics = metrics
        self.catalog = TableCatalog()
        self.assignments = Assignments()
        self.servers: dict[int, str] = {}  # live tablet servers: id -> address
        self._incarnations: dict[int, tuple[str, str]] = {}
        self.notify = notify
        self.snapshots = SnapshotStore(num_retained)
        self.leases = ls.LeaseState(self, max_lease_ms)
        self.lease_store = LeaseStore(storage)
        self.writer: FencedWriter | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, Item] = {}  # lease event id -> (request, future)
        self._batch: list[ls.PersistLease] = []
        self._deferred: list[Item] = []
        self._freed: list[tuple[TableBucket, int]] = []
        self._file_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="file-gc")

    def close(self) -> None:
        self._file_pool.shutdown(wait=True)
        self.lease_store.close()

    # -- the Catalog protocol of LeaseState -------------------------------------------

    def bucket_count(self, table_id: int) -> int | None:
        return self.catalog.bucket_count(table_id)

    def has_snapshot(self, tb: TableBucket, snapshot_id: int) -> bool:
        return self.snapshots.has_snapshot(tb, snapshot_id)

    # -- reinitialization ------------------------------------------------------------

    def reinitialize(self, writer: FencedWriter, mirror=None, defer_orphans: bool = False) -> dict:
        """Load tables, snapshot handles and leases; rebuild refcounts; clean up. Before serving.

        ``mirror``: a standby's :class:`~leases.mirror.LeaseMirror`, asked for the
        exact persisted leases instead of reading them all again. ``defer_orphans``:
        leave orphan lease files for :class:`~coordinator.requests.RemoveOrphanLeaseFiles`
        (listed in the background once serving) instead of listing them now.
        """
        self.writer = writer
        for path in zkpaths.ROOTS + (zkpaths.TABLES,):
            self.zk.ensure_path(path)
        self.catalog.load(self.zk)
        for table_id in self.assignments.load(self.zk, sorted(self.catalog.by_id)):
            plan = self.assignments.plan_new(self.catalog.by_id[table_id].buckets, [])
            self.writer.commit([self.assignments.create_op(table_id, plan)])
            self.assignments.set(table_id, plan)
        self.snapshots = SnapshotStore(self.snapshots.num_retained)
        for handle in self._load_snapshot_handles():
            self.snapshots.add(handle)
        if mirror is not None:
            loaded, layout = mirror.exact()
            self.lease_store.adopt(layout)
        else:
            loaded = self.lease_store.load_all(self.zk)
        orphans = [] if defer_orphans else self.lease_store.remove_orphans()
        now = self.clock_ms()
        graced = sum(1 for lease in loaded if lease.expiration_time <= now)
        self.leases = ls.LeaseState(self, self.leases.max_duration_ms)
        self.leases.handle(ls.Restore(next(self._ids), tuple(loaded), now, self.grace_ms))
        self.leases.validate()
        dangling = [(tb, sid) for tb, sid in self.leases.refs.leased() if not self.snapshots.has_snapshot(tb, sid)]
        for tb, sid in dangling:
            log.warning("lease refers to snapshot %s of %s which is not stored", sid, tb)
        buckets = {h.bucket for h in self.snapshots.all()}
        self._reclaim(buckets)
        self.snapshots.validate(self.leases.is_protected)
        stats = {"tables": len(self.catalog.by_id), "snapshots": sum(1 for _ in self.snapshots.all()),
                 "leases": len(loaded), "graced": graced,
                 "orphan_files": "deferred" if defer_orphans else len(orphans),
                 "dangling": len(dangling)}
        log.info("reinitialized: %s", stats)
        self.refresh_metrics()
        return stats

    def _load_snapshot_handles(self) -> list[SnapshotHandle]:
        bucket_nodes = []
        for table in self.catalog.by_id.values():
            for bucket in range(table.buckets):
                bucket_nodes.append(zkpaths.bucket_snapshots(table.table_id, bucket))
        listings = [(p, self.zk.get_children_async(p)) for p in bucket_nodes]
        gets = []
        for parent, result in listings:
            try:
                gets.extend(self.zk.get_async(f"{parent}/{sid}") for sid in result.get())
            except NoNodeError:
                continue
        return [SnapshotHandle.from_json(loads(result.get()[0])) for result in gets]

    # -- the batch entry point ---------------------------------------------------------

    def process(self, items: list[Item]) -> list[Item]:
        """Handle a batch; returns the items to hand in again (deferred)."""
        self._deferred = []
        for request, future in items:
            if future is not None and not future.running() and not future.set_running_or_notify_cancel():
                continue  # cancelled by its caller before it ran
            try:
                if isinstance(request, rq.LEASE_WRITES):
                    self._lease_request(request, future)
                elif isinstance(request, rq.QUERIES):
                    _resolve(future, self._query(request))
                else:
                    self._flush()
                    _resolve(future, self._barrier(request))
            except errors.KvLeaseError as exc:
                if isinstance(exc, (errors.CoordinatorFencedError, errors.OutcomeUnknownError)):
                    _fail(future, exc)
                    raise
                _fail(future, exc)
        self._flush()
        return self._deferred

    def fail_all(self, error: Exception) -> None:
        """The coordinator steps down: answer every request still waiting."""
        for _request, future in list(self._waiting.values()) + self._deferred:
            _fail(future, error)
        self._waiting.clear()
        self._deferred = []
        self._batch = []

    # -- leases ------------------------------------------------------------------------

    def _lease_request(self, request, future) -> None:
        event_id = next(self._ids)
        if isinstance(request, rq.AcquireLease):
            event = ls.Acquire(event_id, request.lease_id, dict(request.snapshots), request.duration_ms,
                               self.clock_ms())
        elif isinstance(request, rq.RenewLease):
            event = ls.Renew(event_id, request.lease_id, request.duration_ms, self.clock_ms())
        elif isinstance(request, rq.ReleaseLease):
            event = ls.Release(event_id, request.lease_id, frozenset(request.buckets))
        elif isinstance(request, rq.DropLease):
            event = ls.Drop(event_id, request.lease_id)
        else:
            event = ls.Expire(event_id, self.clock_ms())
            self.refresh_metrics()
        self._waiting[event_id] = (request, future)
        self._carry_out(self.leases.handle(event))

    def _carry_out(self, instructions: Iterable[object]) -> None:
        for ins in instructions:
            if isinstance(ins, ls.Reply):
                _request, future = self._waiting.pop(ins.event_id)
                if ins.error is not None:
                    _fail(future, ins.error)
                else:
                    _resolve(future, ins.result)
            elif isinstance(ins, ls.PersistLease):
                self._batch.append(ins)
            elif isinstance(ins, ls.Deferred):
                self._deferred.append(self._waiting.pop(ins.event.event_id))
            elif isinstance(ins, ls.SnapshotsFreed):
                self._freed.extend(ins.snapshots)
            elif isinstance(ins, ls.LeasesExpired):
                log.info("leases expired: %s", ", ".join(ins.lease_ids))
                if self.metrics:
                    self.metrics.leases_expired.inc(len(ins.lease_ids))

    def _flush(self) -> None:
        """Persist every gathered lease write, then apply the results."""
        batch, self._batch = self._batch, []
        if batch:
            prepared: list[PreparedWrite] = []
            for write, result in zip(batch, self.lease_store.prepare(batch)):
                if isinstance(result, errors.StorageError):
                    self._carry_out(self.leases.handle(ls.WriteFailed(write.write_id, result)))
                else:
                    prepared.append(result)
            try:
                outcomes = self._commit_lease_ops([p.op for p in prepared])
            except errors.CoordinatorFencedError as exc:
                for p in prepared:
                    self.lease_store.failed(p)  # the epoch check failed: nothing points at them
                for p in prepared:
                    self._carry_out(self.leases.handle(ls.WriteFailed(p.write.write_id, exc)))
                raise
            except errors.OutcomeUnknownError as exc:  # keep the files: ZooKeeper may point at them
                for p in prepared:
                    self._carry_out(self.leases.handle(ls.WriteFailed(p.write.write_id, exc)))
                raise
            for p, outcome in zip(prepared, outcomes):
                if outcome is None:
                    self.lease_store.committed(p)
                    self._carry_out(self.leases.handle(ls.WriteDone(p.write.write_id)))
                else:
                    self.lease_store.failed(p)
                    self._carry_out(self.leases.handle(ls.WriteFailed(p.write.write_id, outcome)))
        if self._freed:
            freed, self._freed = self._freed, []
            self._reclaim({tb for tb, _sid in freed})

    def _commit_lease_ops(self, ops: list[ZkOp]) -> list[Exception | None]:
        """Commit lease writes (one op each, distinct leases); None per success.

        Several writes share one fenced multi-op (chunks pipelined): one request,
        one epoch check and one ZooKeeper transaction instead of one per write,
        which more than halves the ZooKeeper client's and server's work per
        lease write. A chunk ZooKeeper rejects (one bad op rolls back all of it)
        is sent again one write per multi-op, so each write still succeeds or
        fails on its own. Raises what :meth:`FencedWriter.commit_many` raises.
        """
        chunks = _chunks(ops)
        outcomes: list[Exception | None] = []
        for chunk, outcome in zip(chunks, self.writer.commit_many(chunks)):
            if outcome is None:
                outcomes.extend([None] * len(chunk))
            elif len(chunk) == 1:
                outcomes.append(outcome)
            else:
                outcomes.extend(self.writer.commit_many([[op] for op in chunk]))
        return outcomes

    # -- snapshots -----------------------------------------------------------------------

    def _reclaim(self, buckets: Iterable[TableBucket]) -> None:
        """Delete every snapshot of these buckets that is neither retained nor leased, now.

        Snapshots named by a lease write in flight count as leased
        (``LeaseState.is_protected``), though reclaim runs after flushes anyway.
        """
        doomed = [h for tb in buckets for h in self.snapshots.reclaimable(tb, self.leases.is_protected)]
        for start in range(0, len(doomed), MAX_OPS_PER_MULTI):
            chunk = doomed[start:start + MAX_OPS_PER_MULTI]
            ops = [ZkOp("delete", zkpaths.snapshot(h.bucket.table_id, h.bucket.bucket, h.snapshot_id,
                                                   h.bucket.partition_id)) for h in chunk]
            try:
                self.writer.commit(ops)
            except errors.StorageError as exc:  # stays stored; retried at the next change or failover
                log.warning("could not delete %d snapshot handles: %s", len(chunk), exc)
                continue
            files: list[str] = []
            for handle in chunk:
                files.extend(self.snapshots.remove(handle))
            log.info("reclaimed %d snapshots (%d files)", len(chunk), len(files))
            self._delete_files(files)

    def _delete_files(self, paths: list[str]) -> None:
        if paths:
            self._file_pool.submit(_delete_quietly, self.storage, paths)

    def _commit_snapshot(self, handle: SnapshotHandle) -> None:
        table = self.catalog.get_by_id(handle.bucket.table_id)
        if handle.bucket.partition_id is not None or not 0 <= handle.bucket.bucket < table.buckets:
            raise errors.BucketOutOfRangeError(f"bucket {handle.bucket} does not exist in table {table.path}")
        if not self.snapshots.check_commit(handle):
            return  # the same snapshot again: an idempotent retry
        if not handle.commit_time_ms:
            handle = SnapshotHandle(handle.bucket, handle.snapshot_id, handle.log_offset, handle.metadata_path,
                                    handle.files, self.clock_ms())
        path = zkpaths.snapshot(table.table_id, handle.bucket.bucket, handle.snapshot_id)
        self.writer.commit([ZkOp("create", path, dumps(handle.to_json()))])
        self.snapshots.add(handle)
        self._reclaim([handle.bucket])

    def snapshot_rows(self, table_id: int, latest_only: bool) -> list[tuple[SnapshotHandle, tuple[str, ...], bool]]:
        table = self.catalog.get_by_id(table_id)
        rows = []
        for bucket in range(table.buckets):
            tb = TableBucket(table_id, bucket)
            handles = self.snapshots.bucket_snapshots(tb)
            if latest_only:
                handles = handles[-1:]
            for h in handles:
                rows.append((h, tuple(sorted(self.leases.refs.holders(tb, h.snapshot_id))),
                             self.snapshots.is_retained(tb, h.snapshot_id)))
        return rows

    # -- tables and other barriers ------------------------------------------------------

    def _barrier(self, request):
        if isinstance(request, rq.CreateTable):
            return self._create_table(request)
        if isinstance(request, rq.DropTable):
            return self._drop_table(request)
        if isinstance(request, rq.CommitSnapshot):
            return self._commit_snapshot(request.handle)
        if isinstance(request, rq.RemoveOrphanLeaseFiles):
            return self._remove_orphans(request.listed)
        if isinstance(request, rq.TabletServersChanged):
            servers = self._read_servers() if request.servers is None else dict(request.servers)
            return self._servers_changed(servers)
        raise errors.InvalidRequestError(f"unknown request {type(request).__name__}")

    def _remove_orphans(self, listed: Iterable[str]) -> list[str]:
        """Delete the listed lease files that no lease points at.

        A barrier (lease writes flushed before): no lease write is in flight, and
        a file is only ever pointed at by the write that created it, so a listed
        file no persisted lease names now is an orphan for good.
        """
        orphans = self.lease_store.unreferenced(listed)
        if orphans:
            log.info("removing %d orphan lease files", len(orphans))
            self._delete_files(orphans)
        return orphans

    def _create_table(self, request: rq.CreateTable):
        spec = validate_spec(request.spec)
        if (spec.database, spec.name) in self.catalog.by_name:
            if request.ignore_if_exists:
                return self.catalog.get(spec.database, spec.name)
            raise errors.TableAlreadyExistError(f"table {spec.database}.{spec.name} already exists")
        table, ops = self.catalog.create_ops(spec, self.clock_ms())
        plan = self.assignments.plan_new(table.buckets, sorted(self.servers))
        self.writer.commit(ops + [self.assignments.create_op(table.table_id, plan)])
        self.catalog.add(table)
        self.assignments.set(table.table_id, plan)
        self._push_leadership(self.assignments.leaders_of(table.table_id))
        log.info("created table %s (id %d, %d buckets)", table.path, table.table_id, table.buckets)
        return table

    def _drop_table(self, request: rq.DropTable):
        try:
            table = self.catalog.get(request.database, request.name)
        except errors.TableNotExistError:
            if request.ignore_if_not_exists:
                return None
            raise
        # 1. no lease may point at the table any more
        done: Future = Future()
        done.set_running_or_notify_cancel()
        event_id = next(self._ids)
        self._waiting[event_id] = (request, done)
        self._carry_out(self.leases.handle(ls.RemoveTable(event_id, table.table_id)))
        self._flush()
        done.result(timeout=0)  # raises the write's error, if any
        # 2. snapshot handles, then the table's own nodes
        handles = [h for tb in self.snapshots.table_buckets(table.table_id) for h in self.snapshots.bucket_snapshots(tb)]
        for start in range(0, len(handles), MAX_OPS_PER_MULTI):
            self.writer.commit([ZkOp("delete", zkpaths.snapshot(h.bucket.table_id, h.bucket.bucket, h.snapshot_id))
                                for h in handles[start:start + MAX_OPS_PER_MULTI]])
        leaders = self.assignments.leaders_of(table.table_id)
        assignment_op = [self.assignments.delete_op(table.table_id)] if table.table_id in self.assignments.by_table else []
        self.writer.commit(assignment_op + self.catalog.drop_ops(table))
        self.catalog.remove(table)
        self.assignments.remove(table.table_id)
        self._push_leadership(leaders, dropped=[table.table_id])
        _handles, files = self.snapshots.remove_table(table.table_id)
        # 3. its files: whatever the handles named, and anything else under kv/{table_id}/
        self._file_pool.submit(_delete_table_files, self.storage, table.table_id, files)
        log.info("dropped table %s (id %d)", table.path, table.table_id)
        return None

    # -- tablet servers and bucket leaders -----------------------------------------------

    def _read_servers(self) -> dict[int, tuple[str, str]]:
        """Live servers: id -> (address, incarnation); a restarted server has a new incarnation."""
        try:
            ids = self.zk.get_children(zkpaths.TABLET_SERVERS)
        except NoNodeError:
            return {}
        servers = {}
        for name, result in [(n, self.zk.get_async(zkpaths.tablet_server(n))) for n in ids if n.isdigit()]:
            try:
                node = loads(result.get()[0])
            except NoNodeError:
                continue
            servers[int(name)] = (node["address"], str(node.get("incarnation", "")))
        return servers

    def _servers_changed(self, servers: dict[int, str | tuple[str, str]]) -> None:
        seen = {sid: v if isinstance(v, tuple) else (v, "") for sid, v in servers.items()}
        joined = {sid for sid, v in seen.items() if self._incarnations.get(sid) != v}
        left = set(self.servers) - set(seen)
        self._incarnations = seen
        self.servers = {sid: v[0] for sid, v in seen.items()}
        if left:
            log.warning("tablet servers gone: %s (their buckets are unavailable until they return)", sorted(left))
        changes = self.assignments.plan_servers_joined(joined, sorted(servers))
        if changes:
            self.writer.commit([self.assignments.set_op(t, plan) for t, plan in sorted(changes.items())])
            for table_id, plan in changes.items():
                self.assignments.set(table_id, plan)
        touched = set(joined)
        for plan in changes.values():
            touched |= {a.leader for a in plan.values() if a.leader != UNASSIGNED}
        self._push_leadership(touched)

    def push_all(self) -> None:
        """Tell every live tablet server what it leads (after becoming active)."""
        self._push_leadership(set(self.servers))

    def _push_leadership(self, server_ids: Iterable[int], dropped: list[int] | None = None) -> None:
        if self.notify is None:
            return
        for server_id in sorted(server_ids):
            address = self.servers.get(server_id)
            if address is None:
                continue
            led = [(self.catalog.by_id[t], b, a.leader_epoch) for t, b, a in self.assignments.led_by(server_id)
                   if t in self.catalog.by_id]
            self.notify(server_id, address, led, list(dropped or []))

    def assignment_rows(self, table_id: int) -> tuple[object, list[tuple[int, int, str, int]]]:
        table = self.catalog.get_by_id(table_id)
        rows = [(bucket, a.leader, self.servers.get(a.leader, ""), a.leader_epoch)
                for bucket, a in sorted(self.assignments.table(table_id).items())]
        return table, rows

    # -- queries ---------------------------------------------------------------------------

    def _query(self, request):
        if isinstance(request, rq.ListTables):
            return self.catalog.list(request.database)
        if isinstance(request, rq.GetTable):
            if request.database or request.name:
                return self.catalog.get(request.database, request.name)
            return self.catalog.get_by_id(request.table_id)
        if isinstance(request, rq.ListSnapshots):
            return self.snapshot_rows(request.table_id, request.latest_only)
        if isinstance(request, rq.ListLeases):
            return sorted(self.leases.leases.values(), key=lambda lease: lease.lease_id)
        if isinstance(request, rq.DescribeLease):
            lease = self.leases.get(request.lease_id)
            if lease is None:
                raise errors.LeaseNotFoundError(f"lease {request.lease_id!r} not found", lease_id=request.lease_id)
            return lease
        if isinstance(request, rq.GetTableAssignment):
            return self.assignment_rows(request.table_id)
        if isinstance(request, rq.ListTabletServers):
            load = self.assignments.load_per_server()
            return [(sid, address, load[sid]) for sid, address in sorted(self.servers.items())]
        raise errors.InvalidRequestError(f"unknown query {type(request).__name__}")

    # -- metrics ------------------------------------------------------------------------------

    def refresh_metrics(self) -> None:
        if self.metrics is None:
            return
        leases: Iterable[Lease] = self.leases.leases.values()
        per_table: dict[int, int] = {}
        for lease in leases:
            for table_id in lease.tables():
                per_table[table_id] = per_table.get(table_id, 0) + 1
        self.metrics.set_lease_counts(len(self.leases.leases), self.leases.refs.leased_count(), per_table,
                                      dict(self.leases.refs.leased_count_by_table()))


def _chunks(ops: list[ZkOp], max_bytes: int = MAX_BYTES_PER_MULTI) -> list[list[ZkOp]]:
    """``ops`` in order, cut into multi-ops of at most MAX_OPS_PER_MULTI ops and about ``max_bytes``."""
    chunks: list[list[ZkOp]] = []
    size = 0
    for op in ops:
        cost = len(op.path) + len(op.data) + 64
        if not chunks or len(chunks[-1]) >= MAX_OPS_PER_MULTI or size + cost > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(op)
        size += cost
    return chunks


def _resolve(future: Future | None, value) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _fail(future: Future | None, error: Exception) -> None:
    if future is not None and not future.done():
        future.set_exception(error)


def _delete_quietly(storage: RemoteStorage, paths: list[str]) -> None:
    try:
        storage.delete_many(paths)
    except errors.StorageError as exc:
        log.warning("could not delete %d files: %s", len(paths), exc)


def _delete_table_files(storage: RemoteStorage, table_id: int, files: list[str]) -> None:
    try:
        leftovers = storage.list(f"kv/{table_id}")
    except errors.StorageError as exc:
        log.warning("could not list files of dropped table %d: %s", table_id, exc)
        leftovers = []
    _delete_quietly(storage, sorted(set(files) | set(leftovers)))
