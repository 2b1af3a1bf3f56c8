"""The tablet server's gRPC service: thin, every answer carries a typed error code.

A request names its buckets by ``table_id`` and, for a partitioned table's, ``partition_id``; buckets are held
by physical id (the partition's, else the table's). Each handler first resolves the physical table its
request names (:meth:`kvlease.tablet.replicas.held_tables.HeldTables.resolve`): one that names a partition
this server does not hold of that table, none of a partitioned table, or one of an unpartitioned table is
answered ``PARTITION_NOT_EXISTS`` (``NOT_LEADER`` if ZooKeeper has that partition: a client routing by
stale metadata retries), ``TABLE_NOT_EXIST`` or ``INVALID_REQUEST`` and changes nothing; a bucket of a
physical table held here that this server does not lead is ``NOT_LEADER`` as ever. Then every call
is authorized before it acts (:mod:`kvlease.tablet.authz`): WRITE on the table for
PutKv and TriggerSnapshot, READ for Lookup, PrefixLookup, FetchLog, ListOffsets and scans;
a denied call is answered ``AUTHORIZATION_FAILED`` and changes nothing.
UpdateLeadership and ReplicaFetch are the cluster's own (:data:`INTERNAL_METHODS`).

Only a bucket's leader serves it (NOT_LEADER otherwise, also for a call whose
bucket's store closed under it: :func:`_serving`). A write to a
replicated bucket is answered once its in-sync replicas hold it (the HW passed
it: ``tablet/replication/leader.py``); reads see committed data only. Every
answer of a leader (a read, a write's acknowledgement) is confirmed after it was
made, against the leadership it began under and the server's leader lease
(:meth:`ReplicaManager.leading`, ``tablet/replication/leader_lease.py``): a leader deposed
meanwhile answers NOT_LEADER, so no answer is older than a write acknowledged
before its request was sent. A FetchLog with ``max_wait_ms`` that finds nothing new waits for the
bucket's committed end to move (``tablet/log/waits.py``), then answers as a plain FetchLog does.
"""

from __future__ import annotations

import contextlib
import logging

import pyarrow as pa

from kvlease.common import errors, lookup_wire
from kvlease.common.logentry import ChangelogError, CorruptLogError
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.common.wire import error_pb, handle_to_pb
from kvlease.common.codec import batch_to_ipc, ipc_to_batch
from kvlease.common.codec_schemas import batch_as_current
from kvlease.common.model import SnapshotHandle
from kvlease.common.security.server import OPEN
from kvlease.tablet.authz import READ, WRITE, TableAccess
from kvlease.tablet.log.waits import LogWaits, wait_seconds
from kvlease.tablet.replicas.held_tables import partition_of
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.tablet.replication.fetch_service import ReplicaFetchService
from kvlease.tablet.replication.leader import check_epoch
from kvlease.tablet.replication.leader_lease import LeaseBasis
from kvlease.tablet.replication.roles import PushedRoles
from kvlease.tablet.scan.service import ScanService
from kvlease.tablet.store.kvstore import BucketStoreError

log = logging.getLogger(__name__)

#: Methods only the cluster's own principal may call (the coordinator telling this server what it holds,
#: followers fetching from their leader).
INTERNAL_METHODS = ("/kvlease.TabletService/UpdateLeadership", "/kvlease.TabletService/ReplicaFetch")

#: What a write waits for its commit at most when its call has no deadline.
COMMIT_WAIT_S = 60.0


def _answer(response_cls, work):
    try:
        result = work()
        return result if isinstance(result, (response_cls, bytes)) else response_cls(**result)  # bytes: serialized
    except errors.KvLeaseError as exc:
        return response_cls(error=error_pb(exc))
    except Exception as exc:  # a bug: answer it, keep serving
        log.exception("%s failed", response_cls.__name__)
        return response_cls(error=error_pb(errors.UnknownServerError(f"internal error: {exc}")))


@contextlib.contextmanager
def _serving(replica):
    """NOT_LEADER (the client retries where the bucket is led now) for a request whose store was closed under
    it: its replica stopped being held here, or was opened again in another mode (tablet/replicas/manager.py).
    LEADER_NOT_AVAILABLE (retried too) for one a replicated bucket's local files failed (a full disk, EIO):
    its leadership goes to another in-sync replica (tablet/replicas/step_down.py), where the retry lands."""
    try:
        yield
    except (BucketStoreError, ChangelogError) as exc:
        if replica.closed:
            raise errors.NotLeaderError(f"{replica.where} was closed on this tablet server while the request ran; "
                                        "retry it", **replica.details) from None
        if isinstance(exc, CorruptLogError) or not replica.replicated or replica.store.files.failure is None:
            raise
        raise errors.LeaderNotAvailableError(
            f"{replica.where}: its leader cannot use its local files ({exc.message}); it gives its leadership to "
            f"another in-sync replica: retry", **replica.details) from None


def _batch(data: bytes) -> pa.RecordBatch | None:
    if not data:
        return None
    try:
        return ipc_to_batch(data)
    except (pa.ArrowInvalid, OSError, ValueError) as exc:
        raise errors.InvalidRowError(f"the request's rows are not a valid Arrow IPC stream: {exc}") from None


class TabletService(pb_grpc.TabletServiceServicer):
    def __init__(self, replicas: ReplicaManager, scans: ScanService | None = None, security=OPEN,
                 fetches: ReplicaFetchService | None = None, log_waits: LogWaits | None = None) -> None:
        self.replicas = replicas
        self.fetches = fetches if fetches is not None else ReplicaFetchService(replicas)
        self.log_waits = log_waits if log_waits is not None else LogWaits()  # FetchLog long polls
        self.security = security  # common.security.server: OPEN or ServerSecurity
        self.access = TableAccess(replicas, security)
        self.scans = scans if scans is not None else ScanService(replicas, replicas.config, security=security)
        self.pushed = PushedRoles(replicas.server_id)  # a push's buckets parsed, the unchanged ones reused
        self.lookup_port = 0  # named in every Lookup answer (tablet/lookup_port.py); 0: none

    def _physical(self, request) -> int:
        """The physical table ``request`` names by ``table_id`` and ``partition_id`` (see the module docstring)."""
        return self.replicas.tables.resolve(request.table_id, partition_of(request))

    def UpdateLeadership(self, request, context):
        def work():
            me = self.replicas.server_id
            if request.dir_id and self.replicas.dir_id and request.dir_id != self.replicas.dir_id:
                raise errors.InvalidRequestError(
                    f"push for tablet server {me} with data dir {request.dir_id}, but this server's data dir is "
                    f"{self.replicas.dir_id} (a new one: the coordinator has not seen it yet); refused")
            held = self.pushed.parse(request.buckets)  # an unchanged bucket is the role taken before
            basis = LeaseBasis(request.session_id, request.demotions) if request.HasField("session_id") else None
            self.replicas.update_leadership(request.coordinator_epoch, held, list(request.dropped_tables), basis)
            return {}
        return _answer(pb.UpdateLeadershipResponse, work)

    def PutKv(self, request, context):
        def work():
            physical = self._physical(request)
            self.access.check(WRITE, physical)
            upserts, deletes, retracts = _batch(request.upserts), _batch(request.deletes), _batch(request.retracts)
            if upserts is None and deletes is None and retracts is None:
                raise errors.InvalidRequestError("PutKv needs rows to upsert or retract or keys to delete")
            if request.writer_id < 0:
                raise errors.InvalidRequestError(f"writer_id must be > 0 (0: not idempotent), got {request.writer_id}")
            writer = (request.writer_id, request.sequence) if request.writer_id else None
            epoch = request.leader_epoch if request.HasField("leader_epoch") else None
            with self.replicas.leading(physical, request.bucket) as replica:  # acknowledged while leased
                lead = replica.leadership()
                if lead is None:
                    check_epoch(replica.leader_epoch, epoch, replica.where)
                else:
                    lead.check_write(epoch)
                with _serving(replica):
                    if request.schema_id:  # the columns of the writer's schema
                        upserts, retracts = (None if b is None else batch_as_current(b, request.schema_id, replica.table)
                                             for b in (upserts, retracts))
                    base, next_ = replica.store.write(upserts, deletes, writer=writer, retracts=retracts,
                                                      partial=request.partial)
                if lead is None:
                    self.log_waits.notify()  # published: FetchLog long polls look again
                else:
                    lead.appended()
                    self.fetches.notify()
                    remaining = context.time_remaining() if context is not None else None
                    lead.wait_committed(next_, COMMIT_WAIT_S if remaining is None else max(0.0, remaining - 0.5))
            return {"base_offset": base, "next_offset": next_}
        return _answer(pb.PutKvResponse, work)

    def Lookup(self, request, context):
        def work():
            physical = self._physical(request)
            self.access.check(READ, physical)
            if request.key_offsets:  # encoded keys: answered with stored values, decoded by the client (issue 44)
                keys = lookup_wire.unpack_list(request.key_data, request.key_offsets, "LookupRequest.key_data")
                with self.replicas.leading(physical, request.bucket) as replica, _serving(replica):
                    found, values, schema_id = replica.store.lookup_values(keys)
                data, offsets = lookup_wire.pack_list(values)
                return pb.LookupResponse(values=data, value_offsets=offsets, schema_id=schema_id,
                                         found_mask=lookup_wire.pack_mask(found))
            keys = _batch(request.keys)
            with self.replicas.leading(physical, request.bucket) as replica, _serving(replica):
                if keys is None:
                    return {}
                found, rows = replica.store.lookup(keys)
            return {"rows": batch_to_ipc(rows), "found": found.tolist()}
        response = _answer(pb.LookupResponse, work)
        response.lookup_port = self.lookup_port  # every answer: how clients learn it (tablet/lookup_port.py)
        return response

    def PrefixLookup(self, request, context):
        def work():
            physical = self._physical(request)
            self.access.check(READ, physical)
            prefixes = _batch(request.prefixes)
            with self.replicas.leading(physical, request.bucket) as replica, _serving(replica):
                if prefixes is None:
                    return {}
                found = replica.store.prefix_lookup(prefixes, request.start_after_key, request.max_bytes)
            return {"rows": batch_to_ipc(found.rows), "counts": found.counts, "resume_key": found.resume_key,
                    "log_offset": found.log_offset}
        return _answer(pb.PrefixLookupResponse, work)

    def FetchLog(self, request, context):
        def work():
            physical = self._physical(request)
            self.access.check(READ, physical)
            if request.max_bytes <= 0:
                raise errors.InvalidRequestError("max_bytes must be positive")
            if request.max_wait_ms < 0:
                raise errors.InvalidRequestError(f"max_wait_ms must be >= 0, got {request.max_wait_ms}")
            epoch = request.last_fetched_epoch if request.HasField("last_fetched_epoch") else None
            remaining = context.time_remaining() if context is not None else None
            return self.log_waits.poll(lambda: self._fetch_log(physical, request, epoch), lambda a: bool(a["entries"]),
                                       wait_seconds(request.max_wait_ms, remaining))  # tablet/log/waits.py
        return _answer(pb.FetchLogResponse, work)

    def _fetch_log(self, physical: int, request, epoch: int | None) -> dict:
        """One plain FetchLog read (a long poll repeats it, each under its own leadership check)."""
        with self.replicas.leading(physical, request.bucket) as replica, _serving(replica):
            try:
                entries, end = replica.store.fetch_log(request.from_offset, request.max_bytes,
                                                       last_fetched_epoch=epoch)
                start, _latest = replica.store.list_offsets()
            except errors.DataLostError as exc:  # name the table: the message is all that travels
                raise errors.DataLostError(f"bucket {replica.bucket} of {replica.table.where}: {exc.message}",
                                           table=replica.table.path, **exc.details) from None
        return {"entries": entries, "log_start_offset": start, "log_end_offset": end}

    def ReplicaFetch(self, request, context):
        remaining = context.time_remaining() if context is not None else None
        return _answer(pb.ReplicaFetchResponse, lambda: self.fetches.fetch(request, remaining))

    def ListOffsets(self, request, context):
        def work():
            physical, partition_id = self._physical(request), partition_of(request)
            self.access.check(READ, physical)
            timestamp = request.timestamp if request.HasField("timestamp") else None
            if timestamp is not None and timestamp < 0:
                raise errors.InvalidRequestError(f"timestamp must be ms since the epoch (>= 0), got {timestamp}")
            wanted: dict[int, list[int]] = {}
            for at in request.epochs_at:
                wanted.setdefault(at.bucket, []).append(at.offset)
            offsets = []
            for bucket in request.buckets:
                try:
                    with self.replicas.leading(physical, bucket) as replica, _serving(replica):
                        store = replica.store  # (_serving: its store may close under the call)
                        found = None if timestamp is None else store.offset_for_timestamp(timestamp)
                        earliest, latest, end_epoch = store.end_epoch()
                        at = wanted.get(bucket, [])
                        epochs = list(zip(at, store.epochs_at(at)))
                    if found is not None:  # retention may have moved the start since the search
                        found = max(found, earliest)
                    offsets.append(pb.BucketOffsetsPb(
                        bucket=bucket, partition_id=partition_id, earliest=earliest, latest=latest,
                        timestamp_offset=found, end_epoch=end_epoch,
                        epochs_at=[pb.OffsetEpochPb(offset=o, epoch=e) for o, e in epochs]))
                except errors.KvLeaseError as exc:
                    offsets.append(pb.BucketOffsetsPb(bucket=bucket, partition_id=partition_id, error=error_pb(exc)))
            return {"offsets": offsets}
        return _answer(pb.ListOffsetsResponse, work)

    def TriggerSnapshot(self, request, context):
        def work():
            physical, partition_id = self._physical(request), partition_of(request)
            self.access.check(WRITE, physical)
            self.replicas.check_table(physical)
            buckets = list(request.buckets) or [r.bucket for r in self.replicas.replicas(physical)]
            results: dict[int, object] = {}
            targets = []
            for bucket in buckets:
                try:
                    targets.append(self.replicas.get(physical, bucket))
                except errors.KvLeaseError as exc:
                    results[bucket] = exc
            taken = self.replicas.snapshots.snapshot_each(targets, verify=True)
            results.update(zip((r.bucket for r in targets), taken))
            failed = sorted((b, r) for b, r in results.items() if isinstance(r, errors.KvLeaseError))
            if failed and not request.bucket_errors:
                raise failed[0][1]
            answer = {"failed": [pb.BucketErrorPb(bucket=b, partition_id=partition_id, error=error_pb(e))
                                 for b, e in failed]}
            if request.wait:
                # a bucket unchanged since its latest snapshot (the periodic one may have just taken it) is done
                led = {r.bucket: r for r in targets}
                answer["snapshots"] = [handle_to_pb(h) for b, h in sorted(results.items())
                                       if isinstance(h, SnapshotHandle)]
                answer["unchanged"] = [handle_to_pb(led[b].uploader.base) for b, h in sorted(results.items())
                                       if h is None and led[b].uploader.base is not None]
            return answer
        return _answer(pb.TriggerSnapshotResponse, work)

    # -- live KV scans (tablet/scan/service.py) ------------------------------------------------

    def ScanKv(self, request, context):
        return _answer(pb.ScanKvResponse, lambda: self.scans.scan(request))

    def ScanKvStream(self, request, context):
        return self.scans.stream(request, context)  # errors travel as the stream's last response
