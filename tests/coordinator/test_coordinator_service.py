"""Coordinators in-process on a real ZooKeeper, spoken to over real gRPC on loopback."""

from __future__ import annotations

import contextlib
import json

import re
import time
import urllib.request

import grpc
import pytest

from kvlease.common import errors, zkpaths
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.proto import coordinator_pb2_grpc as pb_grpc
from kvlease.common.tables import Column
from kvlease.client.admin import AdminClient, ReleaseResult
from kvlease.coordinator.server import CoordinatorServer
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
from kvlease.ops.wait import wait_until
from tests.support.snapshot_manifests import snapshot, write_manifest

pytestmark = pytest.mark.zk


@pytest.fixture
def pair(make_config):
    config = make_config({"metrics.port": 0, "kv.snapshot.lease.expiration-check-interval": "100ms",
                          "kv.snapshot.lease.max-duration": "1h", "client.retry.total-timeout": "10s"})
    servers = [CoordinatorServer(config).start(), CoordinatorServer(config).start()]
    try:
        active = wait_until(lambda: next((s for s in servers if s.is_active), None), 15, "an active coordinator",
                            interval_s=0.02)
        standby = next(s for s in servers if s is not active)
        yield active, standby
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def client(pair):
    active, standby = pair
    with AdminClient([standby.address, active.address], retry_total_s=10) as admin:
        yield admin


@pytest.fixture
def table(client, pair):
    t = client.create_table("db.orders", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 4)
    for bucket in range(2):
        client.commit_kv_snapshot(snapshot(pair[0].storage, TableBucket(t.table_id, bucket), 1, 10))
    return t


def test_standby_answers_not_coordinator_with_the_active_address(pair):
    active, standby = pair
    with grpc.insecure_channel(standby.address) as channel:
        stub = pb_grpc.CoordinatorServiceStub(channel)
        response = stub.ListKvSnapshotLeases(pb.ListKvSnapshotLeasesRequest(), timeout=5)
        assert response.error.code == errors.ErrorCode.NOT_COORDINATOR
        assert response.error.active_address == active.address
        info = stub.CoordinatorInfo(pb.CoordinatorInfoRequest(), timeout=5)
        assert not info.active and info.active_address == active.address and info.epoch >= 1


def test_client_follows_not_coordinator(client, pair, table):
    active, _standby = pair
    assert client.get_table("db.orders").table_id == table.table_id
    assert client.address == active.address


def test_lease_lifecycle_over_grpc(client, table):
    tb0, tb1, tb2 = (TableBucket(table.table_id, b) for b in range(3))
    result = client.acquire_lease("spark-1", {tb0: 1, tb1: 1, tb2: 5}, 60_000)
    assert result.acquired == {tb0: 1, tb1: 1}
    assert result.unavailable == {tb2: 5}
    assert result.expiration_time > time.time() * 1000
    assert client.describe_lease("spark-1").buckets == {tb0: 1, tb1: 1}
    rows = {(s.bucket.bucket, s.snapshot_id): s.leased_by for s in client.list_kv_snapshots(table.table_id)}
    assert rows == {(0, 1): ("spark-1",), (1, 1): ("spark-1",)}
    latest = client.get_latest_kv_snapshots(table.table_id)
    assert set(latest) == {tb0, tb1}  # buckets without a snapshot are absent
    new_expiration = client.renew_lease("spark-1", 120_000)
    assert new_expiration > result.expiration_time
    assert client.release_lease("spark-1", [tb0]) == ReleaseResult("spark-1", released=True, lease_remains=True)
    assert client.release_lease("spark-1", [tb1]) == ReleaseResult("spark-1", released=True, lease_remains=False)
    with pytest.raises(errors.LeaseNotFoundError):
        client.describe_lease("spark-1")
    assert client.drop_lease("spark-1") is False


@pytest.mark.parametrize("lease_id, snapshots, duration, error", [
    ("", {0: 1}, 1000, errors.InvalidLeaseIdError),
    ("has space", {0: 1}, 1000, errors.InvalidLeaseIdError),
    ("x" * 129, {0: 1}, 1000, errors.InvalidLeaseIdError),
    ("ok", {}, 1000, errors.InvalidRequestError),
    ("ok", {0: 1}, 0, errors.InvalidLeaseDurationError),
    ("ok", {0: 1}, -5, errors.InvalidLeaseDurationError),
    ("ok", {0: 1}, 3_600_001, errors.InvalidLeaseDurationError),
    ("ok", {4: 1}, 1000, errors.BucketOutOfRangeError),
    ("ok", {-1: 1}, 1000, errors.BucketOutOfRangeError),
])
def test_bad_acquire_is_a_typed_error_and_changes_nothing(client, table, lease_id, snapshots, duration, error):
    with pytest.raises(error) as info:
        client.acquire_lease(lease_id, {TableBucket(table.table_id, b): s for b, s in snapshots.items()}, duration)
    assert info.value.message  # names the problem
    if error is errors.BucketOutOfRangeError:  # by the table's name, which the caller knows it by
        assert f"out of range for table {table.path} (id {table.table_id}; buckets 0..3)" in info.value.message
    assert client.list_leases() == []


def test_unknown_table_and_unknown_lease(client, table):
    with pytest.raises(errors.TableNotExistError):
        client.acquire_lease("x", {TableBucket(table.table_id + 100, 0): 1}, 1000)
    with pytest.raises(errors.LeaseNotFoundError):
        client.renew_lease("never-acquired", 1000)
    assert client.list_leases() == []  # renew never creates an empty lease
    released = client.release_lease("never-acquired", [TableBucket(table.table_id, 0)])  # no error
    assert (released.released, released.lease_remains) == (False, False)


def test_tables(client, table):
    with pytest.raises(errors.TableAlreadyExistError):
        client.create_table("db.orders", [Column("id", "BIGINT")], ["id"], 1)
    with pytest.raises(errors.InvalidTableError):
        client.create_table("db.bad", [Column("id", "DECIMAL(39,0)")], ["id"], 1)  # past 38 digits
    with pytest.raises(errors.InvalidTableError):
        client.create_table("db.bad", [Column("id", "BIGINT")], ["nope"], 1)
    with pytest.raises(errors.InvalidTableError):
        client.create_table("db.bad", [Column("id", "BIGINT")], ["id"], 0)
    assert [t.path for t in client.list_tables()] == ["db.orders"]
    client.drop_table("db.orders")
    with pytest.raises(errors.TableNotExistError):
        client.get_table("db.orders")
    client.drop_table("db.orders", ignore_if_not_exists=True)


@pytest.mark.parametrize("database, name, column, key", [
    ("db", "nl\n", "id", "id"), ("db\n", "t", "id", "id"), ("db", "t", "id\n", "id\n"), ("db", "t", "id", "id\n"),
])
def test_a_trailing_newline_is_not_a_name(pair, database, name, column, key):
    """``$`` matches before a final newline: names are checked with full matches, at once, not retried."""
    active, _ = pair
    request = pb.CreateTableRequest(database=database, name=name, columns=[pb.ColumnPb(name=column, type="BIGINT")],
                                    primary_key=[key], buckets=1)
    with grpc.insecure_channel(active.address) as channel:
        started = time.monotonic()
        response = pb_grpc.CoordinatorServiceStub(channel).CreateTable(request, timeout=5)
        assert time.monotonic() - started < 2
        listed = pb_grpc.CoordinatorServiceStub(channel).ListTables(pb.ListTablesRequest(), timeout=5)
    assert response.error.code in (errors.ErrorCode.INVALID_TABLE, errors.ErrorCode.INVALID_REQUEST)
    assert "\\n" in response.error.message  # names the bad name
    assert list(listed.tables) == []


def test_a_zookeeper_bad_argument_is_an_invalid_request_not_retriable(zk_client):
    from kvlease.coordinator.fencing import FencedWriter, bump_epoch
    from kvlease.common.zk import ZkOp

    _, version = bump_epoch(zk_client)
    writer = FencedWriter(zk_client, version)
    with pytest.raises(errors.InvalidRequestError) as info:
        writer.commit([ZkOp("create", "/bad\u0001name", b"")])
    assert not isinstance(info.value, errors.RetriableError)
    assert "BadArgumentsError" in info.value.message
    assert zk_client.exists("/bad\u0001name") is None


def test_create_if_not_exists_is_idempotent_only_for_the_same_definition(client, table):
    same = [Column("id", "BIGINT"), Column("v", "string")]
    assert client.create_table("db.orders", same, ["id"], 4, ignore_if_exists=True) == table  # a retry
    for columns, key, buckets, difference in [
        (same, ["id"], 2, "buckets 4 there, 2 asked"),
        ([Column("id", "BIGINT")], ["id"], 4, "columns (id BIGINT, v STRING) there, (id BIGINT) asked"),
        (same, ["v"], 4, "primary key (id) there, (v) asked"),
    ]:
        with pytest.raises(errors.TableAlreadyExistError, match=re.escape(difference)):
            client.create_table("db.orders", columns, key, buckets, ignore_if_exists=True)
    assert client.list_tables() == [table]


def test_drop_if_exists_says_whether_it_dropped(client, table):
    assert client.drop_table("db.orders", ignore_if_not_exists=True) is True
    assert client.drop_table("db.orders", ignore_if_not_exists=True) is False
    with pytest.raises(errors.TableNotExistError):
        client.drop_table("db.orders")


def test_expiry_within_the_check_interval(client, table):
    started = time.monotonic()
    result = client.acquire_lease("short", {TableBucket(table.table_id, 0): 1}, 600)
    alive = [lease.lease_id for lease in client.list_leases()]
    if time.monotonic() - started < 0.5:  # read before the deadline: the lease must still be there
        assert alive == ["short"]
    wait_until(lambda: client.list_leases() == [], 5, "the lease expired", interval_s=0.02)
    # gone no earlier than its expiration time, and within 600 ms + the 100 ms check
    # interval + slack for a loaded machine
    assert time.time() * 1000 >= result.expiration_time
    assert time.monotonic() - started < 0.6 + 0.1 + 1.5


def test_metrics_endpoint(client, pair, table):
    active, _ = pair
    client.acquire_lease("m1", {TableBucket(table.table_id, 0): 1}, 60_000)
    client.acquire_lease("m2", {TableBucket(table.table_id, 0): 1, TableBucket(table.table_id, 1): 1}, 60_000)

    def scraped() -> dict[str, float]:
        body = urllib.request.urlopen(f"http://127.0.0.1:{active.metrics_port}/metrics", timeout=5).read().decode()
        return {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines()
                if line and not line.startswith("#")}
    # gauges refresh on the expiry tick (100 ms here)
    values = wait_until(lambda: (v := scraped()).get("kvlease_leases") == 2 and v, 5, "the gauges refreshed")
    assert values["kvlease_leases"] == 2
    assert values["kvlease_leased_snapshots"] == 2
    assert values[f'kvlease_table_leases{{table_id="{table.table_id}"}}'] == 2
    assert values[f'kvlease_table_leased_snapshots{{table_id="{table.table_id}"}}'] == 2
    assert values["kvlease_coordinator_active"] == 1
    assert "kvlease_event_loop_queue_depth" in values
    assert "kvlease_leases_expired_total" in values
    assert "kvlease_coordinator_failovers_total" in values


def test_standby_takes_over_when_active_stops(pair, client, table):
    active, standby = pair
    client.acquire_lease("survivor", {TableBucket(table.table_id, 0): 1}, 60_000)
    active.stop()
    assert standby.wait_active(15)
    assert client.describe_lease("survivor").buckets == {TableBucket(table.table_id, 0): 1}
    assert standby.epoch > 1


# -- forged commits: refused, nothing changed, the coordinator serves on ---------------------------------

def test_commit_naming_a_file_outside_its_bucket_is_refused(client, pair, table):
    active, _ = pair
    lease = client.acquire_lease("victim", {TableBucket(table.table_id, 0): 1}, 600_000)
    assert lease.acquired
    victim = active.storage.list("lease/kv-snapshot")[0]
    tb = TableBucket(table.table_id, 1)
    for path in (victim, f"kv/{table.table_id}/1/../../../{victim}", f"/{victim}",
                 f"kv/{table.table_id}/0/snap-1/_METADATA"):  # another bucket's file
        forged = SnapshotHandle(tb, 2, 20, f"kv/{table.table_id}/1/snap-2/_METADATA", (SnapshotFile(path, 1),))
        write_manifest(active.storage, forged)
        with pytest.raises(errors.InvalidSnapshotError, match="must lie under its bucket's directory"):
            client.commit_kv_snapshot(forged)
    forged = SnapshotHandle(tb, 2, 20, victim)  # the manifest path itself
    with pytest.raises(errors.InvalidSnapshotError, match=victim):
        client.commit_kv_snapshot(forged)
    # nothing changed: the lease file is there, bucket 1 still has only snapshot 1, new commits work
    assert active.storage.exists(victim)
    assert [s.handle.snapshot_id for s in client.list_kv_snapshots(table.table_id) if s.bucket == tb] == [1]
    client.commit_kv_snapshot(snapshot(active.storage, tb, 2, 20))
    assert active.is_active


def test_commit_without_a_matching_manifest_is_refused(client, pair, table):
    active, _ = pair
    tb = TableBucket(table.table_id, 0)
    huge = 10 ** 15
    with pytest.raises(errors.InvalidSnapshotError, match="does not exist"):  # no manifest at all
        client.commit_kv_snapshot(SnapshotHandle(tb, huge, 10, f"kv/{table.table_id}/0/snap-{huge}/_METADATA"))
    with pytest.raises(errors.InvalidSnapshotError, match="not its own"):  # another snapshot's manifest
        client.commit_kv_snapshot(SnapshotHandle(tb, huge, 10, f"kv/{table.table_id}/0/snap-1/_METADATA"))
    snapshot(active.storage, tb, 5, 50)
    with pytest.raises(errors.InvalidSnapshotError, match="log offset 10000 differs"):
        client.commit_kv_snapshot(SnapshotHandle(tb, 5, 10_000, f"kv/{table.table_id}/0/snap-5/_METADATA"))
    with pytest.raises(errors.InvalidSnapshotError, match="files differ"):
        client.commit_kv_snapshot(SnapshotHandle(tb, 5, 50, f"kv/{table.table_id}/0/snap-5/_METADATA",
                                                 (SnapshotFile(f"kv/{table.table_id}/0/shared/x.sst", 3),)))
    assert client.get_latest_kv_snapshots(table.table_id)[tb].snapshot_id == 1
    client.commit_kv_snapshot(SnapshotHandle(tb, 5, 50, f"kv/{table.table_id}/0/snap-5/_METADATA"))
    client.commit_kv_snapshot(snapshot(active.storage, tb, 6, 60))  # later real snapshots are not "older"
    assert client.get_latest_kv_snapshots(table.table_id)[tb].handle.snapshot_id == 6


@contextlib.contextmanager
def restarted_without_lease_file(config, setup):
    """A coordinator runs ``setup(admin, storage, tb)`` on table db.t (1 bucket, snapshot 1 committed,
    lease "lost" holding it) and stops; the "lost" lease's file is deleted; yields a second
    coordinator started on the same cluster, and ``tb``."""
    first = CoordinatorServer(config).start()
    try:
        assert first.wait_active(15)
        with AdminClient([first.address], retry_total_s=10) as admin:
            t = admin.create_table("db.t", [Column("id", "BIGINT")], ["id"], 1)
            tb = TableBucket(t.table_id, 0)
            admin.commit_kv_snapshot(snapshot(first.storage, tb, 1, 10))
            admin.acquire_lease("lost", {tb: 1}, 600_000)
            setup(admin, first.storage, tb)
            (lost,) = json.loads(first.zk.get(zkpaths.lease("lost"))[0])["tables"]  # its own file: alone in its batch
            lost_file = lost["metadata_path"]
    finally:
        first.stop()
    first.storage.delete(lost_file)
    second = CoordinatorServer(config).start()
    try:
        yield second, tb
    finally:
        second.stop()


def test_a_coordinator_starts_and_serves_with_a_lease_file_deleted(make_config):
    """Reinitialization through the standby's lease mirror: the lease whose file is gone is left
    out (logged, kvlease_lease_files_unreadable), its node is kept, the other leases serve."""
    config = make_config({"metrics.port": 0, "client.retry.total-timeout": "10s"})
    keep = lambda admin, storage, tb: admin.acquire_lease("kept", {tb: 1}, 600_000)  # noqa: E731
    with restarted_without_lease_file(config, keep) as (second, tb):
        assert second.wait_active(15), "the coordinator must not crash-loop on a missing lease file"
        assert second.reinit_stats["unreadable_leases"] == ["lost"]
        with AdminClient([second.address], retry_total_s=10) as admin:
            assert [lease.lease_id for lease in admin.list_leases()] == ["kept"]
            assert admin.describe_lease("kept").buckets == {tb: 1}
            admin.acquire_lease("new", {tb: 1}, 60_000)
        with urllib.request.urlopen(f"http://127.0.0.1:{second.metrics_port}/metrics", timeout=5) as response:
            assert "kvlease_lease_files_unreadable 1.0" in response.read().decode()
        assert second.zk.exists(zkpaths.lease("lost"))
        epoch = second.epoch
        time.sleep(0.5)  # a negative check: a crash or an election loop would show by now
        assert second.is_active and second.epoch == epoch  # no step-down, no election loop


def test_snapshots_an_unreadable_lease_may_hold_are_not_reclaimed(make_config):
    """Which snapshots a lease with a missing file holds is unknown: none of its tables' snapshots
    are reclaimed (at takeover or on later commits) until the lease is acquired again."""
    config = make_config({"client.retry.total-timeout": "10s"})  # 2 snapshots retained per bucket

    def newer_snapshots(admin, storage, tb):  # snapshot 1 is now neither retained nor (known to be) leased
        for sid in (2, 3):
            admin.commit_kv_snapshot(snapshot(storage, tb, sid, 10 * sid))

    with restarted_without_lease_file(config, newer_snapshots) as (second, tb):
        assert second.wait_active(15)
        with AdminClient([second.address], retry_total_s=10) as admin:
            stored = lambda: sorted(s.snapshot_id for s in admin.list_kv_snapshots(tb.table_id))  # noqa: E731
            assert stored() == [1, 2, 3]
            admin.commit_kv_snapshot(snapshot(second.storage, tb, 4, 40))
            assert stored() == [1, 2, 3, 4]
            admin.acquire_lease("lost", {tb: 4}, 600_000)  # replaces it: its holdings are known again
            admin.commit_kv_snapshot(snapshot(second.storage, tb, 5, 50))
            assert stored() == [4, 5]


def test_a_table_definition_over_the_zookeeper_limit_is_refused_and_the_coordinator_stays(client, pair, table):
    active, _ = pair
    epoch = active.epoch
    columns = [Column(f"c{i:05d}_" + "x" * 110, "STRING") for i in range(9_000)]  # ~1.3 MB of schema
    with pytest.raises(errors.InvalidRequestError, match=r"table definition is [\d,]+ bytes, over the "
                                                         r"1,000,000-byte limit of a ZooKeeper write") as raised:
        client.create_table("db.huge", [Column("id", "BIGINT"), *columns], ["id"], 1)
    assert raised.value.code == errors.ErrorCode.INVALID_REQUEST
    time.sleep(0.5)  # a dropped ZooKeeper connection would show as a step-down by now
    assert active.is_active and active.epoch == epoch
    assert [t.name for t in client.list_tables("db")] == ["orders"]
    client.create_table("db.small", [Column("id", "BIGINT")], ["id"], 1)  # it serves on
    assert active.is_active and active.epoch == epoch


def test_a_snapshot_handle_over_the_zookeeper_limit_is_refused_and_the_coordinator_stays(client, pair, table):
    active, _ = pair
    epoch = active.epoch
    tb = TableBucket(table.table_id, 0)
    files = [SnapshotFile(f"kv/{table.table_id}/0/shared/{i:06d}-" + "y" * 100 + ".sst", 1) for i in range(9_000)]
    with pytest.raises(errors.InvalidRequestError, match="over the 1,000,000-byte limit of a ZooKeeper write"):
        client.commit_kv_snapshot(snapshot(active.storage, tb, 2, 20, files))
    time.sleep(0.5)  # a dropped ZooKeeper connection would show as a step-down by now
    assert active.is_active and active.epoch == epoch
    client.commit_kv_snapshot(snapshot(active.storage, tb, 3, 30))
    assert client.get_latest_kv_snapshots(table.table_id)[tb].snapshot_id == 3
