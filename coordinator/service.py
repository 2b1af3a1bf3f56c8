"""The coordinator's gRPC service: turns requests into loop events, results into responses.

Thin by design: no state here. Lease requests become the lease state
machine's own events (:mod:`leases.state`; the lease shell stamps their time),
the others :mod:`coordinator.requests`. A standby answers every request with
``NOT_COORDINATOR`` carrying the active coordinator's address. A request that
sets a ``partition_id`` anywhere is answered ``PARTITION_NOT_EXISTS`` first.
"""

from __future__ import annotations

import logging
from concurrent.futures import TimeoutError as FutureTimeout

from common import errors
from common.proto import coordinator_pb2 as pb
from common.proto import coordinator_pb2_grpc as pb_grpc
from common.wire import (bucket_from_pb, bucket_snapshots_from_pb, bucket_snapshots_to_pb, error_pb, handle_from_pb,
                         handle_to_pb, lease_to_pb, refusing_partition_ids, table_to_pb)
from common.tables import Column, TableSpec
from common.security.server import OPEN
from coordinator import requests as rq
from coordinator.snapshot_checks import check_log_end, check_manifest
from leases import state as ls

log = logging.getLogger(__name__)

#: Methods only the cluster's own principal may call (a tablet server committing a snapshot).
INTERNAL_METHODS = ("/kvlease.CoordinatorService/CommitKvSnapshot",)


@refusing_partition_ids(pb.DESCRIPTOR.services_by_name["CoordinatorService"])
class CoordinatorService(pb_grpc.CoordinatorServiceServicer):
    def __init__(self, server, timeout_s: float = 30.0, tls=None, credentials=None, security=OPEN) -> None:
        self.tls = tls  # common.tls.TlsFiles: how to reach a bucket's leader
        self.credentials = credentials  # the cluster's own, for that call
        self.security = security  # common.security.server: OPEN or ServerSecurity
        self.server = server  # coordinator.server.CoordinatorServer
        self.timeout_s = timeout_s

    def _run(self, request, response_cls, build, check=None):
        """Submit ``request`` to the loop; ``build(result)`` gives the response's fields.

        ``check()``: run in this (the gRPC handler's) thread once this coordinator is
        known to serve, before the request enters the loop (remote reads, never on the loop).
        """
        try:
            loop = self.server.serving_loop()
            if check is not None:
                check()
            result = loop.submit(request).result(timeout=self.timeout_s)
            return response_cls(**build(result))
        except errors.KvLeaseError as exc:
            return response_cls(error=error_pb(exc))
        except FutureTimeout:
            return response_cls(error=error_pb(errors.OutcomeUnknownError(
                f"the coordinator did not answer within {self.timeout_s:.0f}s")))
        except Exception as exc:  # a bug: answer it, do not kill the call
            log.exception("request %s failed", type(request).__name__)
            return response_cls(error=error_pb(errors.UnknownServerError(f"internal error: {exc}")))

    def CoordinatorInfo(self, request, context):
        return pb.CoordinatorInfoResponse(**self.server.info())

    def CreateTable(self, request, context):
        spec = TableSpec(request.database, request.name, tuple(Column(c.name, c.type) for c in request.columns),
                         tuple(request.primary_key), request.buckets)
        return self._run(rq.CreateTable(spec, request.ignore_if_exists), pb.CreateTableResponse,
                         lambda t: {"table": table_to_pb(t)})

    def DropTable(self, request, context):
        return self._run(rq.DropTable(request.database, request.name, request.ignore_if_not_exists),
                         pb.DropTableResponse, lambda _r: {})

    def ListTables(self, request, context):
        return self._run(rq.ListTables(request.database), pb.ListTablesResponse,
                         lambda ts: {"tables": [table_to_pb(t) for t in ts]})

    def GetTable(self, request, context):
        return self._run(rq.GetTable(request.database, request.name, request.table_id), pb.GetTableResponse,
                         lambda t: {"table": table_to_pb(t)})

    def CommitKvSnapshot(self, request, context):
        handle = handle_from_pb(request.snapshot)
        def check():
            check_manifest(self.server.storage, handle)
            _table, rows = self.server.serving_loop().submit(
                rq.GetTableAssignment(handle.bucket.table_id)).result(timeout=self.timeout_s)
            leader = next((address for bucket, _id, address, _epoch in rows if bucket == handle.bucket.bucket), "")
            if leader:
                check_log_end(handle, leader, self.timeout_s, tls=self.tls, credentials=self.credentials)

        return self._run(rq.CommitSnapshot(handle), pb.CommitKvSnapshotResponse, lambda _r: {}, check=check)

    def _snapshots(self, request, response_cls, latest_only):
        return self._run(rq.ListSnapshots(request.table_id, latest_only), response_cls,
                         lambda rows: {"table_id": request.table_id,
                                       "snapshots": [handle_to_pb(h, leased, kept) for h, leased, kept in rows]})

    def GetLatestKvSnapshots(self, request, context):
        return self._snapshots(request, pb.GetLatestKvSnapshotsResponse, True)

    def ListKvSnapshots(self, request, context):
        return self._snapshots(request, pb.ListKvSnapshotsResponse, False)

    def AcquireKvSnapshotLease(self, request, context):
        snapshots = bucket_snapshots_from_pb(request.snapshots)
        if len(snapshots) != len(request.snapshots):
            return pb.AcquireKvSnapshotLeaseResponse(error=error_pb(errors.InvalidRequestError(
                "a bucket appears twice in the acquire request")))
        return self._run(ls.Acquire(request.lease_id, snapshots, request.duration_ms),
                         pb.AcquireKvSnapshotLeaseResponse,
                         lambda o: {"expiration_time_ms": o.expiration_time,
                                    "acquired": bucket_snapshots_to_pb(o.acquired),
                                    "unavailable": bucket_snapshots_to_pb(o.unavailable)})

    def RenewKvSnapshotLease(self, request, context):
        return self._run(ls.Renew(request.lease_id, request.duration_ms), pb.RenewKvSnapshotLeaseResponse,
                         lambda expiration: {"expiration_time_ms": expiration})

    def ReleaseKvSnapshotLease(self, request, context):
        buckets = frozenset(bucket_from_pb(b) for b in request.buckets)
        return self._run(ls.Release(request.lease_id, buckets), pb.ReleaseKvSnapshotLeaseResponse,
                         lambda outcome: {"released": outcome.released, "lease_remains": outcome.lease_remains})

    def DropKvSnapshotLease(self, request, context):
        return self._run(ls.Drop(request.lease_id), pb.DropKvSnapshotLeaseResponse,
                         lambda dropped: {"dropped": dropped})

    def ListKvSnapshotLeases(self, request, context):
        return self._run(rq.ListLeases(), pb.ListKvSnapshotLeasesResponse,
                         lambda leases: {"leases": [lease_to_pb(lease) for lease in leases]})

    def GetTableAssignment(self, request, context):
        def build(result):
            table, rows = result
            return {"table": table_to_pb(table),
                    "buckets": [pb.BucketAssignmentPb(bucket=b, leader_id=leader, leader_address=address,
                                                      leader_epoch=epoch) for b, leader, address, epoch in rows]}
        return self._run(rq.GetTableAssignment(request.table_id), pb.GetTableAssignmentResponse, build)

    def ListTabletServers(self, request, context):
        return self._run(rq.ListTabletServers(), pb.ListTabletServersResponse,
                         lambda rows: {"servers": [pb.TabletServerPb(id=i, address=a, buckets=n) for i, a, n in rows]})

    def DescribeKvSnapshotLease(self, request, context):
        return self._run(rq.DescribeLease(request.lease_id), pb.DescribeKvSnapshotLeaseResponse,
                         lambda lease: {"lease": lease_to_pb(lease)})
