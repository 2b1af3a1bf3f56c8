"""The admin client's parts on their own, each built on a stand-in coordinator call; the tablet servers' own
calls (client/server_calls.py); and the shape of the client: composed, not assembled from mixins."""

from __future__ import annotations

import ast

import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.data_loss_admin import DataLossAdmin
from kvlease.client.moves_admin import MovesAdmin
from kvlease.client.replication_admin import ReplicationAdmin
from kvlease.client.security_admin import SecurityAdmin
from kvlease.client.server_calls import ServerCalls
from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.proto import security_pb2_grpc
from kvlease.common.security.acl import Resource
from kvlease.common.tables import Column, TableInfo
from tests.support.paths import REPO

pytestmark = pytest.mark.unit

#: the calls only tablet servers make: on ServerCalls, never on the public AdminClient
SERVER_ONLY = ("alter_isr", "controlled_shutdown", "resign_leadership", "report_replica_loss", "confirm_restore",
               "report_log_ends")
TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 4, 0, replication_factor=3)


class Coordinator:
    """A stand-in coordinator call: records ``(method, request, stub_class, answered)``, answers from
    ``answers[method]``."""

    def __init__(self, **answers) -> None:
        self.answers = answers
        self.asked: list[tuple] = []

    def __call__(self, method, request, stub_class=None, answered=()):
        self.asked.append((method, request, stub_class, answered))
        return self.answers[method]


def test_the_security_part_sends_to_the_security_service_and_keeps_passwords_off_plaintext():
    call = Coordinator(AddUser=type("R", (), {"created": True})(), ListUsers=type("R", (), {"names": ["bob"]})())
    local = SecurityAdmin(call, tls=False, bootstrap=["127.0.0.1:9123"])
    assert local.add_user("bob", "pw") is True and local.list_users() == ["bob"]
    assert [(m, s) for m, _r, s, _a in call.asked] == [("AddUser", security_pb2_grpc.SecurityServiceStub),
                                                      ("ListUsers", security_pb2_grpc.SecurityServiceStub)]
    remote = SecurityAdmin(call, tls=False, bootstrap=["10.1.2.3:9123"])
    with pytest.raises(errors.InvalidRequestError, match="a password is only sent over TLS"):
        remote.add_user("eve", "pw")
    assert len(call.asked) == 2  # refused before anything was sent
    SecurityAdmin(call, tls=True, bootstrap=["10.1.2.3:9123"]).add_user("eve", "pw")
    assert call.asked[-1][0] == "AddUser"


def test_the_moves_and_data_loss_parts_ask_for_the_table_through_what_they_were_given():
    tables: list[str] = []

    def get_table(path: str) -> TableInfo:
        tables.append(path)
        return TABLE

    call = Coordinator(RestoreBucket=pb.RestoreBucketResponse(bucket=pb.BucketAssignmentPb(
        bucket=1, leader_id=2, leader_epoch=5, replicas=[2, 3])), ListReassignments=pb.ListReassignmentsResponse())
    def find_partition(table: TableInfo, name: str) -> TableInfo:
        return table.of_partition(70, name)

    data_loss = DataLossAdmin(call, get_table, find_partition)
    restored = data_loss.restore_bucket("db.t", 1, accept_data_loss=True, tablet=2)
    assert (restored["leader"], restored["replicas"], restored["replication_factor"]) == (2, [2, 3], 3)
    assert restored["partition"] is None
    assert call.asked[0][1] == pb.RestoreBucketRequest(table_id=7, bucket=1, accept_data_loss=True, tablet=2)
    of_partition = data_loss.restore_bucket("db.t", 1, accept_data_loss=True, partition="d1")
    assert of_partition["partition"] == "d1"  # the partition's id goes on the wire
    assert call.asked[1][1] == pb.RestoreBucketRequest(table_id=7, bucket=1, accept_data_loss=True, partition_id=70)
    moves = MovesAdmin(call, get_table)
    with pytest.raises(errors.InvalidRequestError, match="not partitioned"):
        moves.reassign_bucket("db.t", 0, [1, 2, 3], partition="p=1")
    assert tables == ["db.t", "db.t", "db.t"] and moves.list_reassignments() == []


def test_the_replication_part_reads_the_cluster_health():
    call = Coordinator(ListTabletServers=pb.ListTabletServersResponse(
        servers=[pb.TabletServerPb(id=1, address="h:1", buckets=2, replicas=3)], decommissioned=[4],
        offline=[pb.BucketRefPb(table_id=7, table="db.t", bucket=0, offline_reason="lost")],
        under_replicated=[pb.BucketRefPb(table_id=9, table="shop.events", bucket=1, partition_id=12,
                                         partition="20261129")]))
    health = ReplicationAdmin(call).cluster_health()
    assert [s.id for s in health.servers] == [1] and health.decommissioned == (4,)
    assert [(b.table, b.offline_reason, b.partition_id) for b in health.offline] == [("db.t", "lost", None)]
    assert [(b.table, b.partition, b.partition_id, b.bucket) for b in health.under_replicated] == [
        ("shop.events", "20261129", 12, 1)]


def test_server_calls_read_a_fenced_alter_isr_and_each_resignation():
    fenced = pb.AlterIsrResponse(error=pb.ErrorPb(code=errors.ErrorCode.FENCED_LEADER_EPOCH, message="not leader"),
                                 isr=[2, 3], leader=2, leader_epoch=6, bucket_epoch=9)
    resigned = pb.ResignLeadershipResponse(buckets=[
        pb.ResignedBucketPb(bucket=pb.BucketAssignmentPb(bucket=0, leader_id=2, leader_epoch=5, isr=[2])),
        pb.ResignedBucketPb(error=pb.ErrorPb(code=errors.ErrorCode.FENCED_LEADER_EPOCH, message="other epoch"))])
    call = Coordinator(AlterIsr=fenced, ResignLeadership=resigned, ControlledShutdown=pb.ControlledShutdownResponse(
        remaining_leaders=1), ReportReplicaLoss=None, ConfirmRestore=None, ReportLogEnds=None)
    calls = ServerCalls(call)
    with pytest.raises(errors.FencedLeaderEpochError) as refusal:
        calls.alter_isr(1, 7, 0, 5, 8, [1, 2])
    assert refusal.value.details == {"leader": 2, "leader_epoch": 6, "bucket_epoch": 9, "isr": [2, 3]}
    assert call.asked[0][3] == (errors.FencedLeaderEpochError,)  # answered, read with the current state
    moved, refused = calls.resign_leadership(1, [(7, 0, 4, "ENOSPC"), (7, 1, 4, "ENOSPC")])
    assert (moved.state.leader_id, moved.error, refused.state) == (2, None, None)
    assert isinstance(refused.error, errors.FencedLeaderEpochError)
    assert calls.controlled_shutdown(1) == 1
    calls.report_replica_loss(1, 7, 0, "EIO")
    calls.confirm_restore(1, 7, 0, 6)
    calls.report_log_ends(1, [(7, 0, 6, 100)], takeover=True)
    assert [m for m, *_ in call.asked[-3:]] == ["ReportReplicaLoss", "ConfirmRestore", "ReportLogEnds"]
    assert call.asked[-1][1] == pb.ReportLogEndsRequest(server_id=1, takeover=True, buckets=[
        pb.BucketLogEndPb(table_id=7, bucket=0, leader_epoch=6, log_end=100)])


def test_the_public_admin_client_has_no_tablet_server_call_and_delegates_each_part_call():
    assert not [name for name in SERVER_ONLY if hasattr(AdminClient, name)]
    assert all(hasattr(ServerCalls, name) for name in SERVER_ONLY)
    assert AdminClient.__bases__ == (object,)
    admin = AdminClient("127.0.0.1:1", retry_total_s=0)
    try:
        seen: list[str] = []
        admin._security._call = lambda method, request, *rest: seen.append(method) or type("R", (), {
            "removed": True, "entries": []})()
        assert admin.remove_user("bob") is True and admin.list_acls(Resource.cluster()) == []
        assert seen == ["RemoveUser", "ListAcls"]
        assert admin.add_user.__doc__ == SecurityAdmin.add_user.__doc__  # the part's text, shown by help()
        assert admin.caller.bootstrap == admin.bootstrap == ["127.0.0.1:1"]
    finally:
        admin.close()
    with pytest.raises(errors.InvalidRequestError, match="this AdminClient is closed"):
        admin.caller.call("ListTables", pb.ListTablesRequest())


def test_no_class_of_the_client_is_assembled_from_mixins():
    """Every class in client/ has at most one base: parts are owned and delegated to, not inherited."""
    several = [f"{path.name}:{node.name}" for path in sorted((REPO / "client").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
               and len(node.bases) > 1]
    assert several == []


def test_a_partitions_bucket_moves_by_its_partitions_name_and_its_move_names_it():
    partitioned = TableInfo(7, "db", "p", (Column("day", "STRING"), Column("id", "BIGINT")), ("day", "id"), 2,
                            partition_key=("day",))
    move = pb.BucketMovePb(table_id=7, table="db.p", bucket=0, replicas=[1], target=[2], state="moving",
                           partition_id=70, partition="d1")
    call = Coordinator(ReassignBucket=pb.ReassignBucketResponse(move=move))
    doc = MovesAdmin(call, lambda path: partitioned).reassign_bucket("db.p", 0, [2], partition="d1")
    assert call.asked[0][1] == pb.ReassignBucketRequest(database="db", name="p", bucket=0, replicas=[2], partition="d1")
    assert (doc["partition"], doc["partition_id"], doc["bucket"]) == ("d1", 70, 0)
    unpartitioned = MovesAdmin(Coordinator(ReassignBucket=pb.ReassignBucketResponse(move=pb.BucketMovePb(
        table="db.t", bucket=0))), lambda path: TABLE).reassign_bucket("db.t", 0, [2])
    assert "partition" not in unpartitioned and "partition_id" not in unpartitioned
