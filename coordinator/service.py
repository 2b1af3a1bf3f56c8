"""The coordinator's gRPC service: turns requests into loop events, results into responses.

Thin by design: no state here. Lease requests become the lease state
machine's own events (:mod:`kvlease.leases.state`; the lease shell stamps their time),
the others :mod:`kvlease.coordinator.requests`. A standby answers every request with
``NOT_COORDINATOR`` carrying the active coordinator's address. A bucket is
named by table id and partition id (unset: an unpartitioned table's); the
cluster's own servers' requests name the buckets they were told of, and are
mapped to physical ids here (common/tables.py); the others are resolved on
the loop (``PARTITION_NOT_EXISTS`` for a partition that is not there).
``AcquireKvSnapshotLeases`` (a client's concurrent acquires in one call) hands
every acquire to the loop at once and answers each as its unary call would.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Iterable

from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.proto import coordinator_pb2_grpc as pb_grpc
from kvlease.common.wire import (bucket_from_pb, bucket_snapshots_from_pb, error_pb, handle_from_pb, lease_to_pb,
                                 partition_id_of, physical_id, table_spec_from_pb, table_to_pb)
from kvlease.common.security.acl import Operation, Resource
from kvlease.common.security.server import OPEN
from kvlease.coordinator import partition_service
from kvlease.coordinator import requests as rq
from kvlease.coordinator import schema_service
from kvlease.coordinator.reassignment_plan import move_state
from kvlease.coordinator.snapshot_checks import check_manifest
from kvlease.coordinator.snapshot_wire import AcquireAnswers, SnapshotRowEncoder
from kvlease.leases import state as ls

log = logging.getLogger(__name__)

#: Acquires one AcquireKvSnapshotLeases may carry (a client sends at most 64).
MAX_ACQUIRES_PER_CALL = 1024

#: Methods only the cluster's own principal may call (a tablet server committing a snapshot, a leader changing
#: its bucket's ISR, a stopping tablet server moving its leaderships away, a leader that cannot write giving
#: one up).
INTERNAL_METHODS = ("/kvlease.CoordinatorService/CommitKvSnapshot", "/kvlease.CoordinatorService/AlterIsr",
                    "/kvlease.CoordinatorService/ControlledShutdown", "/kvlease.CoordinatorService/ReportReplicaLoss",
                    "/kvlease.CoordinatorService/ReportLogEnds", "/kvlease.CoordinatorService/ConfirmRestore",
                    "/kvlease.CoordinatorService/ResignLeadership")


class CoordinatorService(pb_grpc.CoordinatorServiceServicer):
    def __init__(self, server, timeout_s: float = 30.0, security=OPEN) -> None:
        self.security = security  # common.security.server: OPEN or ServerSecurity
        self.server = server  # coordinator.server.CoordinatorServer
        self.timeout_s = timeout_s
        self.snapshot_rows = SnapshotRowEncoder()  # listings' rows, encoded once per stored handle
        self.acquire_answers = AcquireAnswers()  # acquired entries, encoded once per (bucket, snapshot)

    def _run(self, request, response_cls, build, check=None):
        """Submit ``request`` to the loop; ``build(result)`` gives the response's fields (or the response).

        ``check()``: run in this (the gRPC handler's) thread once this coordinator is
        known to serve, before the request enters the loop (remote reads, never on the loop).
        """
        return self._answer(self._submit(request, check), response_cls, build, time.monotonic() + self.timeout_s)

    def _submit(self, request, check=None) -> Future | Exception:
        """``request`` handed to the loop (its future), or the error that kept it out."""
        try:
            loop = self.server.serving_loop()
            if check is not None:
                check()
            return loop.submit(request)
        except Exception as exc:
            return exc

    def _answer(self, submitted: Future | Exception, response_cls, build, deadline: float):
        """The response to what :meth:`_submit` gave, waiting for the loop until ``deadline`` (monotonic)."""
        try:
            if isinstance(submitted, Exception):
                raise submitted
            result = submitted.result(timeout=max(0.0, deadline - time.monotonic()))
            built = build(result)
            return built if isinstance(built, response_cls) else response_cls(**built)
        except errors.KvLeaseError as exc:
            return response_cls(error=error_pb(exc))
        except FutureTimeout:
            stuck = self.server.zookeeper_problem()  # e.g. its loop waits for a ZooKeeper write
            why = f" (coordinator {self.server.address} cannot reach ZooKeeper)" if stuck else ""
            return response_cls(error=error_pb(errors.OutcomeUnknownError(
                f"the coordinator did not answer within {self.timeout_s:.0f}s{why}; it may or may not have been "
                "applied")))
        except Exception as exc:  # a bug: answer it, do not kill the call
            log.exception("request answered by %s failed", response_cls.__name__)
            return response_cls(error=error_pb(errors.UnknownServerError(f"internal error: {exc}")))

    # -- authorization (docs/architecture.md, "Security"; every check passes when security is off) ------------

    def _check(self, operation: Operation, resource: Callable[[], Resource]) -> Callable[[], None] | None:
        """A ``check`` for :meth:`_run`: the caller may do ``operation`` on ``resource()``."""
        if not self.security.enabled:
            return None
        return lambda: self.security.check(operation, resource())

    def _guarded(self, request, operation: Operation, table_ids: Iterable[int] = (), lease_id: str | None = None):
        """``request`` guarded on the loop: the caller may do ``operation`` on each of ``table_ids`` and on every
        table the lease ``lease_id`` holds at that moment. An unknown table id is left to the request's own
        handler (TABLE_NOT_EXIST); an unknown lease holds no table."""
        if not self.security.enabled:
            return request
        security, principal, ids = self.security, self.security.principal(), frozenset(table_ids)

        def guard(controller) -> None:
            lease = controller.leases.live(lease_id, controller.clock_ms()) if lease_id is not None else None
            for table_id in sorted(ids | (lease.tables() if lease is not None else set())):
                table = controller.catalog.by_id.get(table_id)
                if table is None:
                    continue
                resource = Resource.table(table.path)
                if security.allowed(operation, resource, principal):
                    continue
                if table_id not in ids and not security.allowed(Operation.DESCRIBE, resource, principal):
                    # a table only the lease names, which the caller may not even see: do not name it
                    raise errors.AuthorizationFailedError(
                        f"{principal} may not {operation.value} every table lease {lease_id} holds",
                        principal=principal, operation=operation.value, resource=f"lease {lease_id}")
                security.check(operation, resource, principal)  # refused: the error names the table
        return rq.Guarded(request, guard)

    def CoordinatorInfo(self, request, context):
        return pb.CoordinatorInfoResponse(**self.server.info())

    def CreateTable(self, request, context):
        try:
            spec = table_spec_from_pb(request)
        except errors.KvLeaseError as exc:  # a bad time unit or zone: refused like any bad definition
            return pb.CreateTableResponse(error=error_pb(exc))
        create = rq.CreateTable(spec, request.ignore_if_exists,
                                request.replication_factor if request.HasField("replication_factor") else None,
                                request.min_insync_replicas if request.HasField("min_insync_replicas") else None)
        return self._run(create, pb.CreateTableResponse,
                         lambda t: {"table": table_to_pb(t)},
                         check=self._check(Operation.CREATE, lambda: Resource.database(request.database)))

    def DropTable(self, request, context):
        return self._run(rq.DropTable(request.database, request.name, request.ignore_if_not_exists),
                         pb.DropTableResponse, lambda _r: {},
                         check=self._check(Operation.DROP,
                                           lambda: Resource.table(f"{request.database}.{request.name}")))

    def ListTables(self, request, context):
        visible = self.security.allowed  # the tables the caller may DESCRIBE (all when security is off)
        return self._run(rq.ListTables(request.database), pb.ListTablesResponse,
                         lambda ts: {"tables": [table_to_pb(t) for t in ts
                                                if visible(Operation.DESCRIBE, Resource.table(t.path))]})

    def GetTable(self, request, context):
        get = rq.GetTable(request.database, request.name, request.table_id)
        if request.database or request.name:
            return self._run(get, pb.GetTableResponse, lambda t: {"table": table_to_pb(t)},
                             check=self._check(Operation.DESCRIBE,
                                               lambda: Resource.table(f"{request.database}.{request.name}")))
        return self._run(self._guarded(get, Operation.DESCRIBE, [request.table_id]), pb.GetTableResponse,
                         lambda t: {"table": table_to_pb(t)})

    def CommitKvSnapshot(self, request, context):
        handle = handle_from_pb(request.snapshot)
        def check():
            check_manifest(self.server.storage, handle)
            loop = self.server.serving_loop()
            ask = rq.GetTableAssignment(handle.bucket.table_id, handle.bucket.partition_id)
            _table, rows = loop.submit(ask).result(timeout=self.timeout_s)
            leader = next((address for _view, bucket, _state, address in rows if bucket == handle.bucket.bucket), "")
            if leader:  # over the channel the active term keeps for this leader (closed at step-down)
                loop.controller.log_ends.check(handle, leader, self.timeout_s)

        epoch = request.leader_epoch if request.HasField("leader_epoch") else None  # absent: an older tablet server
        server_id = request.server_id if request.HasField("server_id") else None
        return self._run(rq.CommitSnapshot(handle, epoch, server_id), pb.CommitKvSnapshotResponse, lambda _r: {},
                         check=check)

    def _snapshots(self, request, response_cls, latest_only):
        listing = rq.ListSnapshots(request.table_id, latest_only, partition_id_of(request))
        return self._run(self._guarded(listing, Operation.READ,
                                         [request.table_id]), response_cls,
                         lambda rows: self.snapshot_rows.response(response_cls, request.table_id, rows))

    def GetLatestKvSnapshots(self, request, context):
        return self._snapshots(request, pb.GetLatestKvSnapshotsResponse, True)

    def ListKvSnapshots(self, request, context):
        return self._snapshots(request, pb.ListKvSnapshotsResponse, False)

    def AcquireKvSnapshotLease(self, request, context):
        answer = self.acquire_answers.response
        return self._answer(self._submit_acquire(request), pb.AcquireKvSnapshotLeaseResponse,
                            lambda outcome: answer(request, outcome), time.monotonic() + self.timeout_s)

    def AcquireKvSnapshotLeases(self, request, context):
        """Each acquire of the batch handled as if it came alone, all in the loop at once."""
        try:
            self.server.serving_loop()
            if len(request.requests) > MAX_ACQUIRES_PER_CALL:
                raise errors.InvalidRequestError(f"{len(request.requests)} acquires in one call; at most "
                                                 f"{MAX_ACQUIRES_PER_CALL}")
        except errors.KvLeaseError as exc:  # none handled (a standby: the client moves on to the active one)
            return pb.AcquireKvSnapshotLeasesResponse(error=error_pb(exc))
        deadline = time.monotonic() + self.timeout_s
        submitted, answer = [self._submit_acquire(r) for r in request.requests], self.acquire_answers.response
        return pb.AcquireKvSnapshotLeasesResponse(responses=[
            self._answer(s, pb.AcquireKvSnapshotLeaseResponse, lambda outcome, r=r: answer(r, outcome), deadline)
            for r, s in zip(request.requests, submitted)])

    def _submit_acquire(self, request) -> Future | Exception:
        if request.HasField("latest"):  # lease acquire --latest: the coordinator chooses the snapshots
            if request.snapshots:
                return errors.InvalidRequestError("an acquire names either its snapshots or latest, not both")
            latest = request.latest
            acquire = rq.AcquireLatest(request.lease_id, latest.table_id,
                                       latest.partition_id if latest.HasField("partition_id") else None,
                                       request.duration_ms, owner=request.owner or None)
            return self._submit(self._guarded(acquire, Operation.READ, {latest.table_id}, request.lease_id))
        snapshots = bucket_snapshots_from_pb(request.snapshots)
        if len(snapshots) != len(request.snapshots):
            return errors.InvalidRequestError("a bucket appears twice in the acquire request")
        return self._submit(self._guarded(ls.Acquire(request.lease_id, snapshots, request.duration_ms,
                                                     owner=request.owner or None),
                                          Operation.READ, {tb.table_id for tb in snapshots}, request.lease_id))

    def RenewKvSnapshotLease(self, request, context):
        renew = ls.Renew(request.lease_id, request.duration_ms, owner=request.owner or None)
        return self._run(self._guarded(renew, Operation.READ, lease_id=request.lease_id),
                         pb.RenewKvSnapshotLeaseResponse,
                         lambda expiration: {"expiration_time_ms": expiration})

    def ReleaseKvSnapshotLease(self, request, context):
        buckets = frozenset(bucket_from_pb(b) for b in request.buckets)
        release = ls.Release(request.lease_id, buckets, owner=request.owner or None)
        return self._run(self._guarded(release, Operation.READ, {tb.table_id for tb in buckets}),
                         pb.ReleaseKvSnapshotLeaseResponse,
                         lambda outcome: {"released": outcome.released, "lease_remains": outcome.lease_remains})

    def DropKvSnapshotLease(self, request, context):
        drop = ls.Drop(request.lease_id, owner=request.owner or None)
        return self._run(self._guarded(drop, Operation.READ, lease_id=request.lease_id),
                         pb.DropKvSnapshotLeaseResponse,
                         lambda dropped: {"dropped": dropped})

    def ListKvSnapshotLeases(self, request, context):
        if not self.security.enabled:
            return self._run(rq.ListLeases(), pb.ListKvSnapshotLeasesResponse,
                             lambda leases: {"leases": [lease_to_pb(lease) for lease in leases]})
        paths: dict[int, str] = {}  # table id -> path, read on the loop just before the leases

        def readable(lease) -> bool:  # the caller may READ every table the lease holds
            return all(table_id in paths and self.security.allowed(Operation.READ, Resource.table(paths[table_id]))
                       for table_id in lease.tables())
        return self._run(rq.Guarded(rq.ListLeases(), lambda controller: paths.update(
                             (table_id, table.path) for table_id, table in controller.catalog.by_id.items())),
                         pb.ListKvSnapshotLeasesResponse,
                         lambda leases: {"leases": [lease_to_pb(lease) for lease in leases if readable(lease)]})

    def GetTableAssignment(self, request, context):
        def build(result):
            table, rows = result
            return {"table": table_to_pb(table),
                    "buckets": [assignment_pb(b, a, address, view.partition_id) for view, b, a, address in rows]}
        ask = rq.GetTableAssignment(request.table_id, partition_id_of(request))
        return self._run(self._guarded(ask, Operation.DESCRIBE,
                                         [request.table_id]), pb.GetTableAssignmentResponse, build)

    def ListTabletServers(self, request, context):
        def build(result):
            rows, offline, under, decommissioned = result
            def refs(buckets):
                return [pb.BucketRefPb(table_id=t.table_id, table=t.path, bucket=b, offline_reason=why,
                                       **_partition_fields(t)) for t, b, why in buckets]
            return {"servers": [pb.TabletServerPb(id=i, address=a, buckets=led, replicas=held, decommissioned=retired)
                                for i, a, led, held, retired in rows],
                    "offline": refs(offline), "under_replicated": refs(under), "decommissioned": decommissioned}
        return self._run(rq.ListTabletServers(), pb.ListTabletServersResponse, build)

    def AlterIsr(self, request, context):
        """A leader's ISR change; refused (FENCED_LEADER_EPOCH) with the bucket's current state in the response."""
        alter = rq.AlterIsr(request.server_id, physical_id(request), request.bucket, request.leader_epoch,
                            request.bucket_epoch, tuple(request.isr))
        submitted = self._submit(alter)
        response = self._answer(submitted, pb.AlterIsrResponse,
                                lambda a: {"isr": list(a.isr), "leader": a.leader, "leader_epoch": a.leader_epoch,
                                           "bucket_epoch": a.bucket_epoch}, time.monotonic() + self.timeout_s)
        refused = submitted.exception(timeout=0) if isinstance(submitted, Future) and submitted.done() else None
        if isinstance(refused, errors.FencedLeaderEpochError):  # its details: the bucket's current state
            d = refused.details
            response.isr[:] = d["isr"]
            response.leader, response.leader_epoch, response.bucket_epoch = (
                d["leader"], d["leader_epoch"], d["bucket_epoch"])
        return response

    def ControlledShutdown(self, request, context):
        return self._run(rq.ControlledShutdown(request.server_id), pb.ControlledShutdownResponse,
                         lambda remaining: {"remaining_leaders": remaining})

    def ResignLeadership(self, request, context):
        """A leader that cannot write gives buckets up (tablet/replicas/step_down.py): one answer per bucket, in order."""
        resign = rq.ResignLeadership(request.server_id, tuple((physical_id(b), b.bucket, b.leader_epoch, b.reason)
                                                              for b in request.buckets))

        def answer(asked, outcome) -> pb.ResignedBucketPb:
            if isinstance(outcome, errors.KvLeaseError):
                return pb.ResignedBucketPb(error=error_pb(outcome))
            return pb.ResignedBucketPb(bucket=assignment_pb(asked.bucket, outcome.state, "", partition_id_of(asked)),
                                       refused=outcome.refused)
        return self._run(resign, pb.ResignLeadershipResponse,
                         lambda outcomes: {"buckets": [answer(*pair) for pair in zip(request.buckets, outcomes)]})

    # -- moving replicas (issue 31): admin operations, ALTER on the cluster ---------------------------

    def ReassignBucket(self, request, context):
        reassign = rq.ReassignBucket(request.database, request.name, request.bucket, tuple(request.replicas),
                                     request.partition, partition_id_of(request))
        return self._run(reassign, pb.ReassignBucketResponse, lambda row: {"move": _move_pb(*row)},
                         check=self._check(Operation.ALTER, Resource.cluster))

    def DecommissionTablet(self, request, context):
        return self._run(rq.DecommissionTablet(request.tablet_id), pb.DecommissionTabletResponse,
                         lambda rows: {"moves": [_move_pb(*row) for row in rows]},
                         check=self._check(Operation.ALTER, Resource.cluster))

    def RecommissionTablet(self, request, context):
        return self._run(rq.RecommissionTablet(request.tablet_id), pb.RecommissionTabletResponse,
                         lambda was: {"was_decommissioned": was},
                         check=self._check(Operation.ALTER, Resource.cluster))

    def Rebalance(self, request, context):
        def build(result):
            moves, leaders = result
            return {"moves": [_move_pb(*row) for row in moves],
                    "leaders": [pb.LeaderMovePb(table_id=t.table_id, table=t.path, bucket=b, old_leader=old,
                                                new_leader=a.leader, leader_epoch=a.leader_epoch, **_partition_fields(t))
                                for (t, b, a), old in leaders]}
        return self._run(rq.Rebalance(request.leaders_only), pb.RebalanceResponse, build,
                         check=self._check(Operation.ALTER, Resource.cluster))

    def ListReassignments(self, request, context):
        return self._run(rq.ListReassignments(), pb.ListReassignmentsResponse,
                         lambda rows: {"moves": [_move_pb(*row) for row in rows]},
                         check=self._check(Operation.DESCRIBE, Resource.cluster))

    # -- data loss (coordinator/data_loss_plan.py) ----------------------------------------------------

    def ReportReplicaLoss(self, request, context):
        return self._run(rq.ReportReplicaLoss(request.server_id, physical_id(request), request.bucket, request.reason),
                         pb.ReportReplicaLossResponse, lambda _a: {})

    def ReportLogEnds(self, request, context):
        ends = tuple((physical_id(e), e.bucket, e.leader_epoch, e.log_end) for e in request.buckets)
        return self._run(rq.ReportLogEnds(request.server_id, ends, request.takeover), pb.ReportLogEndsResponse,
                         lambda _r: {})

    def ConfirmRestore(self, request, context):
        return self._run(rq.ConfirmRestore(request.server_id, physical_id(request), request.bucket,
                                           request.leader_epoch),
                         pb.ConfirmRestoreResponse, lambda _a: {})

    def RestoreBucket(self, request, context):
        restore = rq.RestoreBucket(request.table_id, request.bucket, request.accept_data_loss,
                                   request.tablet if request.HasField("tablet") else None, partition_id_of(request))
        return self._run(self._guarded(restore, Operation.ALTER, [request.table_id]), pb.RestoreBucketResponse,
                         lambda r: {"loss": r[0].to_pb(pb.DataLossPb),
                                    "bucket": assignment_pb(request.bucket, r[1], "", partition_id_of(request))})

    def ElectLeader(self, request, context):
        elect = rq.ElectLeader(request.table_id, request.bucket, request.unclean,
                               request.tablet if request.HasField("tablet") else None, partition_id_of(request))
        def build(result):
            loss, state = result
            answer = {"bucket": assignment_pb(request.bucket, state, "", partition_id_of(request))}
            if loss is not None:
                answer["loss"] = loss.to_pb(pb.DataLossPb)
            return answer
        return self._run(self._guarded(elect, Operation.ALTER, [request.table_id]), pb.ElectLeaderResponse, build)

    # -- partitions (coordinator/partition_service.py) ---------------------------------------------

    def CreatePartition(self, request, context):
        return partition_service.create_partition(self, request)

    def DropPartition(self, request, context):
        return partition_service.drop_partition(self, request)

    def ListPartitions(self, request, context):
        return partition_service.list_partitions(self, request)

    def AlterTable(self, request, context):  # partitioning settings, or one schema change
        return schema_service.alter_table(self, request)

    def GetSchemaHistory(self, request, context):
        return schema_service.get_schema_history(self, request)

    def DescribeKvSnapshotLease(self, request, context):
        return self._run(self._guarded(rq.DescribeLease(request.lease_id), Operation.READ,
                                       lease_id=request.lease_id),
                         pb.DescribeKvSnapshotLeaseResponse,
                         lambda lease: {"lease": lease_to_pb(lease)})


def assignment_pb(bucket: int, a, address: str = "", partition_id: int | None = None) -> pb.BucketAssignmentPb:
    """One bucket's state as clients see it (``address``: its leader's, "" if not live)."""
    return pb.BucketAssignmentPb(bucket=bucket, partition_id=partition_id, leader_id=a.leader, leader_address=address,
                                 leader_epoch=a.leader_epoch, replicas=list(a.replicas), isr=list(a.isr),
                                 bucket_epoch=a.bucket_epoch, reassigning=a.reassign is not None,
                                 reassign_target=list(a.reassign or ()), offline_reason=a.offline_reason,
                                 losses=[loss.to_pb(pb.DataLossPb) for loss in a.losses], lost=list(a.lost))


def _move_pb(table, bucket: int, state) -> pb.BucketMovePb:
    """A bucket's move as answered (:func:`kvlease.coordinator.reassignment_plan.move_state`)."""
    return pb.BucketMovePb(table_id=table.table_id, table=table.path, bucket=bucket, **move_state(state),
                           **_partition_fields(table))


def _partition_fields(view) -> dict:
    """The partition fields of a message naming a bucket of ``view`` (none for an unpartitioned table's)."""
    return {} if view.partition_id is None else {"partition_id": view.partition_id, "partition": view.partition_name}
