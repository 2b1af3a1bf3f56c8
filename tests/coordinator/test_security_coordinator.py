"""The coordinator's authorization over real gRPC + TLS on a real cluster: each operation denied without its ACL
(and nothing changed) and allowed with it; bad credentials; forged internal calls."""

from __future__ import annotations

import pytest

from kvlease.client.server_calls import ServerCalls
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.security.acl import Resource
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.support.secure_cluster import ACL_WAIT_S, INTERNAL_PASSWORD, NOT_YET_GRANTED, SecureCluster
from tests.support.snapshot_manifests import snapshot

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]
BOB = "User:bob"


@pytest.fixture
def secure(make_config, tmp_path):
    with SecureCluster(make_config, tmp_path) as cluster:
        cluster.add_user("bob", "bob-pw")
        yield cluster


def is_refused(call) -> bool:
    """Whether ``call()`` is refused (a revoke reaches the servers' caches by a watch)."""
    try:
        call()
    except errors.AuthorizationFailedError:
        return True
    return False


def refused(call, operation: str, resource: str) -> errors.AuthorizationFailedError:
    with pytest.raises(errors.AuthorizationFailedError) as info:
        call()
    assert operation in info.value.message and resource in info.value.message, info.value.message
    assert info.value.message.startswith(BOB + " "), info.value.message
    return info.value


def snapshotted_table(secure: SecureCluster, path: str) -> int:
    """A 1-bucket table with two rows and one snapshot; its id."""
    info = secure.cluster.create_table(path, COLUMNS, ["id"], 1)
    with TableClient(secure.admin, path) as table:
        table.upsert([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
        table.trigger_snapshot()
    return info.table_id


def test_create_needs_create_on_the_database_and_drop_needs_drop_on_the_table(secure):
    bob = secure.admin_as("bob", "bob-pw")
    refused(lambda: bob.create_table("db.t", COLUMNS, ["id"], 1), "CREATE", "database db")
    assert secure.admin.list_tables() == []
    secure.grant(BOB, "CREATE", "db")
    wait_until(lambda: bob.create_table("db.t", COLUMNS, ["id"], 1), ACL_WAIT_S, "bob creates db.t",
               retry_on=NOT_YET_GRANTED)
    refused(lambda: bob.create_table("other.t", COLUMNS, ["id"], 1), "CREATE", "database other")

    refused(lambda: bob.drop_table("db.t"), "DROP", "table db.t")
    assert [t.path for t in secure.admin.list_tables()] == ["db.t"]
    secure.grant(BOB, "DROP", "db.t")
    assert wait_until(lambda: bob.drop_table("db.t"), ACL_WAIT_S, "bob drops db.t", retry_on=NOT_YET_GRANTED) is True
    assert secure.admin.list_tables() == []


def test_tables_are_listed_and_described_only_where_the_caller_has_a_grant(secure):
    for path in ("db.a", "db.b", "other.c"):
        secure.cluster.create_table(path, COLUMNS, ["id"], 1)
    bob = secure.admin_as("bob", "bob-pw")
    assert bob.list_tables() == []
    refused(lambda: bob.get_table("db.a"), "DESCRIBE", "table db.a")
    secure.grant(BOB, "READ", "db.a")  # any grant allows DESCRIBE
    wait_until(lambda: bob.get_table("db.a"), ACL_WAIT_S, "bob describes db.a", retry_on=NOT_YET_GRANTED)
    assert [t.path for t in bob.list_tables()] == ["db.a"]
    table_b = secure.admin.get_table("db.b")
    refused(lambda: bob.get_table_by_id(table_b.table_id), "DESCRIBE", "table db.b")
    refused(lambda: bob.get_table_assignment(table_b.table_id), "DESCRIBE", "table db.b")
    secure.grant(BOB, "DESCRIBE", "db")  # the database's grant covers its tables
    wait_until(lambda: bob.get_table_assignment(table_b.table_id), ACL_WAIT_S, "bob describes db.b",
               retry_on=NOT_YET_GRANTED)
    assert [t.path for t in bob.list_tables()] == ["db.a", "db.b"]
    secure.grant("User:*", "DESCRIBE", "cluster")  # the wildcard principal, on the cluster
    wait_until(lambda: bob.get_table("other.c"), ACL_WAIT_S, "bob describes other.c", retry_on=NOT_YET_GRANTED)


def test_altering_a_schema_needs_alter_on_the_table_and_its_history_describe(secure):
    secure.cluster.create_table("db.t", COLUMNS, ["id"], 1)
    bob = secure.admin_as("bob", "bob-pw")
    refused(lambda: bob.schema_history("db.t"), "DESCRIBE", "table db.t")
    refused(lambda: bob.alter_table("db.t", add_column="c INT"), "ALTER", "table db.t")
    assert secure.admin.get_table("db.t").schema_id == 1
    secure.grant(BOB, "ALTER", "db.t")
    altered = wait_until(lambda: bob.alter_table("db.t", add_column="c INT"), ACL_WAIT_S, "bob alters db.t",
                         retry_on=NOT_YET_GRANTED)
    assert altered.schema_id == 2 and [v.schema_id for v in bob.schema_history("db.t")[1]] == [1, 2]


def test_snapshot_listing_needs_read(secure):
    table_id = snapshotted_table(secure, "db.t")
    bob = secure.admin_as("bob", "bob-pw")
    refused(lambda: bob.list_kv_snapshots(table_id), "READ", "table db.t")
    refused(lambda: bob.get_latest_kv_snapshots(table_id), "READ", "table db.t")
    secure.grant(BOB, "READ", "db.t")
    assert len(wait_until(lambda: bob.list_kv_snapshots(table_id), ACL_WAIT_S, "bob lists the snapshots",
                          retry_on=NOT_YET_GRANTED)) == 1
    assert len(bob.get_latest_kv_snapshots(table_id)) == 1


def test_every_lease_operation_needs_read_on_the_leased_tables(secure):
    table_id = snapshotted_table(secure, "db.t")
    (tb, info), = secure.admin.get_latest_kv_snapshots(table_id).items()
    bob = secure.admin_as("bob", "bob-pw")
    refused(lambda: bob.acquire_lease("q1", {tb: info.snapshot_id}, 60_000), "READ", "table db.t")
    assert secure.admin.list_leases() == []

    secure.grant(BOB, "READ", "db.t")
    acquired = wait_until(lambda: bob.acquire_lease("q1", {tb: info.snapshot_id}, 60_000), ACL_WAIT_S,
                          "bob acquires q1", retry_on=NOT_YET_GRANTED)
    assert set(acquired.acquired) == {tb}
    assert [lease.lease_id for lease in bob.list_leases()] == ["q1"]
    before = secure.admin.describe_lease("q1")

    secure.revoke(BOB, "READ", "db.t")
    wait_until(lambda: is_refused(lambda: bob.get_table("db.t")), ACL_WAIT_S, "bob refused db.t after the revoke")
    # the lease's own tables count; one bob may not even DESCRIBE is not named (a QA walkthrough learnt
    # another user's table from such a refusal)
    for call in (lambda: bob.renew_lease("q1", 120_000), lambda: bob.describe_lease("q1"),
                 lambda: bob.drop_lease("q1"), lambda: bob.acquire_lease("q1", {}, 120_000)):
        assert "db.t" not in refused(call, "READ", "every table lease q1 holds").message
    refused(lambda: bob.release_lease("q1", [tb]), "READ", "table db.t")  # bob named it
    secure.grant(BOB, "DESCRIBE", "db.t")  # a table bob may see is named
    wait_until(lambda: bob.get_table("db.t"), ACL_WAIT_S, "bob describes db.t", retry_on=NOT_YET_GRANTED)
    refused(lambda: bob.renew_lease("q1", 120_000), "READ", "table db.t")
    secure.revoke(BOB, "DESCRIBE", "db.t")
    wait_until(lambda: is_refused(lambda: bob.get_table("db.t")), ACL_WAIT_S, "bob refused db.t after the revoke")
    assert bob.list_leases() == []  # hidden, not refused
    assert secure.admin.describe_lease("q1") == before  # nothing changed

    secure.grant(BOB, "READ", "db")
    assert wait_until(lambda: bob.renew_lease("q1", 120_000), ACL_WAIT_S, "bob renews q1",
                      retry_on=NOT_YET_GRANTED) > before.expiration_time
    assert bob.drop_lease("q1") is True
    assert bob.drop_lease("q1") is False  # a retried drop: the same outcome, no error
    assert bob.release_lease("q1", [tb]).released is False


def test_acquires_travelling_together_are_each_checked_for_read_on_their_own_tables(secure):
    from kvlease.common.proto import coordinator_pb2 as pb
    from kvlease.common.wire import bucket_snapshots_to_pb

    latest = {path: secure.admin.get_latest_kv_snapshots(snapshotted_table(secure, path)) for path in ("db.a", "db.b")}
    secure.grant(BOB, "READ", "db.a")
    bob = secure.admin_as("bob", "bob-pw")
    requests = [pb.AcquireKvSnapshotLeaseRequest(lease_id=f"q-{path[-1]}", duration_ms=60_000, snapshots=(
        bucket_snapshots_to_pb({tb: info.snapshot_id for tb, info in latest[path].items()}))) for path in latest]
    allowed, denied = bob._acquire_many(requests)  # one AcquireKvSnapshotLeases call, as bob
    assert not isinstance(allowed, Exception) and allowed.error.code == 0
    assert isinstance(denied, errors.AuthorizationFailedError)
    assert "READ" in denied.message and "table db.b" in denied.message
    assert [lease.lease_id for lease in secure.admin.list_leases()] == ["q-a"]


def test_a_forged_snapshot_commit_is_refused_even_from_a_super_user(secure):
    table_id = snapshotted_table(secure, "db.t")
    tb = TableBucket(table_id, 0)
    latest = secure.admin.get_latest_kv_snapshots(table_id)[tb]
    forged = snapshot(secure.cluster.coordinator.storage, tb, latest.snapshot_id + 1, latest.log_offset)
    with pytest.raises(errors.AuthorizationFailedError, match="CommitKvSnapshot") as info:
        secure.admin.commit_kv_snapshot(forged)
    assert "User:admin" in info.value.message
    assert [s.snapshot_id for s in secure.admin.list_kv_snapshots(table_id)] == [latest.snapshot_id]
    # the cluster's own principal may (this is how a tablet server commits)
    cluster_admin = secure.admin_as("kvlease", INTERNAL_PASSWORD)
    cluster_admin.commit_kv_snapshot(forged)
    assert latest.snapshot_id + 1 in {s.snapshot_id for s in secure.admin.list_kv_snapshots(table_id)}


@pytest.mark.parametrize("user, password", [("bob", "wrong"), ("nobody", "bob-pw"), (None, None),
                                            ("kvlease", "not-the-cluster-password")],
                         ids=["wrong-password", "unknown-user", "no-credentials", "wrong-cluster-password"])
def test_bad_credentials_are_refused_and_change_nothing(secure, user, password):
    client = secure.admin_as(user, password)
    with pytest.raises(errors.AuthenticationFailedError):
        client.create_table("db.t", COLUMNS, ["id"], 1)
    with pytest.raises(errors.AuthenticationFailedError):
        client.list_tables()
    assert secure.admin.list_tables() == []


def test_a_plaintext_client_cannot_talk_to_a_tls_coordinator(secure):
    from kvlease.client.transport import TlsMismatchError

    client = secure.admin_as("bob", "bob-pw", tls=False)
    with pytest.raises(TlsMismatchError, match="it speaks TLS and this client does not"):
        client.list_tables()


def test_under_mutual_tls_the_certificate_names_the_caller(make_config, tmp_path):
    with SecureCluster(make_config, tmp_path, client_auth=True) as secure:
        secure.cluster.create_table("db.t", COLUMNS, ["id"], 1)
        anonymous = secure.admin_as(None)  # the client certificate only: User:kvlease-client
        with pytest.raises(errors.AuthorizationFailedError) as info:
            anonymous.get_table("db.t")
        assert info.value.message.startswith("User:kvlease-client "), info.value.message
        secure.grant("User:kvlease-client", "DESCRIBE", "db.t")
        assert wait_until(lambda: anonymous.get_table("db.t"), ACL_WAIT_S, "the certificate's user describes db.t",
                          retry_on=NOT_YET_GRANTED).path == "db.t"


def test_the_replication_calls_are_for_the_cluster_principal_only(secure):
    info = secure.cluster.create_table("db.r", COLUMNS, ["id"], 1)
    _table, leaders = secure.admin.get_table_assignment(info.table_id)
    b = leaders[0]
    assert (b.replicas, b.isr) == ((b.leader_id,), (b.leader_id,))
    for call, method in ((lambda a: a.alter_isr(b.leader_id, info.table_id, 0, b.leader_epoch, b.bucket_epoch,
                                                 [b.leader_id]), "AlterIsr"),
                         (lambda a: a.controlled_shutdown(b.leader_id), "ControlledShutdown"),
                         (lambda a: a.resign_leadership(b.leader_id, [(info.table_id, 0, b.leader_epoch, "EIO")]),
                          "ResignLeadership")):
        with pytest.raises(errors.AuthorizationFailedError, match=method) as refusal:
            call(ServerCalls(secure.admin.caller.call))  # even a super user
        assert "User:admin" in refusal.value.message
    cluster_admin = secure.admin_as("kvlease", INTERNAL_PASSWORD)
    cluster_calls = ServerCalls(cluster_admin.caller.call)  # the tablet servers' calls, as they make them
    same = cluster_calls.alter_isr(b.leader_id, info.table_id, 0, b.leader_epoch, b.bucket_epoch, [b.leader_id])
    assert (same.leader, same.isr, same.leader_epoch, same.bucket_epoch) == (
        b.leader_id, (b.leader_id,), b.leader_epoch, b.bucket_epoch)
    with pytest.raises(errors.FencedLeaderEpochError) as fenced:  # not the leader: refused with the current state
        cluster_calls.alter_isr(b.leader_id + 100, info.table_id, 0, b.leader_epoch, b.bucket_epoch, [b.leader_id])
    assert fenced.value.details == {"leader": b.leader_id, "leader_epoch": b.leader_epoch,
                                    "bucket_epoch": b.bucket_epoch, "isr": [b.leader_id]}
    assert cluster_calls.controlled_shutdown(b.leader_id) == 0  # one replica: nothing to move, nothing left
    [kept] = cluster_calls.resign_leadership(b.leader_id, [(info.table_id, 0, b.leader_epoch, "EIO")])
    assert kept.state.leader_id == b.leader_id and "one replica" in kept.refused  # nothing to elect: it keeps it
    assert secure.admin.get_table_assignment(info.table_id)[1][0] == b


def test_moving_replicas_needs_alter_on_the_cluster(secure):
    """Reassign, decommission, recommission and rebalance are admin operations (issue 31); listing the moves
    needs DESCRIBE."""
    secure.cluster.create_table("db.m", COLUMNS, ["id"], 1)
    bob = secure.admin_as("bob", "bob-pw")
    for call in (lambda a: a.reassign_bucket("db.m", 0, [1]), lambda a: a.decommission_tablet(1),
                 lambda a: a.recommission_tablet(1), lambda a: a.rebalance(), lambda a: a.list_reassignments()):
        with pytest.raises(errors.AuthorizationFailedError, match="User:bob"):
            call(bob)
    secure.grant("User:bob", "DESCRIBE", Resource.cluster())
    wait_until(lambda: bob.list_reassignments() == [], ACL_WAIT_S, "bob lists no moves", retry_on=NOT_YET_GRANTED)
    secure.grant("User:bob", "ALTER", Resource.cluster())
    # one tablet server, one replica: nothing to move
    wait_until(lambda: bob.rebalance() == [], ACL_WAIT_S, "bob's rebalance moving nothing", retry_on=NOT_YET_GRANTED)
    assert bob.recommission_tablet(1) is False  # registered, not decommissioned
    with pytest.raises(errors.InvalidRequestError, match=r"tablet server\(s\) \[2\] are not live"):
        bob.reassign_bucket("db.m", 0, [2])  # authorized: refused for what it asks
