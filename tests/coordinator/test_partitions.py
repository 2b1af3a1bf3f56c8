"""Partitioned tables on real coordinators (ZooKeeper, gRPC on loopback), no tablet servers: DDL, ids, the
partition cap, auto-partitioning, retention that never drops what a lease holds (docs/partitions.md) and the
per-partition lease gauges (docs/operations.md).

The coordinators share a clock the tests move: auto-partition checks run every 100 ms of real time, and
"days" pass when a test says so.
"""

from __future__ import annotations

import threading
import urllib.request
from datetime import datetime, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.common.auto_partition import AutoPartition, TimeUnit
from kvlease.common.model import TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.support import coordinators
from tests.support.snapshot_manifests import commit_snapshot

pytestmark = pytest.mark.zk

DAY_MS = 86_400_000
COLUMNS = [Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "STRING")]


class Clock:
    """Milliseconds since the epoch, moved by the test (thread-safe)."""

    def __init__(self, at: datetime) -> None:
        self._ms = int(at.timestamp() * 1000)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._ms

    def advance(self, ms: int) -> None:
        with self._lock:
            self._ms += ms


@pytest.fixture
def clock():
    return Clock(datetime(2026, 11, 27, 12, tzinfo=timezone.utc))


@pytest.fixture
def pair(make_config, clock):
    config = make_config({"metrics.port": 0, "kv.snapshot.lease.expiration-check-interval": "100ms",
                          "auto-partition.check-interval": "100ms", "client.retry.total-timeout": "15s"})
    with coordinators.pair(config, clock_ms=clock) as servers:
        yield servers


@pytest.fixture
def admin(pair):
    with AdminClient([s.address for s in pair], retry_total_s=15) as client:
        yield client


def names(admin, path="db.orders"):
    return [p.name for p in admin.list_partitions(path)[1]]


def daily(admin, precreate=2, retention=1, path="db.orders"):
    return admin.create_table(path, COLUMNS, ["day", "id"], 2, partition_key=["day"],
                              auto_partition=AutoPartition(TimeUnit.DAY, precreate, retention))


def test_a_partitioned_table_is_made_and_its_partitions_added_listed_and_dropped(admin):
    table = admin.create_table("db.orders", COLUMNS, ["day", "id"], 2, partition_key=["day"])
    assert table.partition_key == ("day",) and table.max_partitions == 1000 and table.auto_partition is None
    assert names(admin) == []
    _table, made = admin.create_partition("db.orders", "2026-11-27")
    assert made.name == "2026-11-27" and made.partition_id > table.table_id
    again = admin.create_partition("db.orders", "2026-11-27", ignore_if_exists=True)[1]  # a writer's retry
    assert again.partition_id == made.partition_id
    with pytest.raises(errors.PartitionAlreadyExistsError):
        admin.create_partition("db.orders", "2026-11-27")
    admin.create_partition("db.orders", "2026-11-28")
    assert names(admin) == ["2026-11-27", "2026-11-28"]
    leaders = admin.get_table_assignment(table.table_id, made.partition_id)[1]
    assert sorted(leaders) == [0, 1]
    with pytest.raises(errors.PartitionNotExistsError):  # a partitioned table's buckets are its partitions'
        admin.get_table_assignment(table.table_id)
    _table, every = admin.partition_assignments(table.table_id)
    assert sorted(every) == sorted(p.partition_id for p in admin.list_partitions("db.orders")[1])
    assert all(sorted(buckets) == [0, 1] for buckets in every.values())
    assert admin.drop_partition("db.orders", "2026-11-27")
    assert names(admin) == ["2026-11-28"]
    assert not admin.drop_partition("db.orders", "2026-11-27", ignore_if_not_exists=True)  # a retried drop
    with pytest.raises(errors.PartitionNotExistsError):
        admin.drop_partition("db.orders", "2026-11-27")
    with pytest.raises(errors.PartitionNotExistsError):
        admin.get_table_assignment(table.table_id, made.partition_id)


@pytest.mark.parametrize("kwargs, message", [
    ({"primary_key": ["id"], "partition_key": ["day"]}, "primary key"),
    ({"primary_key": ["day"], "partition_key": ["day"]}, "primary key"),
    ({"primary_key": ["day", "id"], "partition_key": ["nope"]}, "nope"),
    ({"primary_key": ["day", "id"], "partition_key": ["day"], "max_partitions": 0}, "table.partition.max"),
    ({"primary_key": ["day", "id"], "partition_key": ["id"],
      "auto_partition": AutoPartition(TimeUnit.DAY, 2, 7)}, "STRING"),
])
def test_bad_partitioned_table_definitions_are_refused_with_one_line(admin, kwargs, message):
    primary_key = kwargs.pop("primary_key")
    with pytest.raises(errors.InvalidTableError) as refused:
        admin.create_table("db.bad", COLUMNS, primary_key, 1, **kwargs)
    assert message in refused.value.message and "\n" not in refused.value.message
    assert "db.bad" not in [t.path for t in admin.list_tables()]


def test_bad_partition_names_and_partitions_of_unpartitioned_tables_are_refused(admin):
    admin.create_table("db.orders", COLUMNS, ["day", "id"], 1, partition_key=["day"])
    admin.create_table("db.flat", COLUMNS, ["id"], 1)
    for bad in ("a b", "x/y", ".", "é", "a" * 65):
        with pytest.raises(errors.InvalidRequestError):
            admin.create_partition("db.orders", bad)
    with pytest.raises(errors.InvalidRequestError) as refused:
        admin.create_partition("db.flat", "20261127")
    assert "not partitioned" in refused.value.message
    assert names(admin) == []


def test_partition_ids_are_never_reused_also_across_a_table_dropped_and_made_again(admin):
    admin.create_table("db.orders", COLUMNS, ["day", "id"], 1, partition_key=["day"])
    first = admin.create_partition("db.orders", "a")[1].partition_id
    admin.drop_partition("db.orders", "a")
    second = admin.create_partition("db.orders", "a")[1].partition_id
    assert second > first
    admin.drop_table("db.orders")
    table = admin.create_table("db.orders", COLUMNS, ["day", "id"], 1, partition_key=["day"])
    third = admin.create_partition("db.orders", "a")[1].partition_id
    assert table.table_id > second and third > table.table_id


def test_the_partition_cap_refuses_one_more_with_a_clear_error(admin):
    admin.create_table("db.orders", COLUMNS, ["day", "id"], 1, partition_key=["day"], max_partitions=2)
    admin.create_partition("db.orders", "a")
    admin.create_partition("db.orders", "b")
    with pytest.raises(errors.TooManyPartitionsError) as refused:
        admin.create_partition("db.orders", "c")
    assert "table.partition.max 2" in refused.value.message
    admin.alter_table("db.orders", max_partitions=3)
    admin.create_partition("db.orders", "c")
    assert names(admin) == ["a", "b", "c"]


def test_auto_partitioning_makes_partitions_ahead_and_drops_those_past_retention(admin, clock):
    daily(admin, precreate=2, retention=1)
    assert names(admin) == ["20261127", "20261128"]  # made with the table, not at the next check
    with pytest.raises(errors.InvalidRequestError):  # an auto-partitioned table's values are its unit's
        admin.create_partition("db.orders", "2026-11-29")
    clock.advance(2 * DAY_MS)  # 2026-11-29: keeps one day back (20261128), makes 20261129 and 20261130
    wait_until(lambda: names(admin) == ["20261128", "20261129", "20261130"], 10, "the check")
    admin.alter_table("db.orders", precreate=3, retention=0)
    assert names(admin) == ["20261129", "20261130", "20261201"]  # applied at once


def held_partition(admin, clock, lease_ms=6 * DAY_MS):
    """A daily table whose partition 20261127 a lease holds a snapshot of, then three days on: past
    retention (1). Returns (the partition's bucket, its id)."""
    table = daily(admin, precreate=2, retention=1)
    old, _next = admin.list_partitions("db.orders")[1]
    tb = TableBucket(table.table_id, 0, old.partition_id)
    commit_snapshot(admin, tb, 1, 10)
    assert not admin.acquire_lease("reader", {tb: 1}, lease_ms).unavailable
    clock.advance(3 * DAY_MS)
    wait_until(lambda: "20261130" in names(admin), 10, "the check after three days")
    return tb, old.partition_id


def test_a_partition_past_retention_that_a_lease_holds_is_kept_until_the_release(admin, clock):
    tb, partition_id = held_partition(admin, clock)
    (kept,) = [p for p in admin.list_partitions("db.orders")[1] if p.partition_id == partition_id]
    assert kept.held_by == ("reader",) and "20261128" not in names(admin)  # its unleased neighbour went
    assert admin.describe_lease("reader").buckets == {tb: 1}
    admin.release_lease("reader", [tb])
    wait_until(lambda: "20261127" not in names(admin), 10, "the drop after the release")
    assert admin.list_kv_snapshots(tb.table_id) == []


def test_a_partition_past_retention_is_dropped_when_the_lease_holding_it_expires(admin, clock):
    _tb, _partition_id = held_partition(admin, clock, lease_ms=4 * DAY_MS)
    assert "20261127" in names(admin)
    clock.advance(DAY_MS + 1)  # past the lease's deadline
    wait_until(lambda: "20261127" not in names(admin), 10, "the drop after the expiry")


def test_a_coordinator_failover_between_the_hold_and_the_release_still_drops_it(admin, clock, pair):
    tb, _partition_id = held_partition(admin, clock)
    active = next(s for s in pair if s.is_active)
    active.stop()
    standby = next(s for s in pair if s is not active)
    wait_until(lambda: standby.is_active, 20, "the standby to take over")
    assert "20261127" in names(admin)  # the new term's first check finds it held, and keeps it
    admin.release_lease("reader", [tb])
    wait_until(lambda: "20261127" not in names(admin), 10, "the drop after the release")


def test_dropping_a_partition_by_hand_takes_it_out_of_every_lease(admin):
    table = admin.create_table("db.orders", COLUMNS, ["day", "id"], 1, partition_key=["day"])
    a = admin.create_partition("db.orders", "a")[1]
    b = admin.create_partition("db.orders", "b")[1]
    tb_a, tb_b = TableBucket(table.table_id, 0, a.partition_id), TableBucket(table.table_id, 0, b.partition_id)
    commit_snapshot(admin, tb_a, 1, 5)
    commit_snapshot(admin, tb_b, 1, 5)
    admin.acquire_lease("reader", {tb_a: 1, tb_b: 1}, 60_000)
    admin.drop_partition("db.orders", "a")
    assert admin.describe_lease("reader").buckets == {tb_b: 1}  # partition b untouched
    assert [i.bucket for i in admin.list_kv_snapshots(table.table_id)] == [tb_b]
    with pytest.raises(errors.PartitionNotExistsError):
        admin.acquire_lease("reader", {tb_a: 1}, 60_000)


def test_a_create_naming_an_unknown_time_unit_or_zone_is_refused_by_the_coordinator(admin):
    """What a client that skips the checks sends: the coordinator answers one line, nothing is made."""
    for auto, message in ((pb.AutoPartitionPb(time_unit="WEEK"), "WEEK"),
                          (pb.AutoPartitionPb(time_unit="DAY", time_zone="Mars/Olympus"), "Mars/Olympus")):
        request = pb.CreateTableRequest(database="db", name="bad", columns=[pb.ColumnPb(name=c.name, type=c.type)
                                        for c in COLUMNS], primary_key=["day", "id"], buckets=1,
                                        partition_key=["day"], auto_partition=auto)
        with pytest.raises(errors.InvalidTableError) as refused:
            admin.caller.call("CreateTable", request)
        assert message in refused.value.message and "\n" not in refused.value.message
    assert admin.list_tables() == []


def samples(pair, *prefixes: str) -> list:
    """The active coordinator's samples whose names start with one of ``prefixes``."""
    active = next(s for s in pair if s.is_active)
    with urllib.request.urlopen(f"http://127.0.0.1:{active.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith(prefixes)]


def lease_samples(pair) -> list:
    """The per-partition and per-table lease gauges' samples."""
    return samples(pair, "kvlease_partition_", "kvlease_table_")


def lease_series(pair) -> dict[tuple[str, str], float]:
    """(sample name, partition name or table id) -> value."""
    return {(s.name, s.labels.get("partition", s.labels.get("table_id"))): s.value for s in lease_samples(pair)}


def test_the_lease_gauges_count_per_partition_and_a_dropped_partition_loses_its_series(admin, pair):
    table = admin.create_table("db.orders", COLUMNS, ["day", "id"], 2, partition_key=["day"])
    a, b = (admin.create_partition("db.orders", name)[1] for name in ("20261127", "20261128"))
    a0, a1, b0 = (TableBucket(table.table_id, n, p.partition_id) for p, n in ((a, 0), (a, 1), (b, 0)))
    for tb in (a0, a1, b0):
        commit_snapshot(admin, tb, 1, 5)
    admin.acquire_lease("r1", {a0: 1, b0: 1}, 60_000)
    admin.acquire_lease("r2", {a0: 1, a1: 1}, 60_000)
    t = str(table.table_id)
    expected = {("kvlease_partition_leases", "20261127"): 2, ("kvlease_partition_leased_snapshots", "20261127"): 2,
                ("kvlease_partition_leases", "20261128"): 1, ("kvlease_partition_leased_snapshots", "20261128"): 1,
                ("kvlease_table_leases", t): 2, ("kvlease_table_leased_snapshots", t): 3}
    wait_until(lambda: lease_series(pair) == expected, 10, "the gauges of both partitions")
    labels = [s.labels for s in lease_samples(pair) if s.name == "kvlease_partition_leases"]
    assert sorted(labels, key=lambda row: row["partition"]) == [
        {"table_id": t, "partition_id": str(a.partition_id), "partition": "20261127"},
        {"table_id": t, "partition_id": str(b.partition_id), "partition": "20261128"}]
    admin.acquire_lease("r3", {b0: 1}, 60_000)  # a count published already changes: it is published again
    more = {**expected, ("kvlease_partition_leases", "20261128"): 2, ("kvlease_table_leases", t): 3}
    wait_until(lambda: lease_series(pair) == more, 10, "the partition's count going up")
    admin.release_lease("r3", [b0])
    wait_until(lambda: lease_series(pair) == expected, 10, "and down again")
    admin.drop_partition("db.orders", "20261127")  # out of both leases: r2 held nothing else
    expected = {("kvlease_partition_leases", "20261128"): 1, ("kvlease_partition_leased_snapshots", "20261128"): 1,
                ("kvlease_table_leases", t): 1, ("kvlease_table_leased_snapshots", t): 1}
    wait_until(lambda: lease_series(pair) == expected, 10, "the dropped partition's series gone")
    admin.release_lease("r1", [b0])
    wait_until(lambda: lease_series(pair) == {}, 10, "no series once no lease holds a partition")


def test_acquire_latest_leases_what_the_coordinator_holds_latest_and_a_retry_holds_the_same(admin):
    table = admin.create_table("db.orders", COLUMNS, ["day", "id"], 2, partition_key=["day"])
    a, b = (admin.create_partition("db.orders", name)[1] for name in ("20261127", "20261128"))
    a0, a1, b0 = (TableBucket(table.table_id, n, p.partition_id) for p, n in ((a, 0), (a, 1), (b, 0)))
    with pytest.raises(errors.SnapshotNotFoundError, match="table db.orders has no snapshot in any bucket of any "
                                                           "partition yet; nothing to lease"):
        admin.acquire_latest_lease("L0", table.table_id, 60_000)
    for tb, sid in ((a0, 1), (a0, 2), (b0, 1)):  # a1 has none
        commit_snapshot(admin, tb, sid, 5 * sid)
    result = admin.acquire_latest_lease("L1", table.table_id, 60_000, owner="job1")
    assert result.acquired == {a0: 2, b0: 1} and result.unavailable == {}
    assert admin.describe_lease("L1").buckets == {a0: 2, b0: 1}
    again = admin.acquire_latest_lease("L1", table.table_id, 60_000, owner="job1")  # its answer lost: sent again
    assert again.acquired == {a0: 2, b0: 1} and admin.describe_lease("L1").buckets == {a0: 2, b0: 1}
    one = admin.acquire_latest_lease("L2", table.table_id, 60_000, partition_id=a.partition_id)
    assert one.acquired == {a0: 2}
    empty = admin.create_partition("db.orders", "20261129")[1]
    with pytest.raises(errors.SnapshotNotFoundError, match="partition 20261129 has no snapshot in any bucket yet"):
        admin.acquire_latest_lease("L2", table.table_id, 60_000, partition_id=empty.partition_id)
    plain = admin.create_table("db.plain", COLUMNS, ["day", "id"], 1)
    commit_snapshot(admin, TableBucket(plain.table_id, 0), 3, 9)
    assert admin.acquire_latest_lease("L3", plain.table_id, 60_000).acquired == {TableBucket(plain.table_id, 0): 3}
    with pytest.raises(errors.TableNotExistError):
        admin.acquire_latest_lease("L4", 999_999, 60_000)


def test_the_offline_bucket_gauges_name_each_table_and_partition(admin, pair):
    """No tablet server runs: every bucket is offline, counted per table or partition, a dropped partition's
    series gone with it."""
    table = admin.create_table("db.orders", COLUMNS, ["day", "id"], 2, partition_key=["day"])
    a, b = (admin.create_partition("db.orders", name)[1] for name in ("a", "b"))
    flat = admin.create_table("db.flat", COLUMNS, ["id"], 1)

    def offline():
        return {(s.labels["table"], s.labels["partition"], s.labels["partition_id"], s.labels["table_id"]): s.value
                for s in samples(pair, "kvlease_coordinator_table_offline_buckets")}
    t = str(table.table_id)
    expected = {("db.orders", "a", str(a.partition_id), t): 2, ("db.orders", "b", str(b.partition_id), t): 2,
                ("db.flat", "", "", str(flat.table_id)): 1}
    wait_until(lambda: offline() == expected, 10, "the offline buckets of each table and partition")
    assert [s.value for s in samples(pair, "kvlease_coordinator_offline_buckets")] == [5]
    admin.drop_partition("db.orders", "a")
    del expected["db.orders", "a", str(a.partition_id), t]
    wait_until(lambda: offline() == expected, 10, "the dropped partition's series gone")
    assert [s.value for s in samples(pair, "kvlease_coordinator_offline_buckets")] == [3]
    assert samples(pair, "kvlease_coordinator_table_under_replicated_buckets") == []
