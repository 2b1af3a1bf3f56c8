"""``partition_id``: every request naming a table bucket carries it; an unset one works as before.

The coordinator resolves it against its partitions (tests/coordinator/test_partitions.py): naming one of an
unpartitioned table is refused and changes nothing. A tablet server resolves it against the partitions it holds
(``tablet/replicas/held_tables.py``; partitions it holds: tests/tablet/test_partition_buckets.py): naming one of
an unpartitioned table is refused as INVALID_REQUEST and changes nothing.
"""

from __future__ import annotations

import grpc
import pytest

from kvlease.common import errors
from kvlease.common.codec import RowCodec, batch_to_ipc
from kvlease.common.model import TableBucket
from kvlease.common.proto import coordinator_pb2 as cpb
from kvlease.common.proto import coordinator_pb2_grpc as cpb_grpc
from kvlease.common.proto import tablet_pb2 as tpb
from kvlease.common.wire import table_to_pb
from kvlease.coordinator.server import CoordinatorServer
from kvlease.client.admin import AdminClient
from tests.support.snapshot_manifests import commit_snapshot, snapshot
from tests.tablet.test_tablet_server import SCHEMA, Cluster, lookup, put

#: Every RPC whose request names a table bucket (or a table's buckets), per service.
COORDINATOR_RPCS = {"CommitKvSnapshot", "GetLatestKvSnapshots", "ListKvSnapshots", "AcquireKvSnapshotLease",
                    "AcquireKvSnapshotLeases", "ReleaseKvSnapshotLease", "GetTableAssignment", "AlterIsr",
                    "ReassignBucket", "ResignLeadership", "ReportReplicaLoss", "ReportLogEnds", "ConfirmRestore",
                    "RestoreBucket", "ElectLeader"}
TABLET_RPCS = {"UpdateLeadership", "PutKv", "Lookup", "FetchLog", "ReplicaFetch", "ListOffsets", "TriggerSnapshot", "ScanKv",
               "ScanKvStream", "PrefixLookup"}


def _part(partition):
    return {} if partition is None else {"partition_id": partition}


def _has_partition_field(descriptor, seen=()) -> bool:
    if "partition_id" in descriptor.fields_by_name:
        return True
    return any(f.message_type is not None and f.message_type not in seen
               and _has_partition_field(f.message_type, (*seen, descriptor)) for f in descriptor.fields)


# -- tier 1: the wire check ----------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("module, service, rpcs", [(cpb, "CoordinatorService", COORDINATOR_RPCS),
                                                   (tpb, "TabletService", TABLET_RPCS)])
def test_every_rpc_naming_a_bucket_carries_partition_id(module, service, rpcs):
    methods = module.DESCRIPTOR.services_by_name[service].methods
    assert {m.name for m in methods if _has_partition_field(m.input_type)} == rpcs
    for m in methods:  # and the partition_id is proto3 optional: unset differs from 0
        for f in m.input_type.fields:
            if f.name == "partition_id":
                assert f.has_presence, f"{m.input_type.name}.partition_id"


# -- tier 2: the coordinator over gRPC ------------------------------------------------------------

@pytest.fixture
def coordinator(make_config):
    server = CoordinatorServer(make_config({"kv.snapshot.lease.max-duration": "1h"})).start()
    try:
        assert server.wait_active(15)
        with AdminClient([server.address], retry_total_s=10) as admin, \
                grpc.insecure_channel(server.address) as channel:
            table = admin.create_table("db.t", SCHEMA, ["id"], 2)
            commit_snapshot(admin, TableBucket(table.table_id, 0), 1, 10)
            # the manifest of the snapshot the CommitKvSnapshot requests below name
            snapshot(admin.coordinator_info().remote_storage(), TableBucket(table.table_id, 1), 1, 5)
            admin.acquire_lease("held", {TableBucket(table.table_id, 0): 1}, 600_000)
            yield admin, cpb_grpc.CoordinatorServiceStub(channel), table
    finally:
        server.stop()


def _tb(table_id, bucket, partition):
    return cpb.TableBucketPb(table_id=table_id, bucket=bucket, **_part(partition))


COORDINATOR_REQUESTS = {
    "CommitKvSnapshot": lambda t, p: cpb.CommitKvSnapshotRequest(snapshot=cpb.KvSnapshotPb(
        bucket=_tb(t, 1, p), snapshot_id=1, log_offset=5, metadata_path=f"kv/{t}/1/snap-1/_METADATA")),
    "GetLatestKvSnapshots": lambda t, p: cpb.GetLatestKvSnapshotsRequest(table_id=t, **_part(p)),
    "ListKvSnapshots": lambda t, p: cpb.ListKvSnapshotsRequest(table_id=t, **_part(p)),
    "AcquireKvSnapshotLease": lambda t, p: cpb.AcquireKvSnapshotLeaseRequest(
        lease_id="new", snapshots=[cpb.BucketSnapshotPb(bucket=_tb(t, 0, p), snapshot_id=1)], duration_ms=60_000),
    "AcquireKvSnapshotLeases": lambda t, p: cpb.AcquireKvSnapshotLeasesRequest(requests=[  # one of two sets it
        cpb.AcquireKvSnapshotLeaseRequest(lease_id="new1", snapshots=[cpb.BucketSnapshotPb(
            bucket=_tb(t, 0, None), snapshot_id=1)], duration_ms=60_000),
        cpb.AcquireKvSnapshotLeaseRequest(lease_id="new2", snapshots=[cpb.BucketSnapshotPb(
            bucket=_tb(t, 0, p), snapshot_id=1)], duration_ms=60_000)]),
    "ReleaseKvSnapshotLease": lambda t, p: cpb.ReleaseKvSnapshotLeaseRequest(lease_id="held", buckets=[_tb(t, 0, p)]),
    "GetTableAssignment": lambda t, p: cpb.GetTableAssignmentRequest(table_id=t, **_part(p)),
    "AlterIsr": lambda t, p: cpb.AlterIsrRequest(server_id=1, table_id=t, bucket=0, leader_epoch=1, bucket_epoch=1,
                                                 isr=[1], **_part(p)),
    "ReassignBucket": lambda t, p: cpb.ReassignBucketRequest(database="db", name="t", bucket=0, replicas=[1],
                                                             **_part(p)),
    "ResignLeadership": lambda t, p: cpb.ResignLeadershipRequest(server_id=1, buckets=[cpb.ResignBucketPb(
        table_id=t, bucket=0, leader_epoch=1, reason="test", **_part(p))]),
    "ReportReplicaLoss": lambda t, p: cpb.ReportReplicaLossRequest(server_id=1, table_id=t, bucket=0, reason="test",
                                                                   **_part(p)),
    "ReportLogEnds": lambda t, p: cpb.ReportLogEndsRequest(server_id=1, buckets=[cpb.BucketLogEndPb(
        table_id=t, bucket=0, leader_epoch=1, log_end=5, **_part(p))]),
    "ConfirmRestore": lambda t, p: cpb.ConfirmRestoreRequest(server_id=1, table_id=t, bucket=0, leader_epoch=1,
                                                             **_part(p)),
    "RestoreBucket": lambda t, p: cpb.RestoreBucketRequest(table_id=t, bucket=0, accept_data_loss=True, **_part(p)),
    "ElectLeader": lambda t, p: cpb.ElectLeaderRequest(table_id=t, bucket=0, unclean=True, **_part(p)),
}

#: How each RPC answers a partition of the unpartitioned table, if not INVALID_REQUEST ("not partitioned"): the
#: cluster's own servers' requests name a physical id (common/tables.py; partition id 0 names none); ReportLogEnds
#: changes nothing either way (the end of a bucket no server leads) and succeeds; a commit's manifest must lie
#: under the partition's bucket directory, checked first.
COORDINATOR_REFUSALS = {
    "AlterIsr": errors.ErrorCode.TABLE_NOT_EXIST, "ResignLeadership": errors.ErrorCode.TABLE_NOT_EXIST,
    "ReportReplicaLoss": errors.ErrorCode.TABLE_NOT_EXIST, "ConfirmRestore": errors.ErrorCode.TABLE_NOT_EXIST,
    "ReportLogEnds": 0, "CommitKvSnapshot": errors.ErrorCode.INVALID_SNAPSHOT,
}
#: RPCs that answer per item: where the answer to the item naming the partition is.
PER_ITEM = {"ResignLeadership": lambda r: r.buckets[0], "AcquireKvSnapshotLeases": lambda r: r.responses[1]}


def test_coordinator_requests_cover_every_rpc_naming_a_bucket():
    assert set(COORDINATOR_REQUESTS) == COORDINATOR_RPCS


@pytest.mark.zk
@pytest.mark.parametrize("rpc", sorted(COORDINATOR_REQUESTS))
def test_coordinator_refuses_a_partition_of_an_unpartitioned_table_and_changes_nothing(coordinator, rpc):
    admin, stub, table = coordinator

    def state():
        return admin.list_kv_snapshots(table.table_id), admin.list_leases(), admin.get_table_assignment(table.table_id)

    before = state()
    response = getattr(stub, rpc)(COORDINATOR_REQUESTS[rpc](table.table_id, 0), timeout=10)
    expected = COORDINATOR_REFUSALS.get(rpc, errors.ErrorCode.INVALID_REQUEST)
    answer = PER_ITEM.get(rpc, lambda r: r)(response)
    assert answer.error.code == expected, response
    if expected == errors.ErrorCode.INVALID_REQUEST:
        assert "not partitioned" in answer.error.message, answer.error.message
    if rpc != "AcquireKvSnapshotLeases":  # its other acquire, of no partition, takes a lease
        assert state() == before
# -- tier 2: a tablet server over gRPC -------------------------------------------------------------

def _tablet_requests(tablet, table) -> dict:
    """rpc -> ``partition -> request`` naming bucket 0 of ``table`` (and ``partition``, if not None)."""
    t = table.table_id
    codec = RowCodec(table)
    row = batch_to_ipc(codec.to_batch([{"id": 2, "v": "b"}]))
    key = batch_to_ipc(codec.to_batch([{"id": 1}]).select(["id"]))

    def scan_req(p):
        return tpb.BucketScanReqPb(table_id=t, bucket=0, **_part(p))

    def leadership(p):  # the coordinator's own call; applied regardless of p, it would bump the epoch
        epoch = tablet.replicas.get(t, 0).leader_epoch + (0 if p is None else 1)
        return tpb.UpdateLeadershipRequest(
            coordinator_epoch=tablet.replicas.coordinator_epoch, server_id=1,
            buckets=[tpb.BucketLeadershipPb(table=table_to_pb(table), bucket=0, leader_epoch=epoch, **_part(p))])

    return {
        "UpdateLeadership": leadership,
        "PutKv": lambda p: tpb.PutKvRequest(table_id=t, bucket=0, upserts=row, **_part(p)),
        "Lookup": lambda p: tpb.LookupRequest(table_id=t, bucket=0, keys=key, **_part(p)),
        "FetchLog": lambda p: tpb.FetchLogRequest(table_id=t, bucket=0, from_offset=0, max_bytes=1 << 20, **_part(p)),
        "ReplicaFetch": lambda p: tpb.ReplicaFetchRequest(replica_id=2, buckets=[tpb.ReplicaFetchBucketPb(
            table_id=t, bucket=0, max_bytes=1 << 20, **_part(p))]),
        "ListOffsets": lambda p: tpb.ListOffsetsRequest(table_id=t, buckets=[0], **_part(p)),
        "TriggerSnapshot": lambda p: tpb.TriggerSnapshotRequest(table_id=t, buckets=[0], wait=True, **_part(p)),
        "ScanKv": lambda p: tpb.ScanKvRequest(bucket_scan_req=scan_req(p), batch_size_bytes=1 << 20),
        "ScanKvStream": lambda p: tpb.ScanKvStreamRequest(bucket_scan_req=scan_req(p), batch_size_bytes=1 << 20),
        "PrefixLookup": lambda p: tpb.PrefixLookupRequest(table_id=t, bucket=0, prefixes=key, **_part(p)),
    }


#: rpc -> (code, words) of its refusal of partition 3 of an unpartitioned table; the others: INVALID_REQUEST, "not
#: partitioned". The push names its table's view with no partition; a follower's fetch finds no such bucket.
TABLET_REFUSALS = {
    "UpdateLeadership": (errors.ErrorCode.INVALID_REQUEST, "with partition_id 3, but its table is not partitioned"),
    "ReplicaFetch": (errors.ErrorCode.NOT_LEADER, "does not lead bucket 0 of partition 3 of table"),
}


@pytest.mark.zk
def test_tablet_server_refuses_a_partition_of_an_unpartitioned_table_on_every_rpc_and_changes_nothing(
        make_config, tmp_path):
    c = Cluster(make_config)
    try:
        tablet = c.tablet(1, tmp_path / "t1")
        table = c.admin.create_table("db.t", SCHEMA, ["id"], 1)
        t = table.table_id
        stub = c.stub(t, 0)
        put(stub, table, [{"id": 1, "v": "a"}])
        requests = _tablet_requests(tablet, table)
        assert set(requests) == TABLET_RPCS

        def call(rpc, partition):
            answer = getattr(stub, rpc)(requests[rpc](partition), timeout=10)
            return list(answer)[-1] if rpc == "ScanKvStream" else answer

        def state():
            offsets = stub.ListOffsets(tpb.ListOffsetsRequest(table_id=t, buckets=[0]), timeout=10).offsets[0]
            return (sorted(tablet.replicas._replicas), tablet.replicas.get(t, 0).leader_epoch,
                    (offsets.error.code, offsets.earliest, offsets.latest), lookup(stub, table, [1, 2]),
                    c.admin.list_kv_snapshots(t), len(tablet.scans._sessions), tablet.scans.snapshots_open)

        for rpc in sorted(requests):
            before = state()
            response = call(rpc, 3)
            if rpc == "ReplicaFetch":  # answered per bucket
                assert not response.error.code, response.error
                response = response.buckets[0]
            code, words = TABLET_REFUSALS.get(rpc, (errors.ErrorCode.INVALID_REQUEST,
                                                    f"table {t} is not partitioned: leave partition_id unset (it is 3)"))
            assert response.error.code == code, (rpc, response.error)
            assert words in response.error.message, (rpc, response.error.message)
            assert state() == before, rpc
            response = call(rpc, None)  # without the partition id: as before
            if rpc == "PrefixLookup":  # this table has no bucket key: refused by the rpc's own rule
                assert "has no bucket key" in response.error.message, response.error
                continue
            assert response.error.code == 0, (rpc, response.error)
            if rpc == "ReplicaFetch":  # one replica: not fetched from, by its own rule
                assert response.buckets[0].error.code == errors.ErrorCode.INVALID_REQUEST, response.buckets[0]
        assert lookup(stub, table, [2]) == [{"id": 2, "v": "b"}]  # the unpartitioned PutKv wrote
        assert c.admin.get_latest_kv_snapshots(t)  # the unpartitioned TriggerSnapshot committed
    finally:
        c.close()
