"""Streaming reads through the kvlease Spark source on real Spark: bootstrap then tail, leases that live
exactly as long as the bootstrap, restarts from the checkpoint, read limits."""

from __future__ import annotations

import json
import threading
import time

import pytest

from kvlease.client.table import TableClient
from kvlease.ops.wait import wait_until
from tests.support.spark_tables import ALL_TYPES, row, seed, spark_row
from tests.support.local_cluster import LocalCluster

NAMES = [c.name for c in ALL_TYPES]


@pytest.fixture
def kv(make_config, tmp_path):
    """A cluster keeping one snapshot per bucket: an unleased snapshot is deleted by the next one."""
    one_kept = lambda overrides=None, /, **more: make_config(
        {"kv.snapshot.num-retained": 1, "kv.snapshot.lease.expiration-check-interval": "200ms",
         **(overrides or {})}, **more)
    cluster = LocalCluster(one_kept, tmp_path, 2)
    try:
        yield cluster
    finally:
        cluster.close()


class Collector:
    """A foreachBatch sink (runs in this process): the rows of every micro-batch, by batch id."""

    def __init__(self, before=None) -> None:
        self.batches: dict[int, list[dict]] = {}
        self.before = before
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        if self.before is not None:
            self.before(batch_id)
        rows = [r.asDict() for r in df.collect()]
        with self.lock:
            self.batches[batch_id] = rows

    def rows(self) -> list[dict]:
        return [r for _, rows in sorted(self.batches.items()) for r in rows]


def run(spark, kv, checkpoint, sink, *, table="shop.orders", timeout_s=120, **options):
    reader = spark.readStream.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table)
    for key, value in options.items():
        reader = reader.option(key.replace("_", ".") if key != "maxRowsPerTrigger" else key, value)
    query = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)) \
        .trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(timeout_s), "the query did not finish"
    finally:
        query.stop()
    return query


def apply_changes(rows: list[dict]) -> dict:
    """The table the change rows describe, applied in (_bucket, _log_offset) order."""
    state = {}
    for r in sorted(rows, key=lambda r: (r["_bucket"], r["_log_offset"])):
        if r["_change_type"] in ("insert", "update_postimage"):
            state[r["id"]] = spark_row({n: r[n] for n in NAMES})
        elif r["_change_type"] == "delete":
            state.pop(r["id"], None)
    return state


def current(kv, ids) -> dict:
    with TableClient(kv.admin, "shop.orders") as client:
        return {r["id"]: r for r in client.lookup(list(ids)) if r is not None}


def lease_in_checkpoint(checkpoint) -> str:
    lines = (checkpoint / "offsets" / "0").read_text().splitlines()
    return json.loads(lines[-1])["lease"]


def test_bootstrap_then_tail_reproduces_the_table_and_leaves_no_lease(spark, kv, tmp_path):
    seed(kv, 4, 300)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(0, 300, 4)])
        client.delete([7, 8])
    sink = Collector()
    checkpoint = tmp_path / "ck"

    run(spark, kv, checkpoint, sink)
    assert apply_changes(sink.rows()) == current(kv, range(300))
    assert {r["_change_type"] for r in sink.batches[0]} <= {"insert", "update_preimage", "update_postimage",
                                                             "delete"}
    lease = lease_in_checkpoint(checkpoint)
    wait_until(lambda: kv.admin.list_leases() == [], 30, f"lease {lease} released after the bootstrap committed")

    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 2) for i in range(250, 350)])  # updates and inserts
        client.delete(list(range(0, 40, 3)))
        client.trigger_snapshot()
    run(spark, kv, checkpoint, sink)

    tail = [r for b, rows in sink.batches.items() if b > 0 for r in rows]
    assert tail and {r["_change_type"] for r in tail} == {"insert", "update_preimage", "update_postimage", "delete"}
    assert all(r["_commit_timestamp"] is not None for r in tail)
    assert apply_changes(sink.rows()) == current(kv, range(350))
    assert kv.admin.list_leases() == []


def test_a_slow_bootstrap_keeps_its_lease_and_snapshot(spark, kv, tmp_path):
    seed(kv, 2, 100)
    seen = {}

    def slow(batch_id):
        if batch_id == 0:
            (lease,) = kv.admin.list_leases()
            seen["first"] = lease.expiration_time
            with TableClient(kv.admin, "shop.orders") as client:  # newer snapshots would subsume an unleased one
                client.upsert([row(i, 1) for i in range(100)])
                client.trigger_snapshot()
            time.sleep(4.5)  # one and a half lease durations
            (lease,) = kv.admin.list_leases()
            seen["later"] = lease.expiration_time

    sink = Collector(before=slow)
    run(spark, kv, tmp_path / "ck", sink, lease_duration="3s")

    assert seen["later"] > seen["first"]  # renewed while the bootstrap ran
    # the bootstrap read its snapshot after newer ones were committed: the state at the planned offsets
    assert apply_changes(sink.rows()) == {i: spark_row(row(i)) for i in range(100)}


class Crash(Exception):
    pass


def crash_mid_bootstrap(spark, kv, checkpoint, **options) -> None:
    """Run a query that dies in its bootstrap micro-batch (its end offset logged, its lease held)."""
    def crash(batch_id):
        raise Crash("killed mid-bootstrap")

    with pytest.raises(Exception, match="killed mid-bootstrap"):
        run(spark, kv, checkpoint, Collector(before=crash), **options)


def test_a_query_killed_mid_bootstrap_restarts_on_the_same_lease_without_duplicates_or_gaps(spark, kv, tmp_path):
    seed(kv, 3, 200)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(0, 200, 5)])
    checkpoint = tmp_path / "ck"

    crash_mid_bootstrap(spark, kv, checkpoint)
    lease = lease_in_checkpoint(checkpoint)
    assert [l.lease_id for l in kv.admin.list_leases()] == [lease]

    leases_during_restart = []
    sink = Collector(before=lambda b: leases_during_restart.append([l.lease_id for l in kv.admin.list_leases()]))
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 2) for i in range(190, 210)])
    run(spark, kv, checkpoint, sink)

    assert leases_during_restart[0] == [lease]  # the restarted bootstrap holds the one lease from the checkpoint
    rows = sink.rows()
    bootstrap_keys = [r["id"] for r in sink.batches[0]]
    assert len(bootstrap_keys) == len(set(bootstrap_keys))  # no duplicate
    assert apply_changes(rows) == current(kv, range(210))  # no gap
    wait_until(lambda: kv.admin.list_leases() == [], 30, "the lease released once the bootstrap committed")


def test_a_restart_after_the_lease_expired_and_the_snapshot_was_reclaimed_fails_naming_the_lease(spark, kv, tmp_path):
    seed(kv, 2, 50)
    checkpoint = tmp_path / "ck"

    crash_mid_bootstrap(spark, kv, checkpoint, lease_duration="1s")
    lease = lease_in_checkpoint(checkpoint)
    wait_until(lambda: kv.admin.list_leases() == [], 30, f"lease {lease} expired")
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(50)])
        client.trigger_snapshot()  # the expired lease's snapshots are subsumed and deleted

    with pytest.raises(Exception) as info:
        run(spark, kv, checkpoint, Collector(), lease_duration="1s")
    assert f"lease {lease}" in str(info.value) and "reclaimed" in str(info.value)
    assert kv.admin.list_leases() == []


def test_a_checkpoint_of_a_table_dropped_and_created_again_is_refused(spark, kv, tmp_path):
    """Its offsets are positions in the old table's changelogs: reading the new table from them would skip
    rows. (A QA walkthrough found exactly that: 6 of 20 new rows arrived, with no error.)"""
    seed(kv, 2, 20)
    checkpoint = tmp_path / "ck"
    run(spark, kv, checkpoint, Collector())
    old_id = kv.admin.get_table("shop.orders").table_id
    kv.admin.drop_table("shop.orders")
    seed(kv, 2, 20)
    new_id = kv.admin.get_table("shop.orders").table_id
    sink = Collector()

    with pytest.raises(Exception) as info:
        run(spark, kv, checkpoint, sink)
    assert (f"checkpoint was written for table id {old_id}, but table shop.orders is now table id {new_id}"
            in str(info.value))
    assert sink.rows() == [] and kv.admin.list_leases() == []


def test_max_rows_per_trigger_bounds_every_tail_batch(spark, kv, tmp_path):
    seed(kv, 2, 20)
    sink = Collector()
    checkpoint = tmp_path / "ck"
    run(spark, kv, checkpoint, sink, maxRowsPerTrigger=30)
    with TableClient(kv.admin, "shop.orders") as client:
        for i in range(20, 120, 10):
            client.upsert([row(j) for j in range(i, i + 10)])
    run(spark, kv, checkpoint, sink, maxRowsPerTrigger=30)

    tail = {b: rows for b, rows in sink.batches.items() if b > 0}
    assert sum(1 for rows in tail.values() if rows) >= 4 and all(len(rows) <= 30 for rows in tail.values())
    assert sum(len(rows) for rows in tail.values()) == 100
    assert apply_changes(sink.rows()) == current(kv, range(120))


@pytest.mark.parametrize("mode", ["earliest", "latest"])
def test_startup_modes_without_a_bootstrap(spark, kv, tmp_path, mode):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(30)])
    sink = Collector()
    checkpoint = tmp_path / "ck"
    run(spark, kv, checkpoint, sink, startup_mode=mode)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(25, 40)])
    run(spark, kv, checkpoint, sink, startup_mode=mode)

    ids = {r["id"] for r in sink.rows()}
    assert ids == (set(range(40)) if mode == "earliest" else set(range(25, 40)))
    assert all(r["_change_type"] != "insert" or r["_log_offset"] >= 0 for r in sink.rows())
    assert kv.admin.list_leases() == []


def test_a_streaming_live_bootstrap_is_refused(spark, kv, tmp_path):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with pytest.raises(Exception, match="bootstrap.mode'=live is for batch reads only"):
        run(spark, kv, tmp_path / "ck", Collector(), bootstrap_mode="live")


def test_a_stream_from_a_time_in_the_future_is_refused(spark, kv, tmp_path):
    """Starting at the end would read the changes appended until then, which are before that time."""
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with pytest.raises(Exception, match=r"option 'startup.timestamp': 2099-01-01T00:00:00.000\+00:00 is in the "
                                        r"future; a stream starts at a time that has passed"):
        run(spark, kv, tmp_path / "ck", Collector(), startup_mode="timestamp",
            startup_timestamp="2099-01-01T00:00:00Z")
    past = int(time.time() * 1000) - 1
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(5)])
    sink = Collector()
    run(spark, kv, tmp_path / "ck2", sink, startup_mode="timestamp", startup_timestamp=str(past))
    assert sorted(r["id"] for r in sink.rows()) == list(range(5))


def test_a_lease_id_names_one_reader_at_a_time(spark, kv, tmp_path):
    """A batch read given the lease.id of a streaming bootstrap under way took over its lease, moved it to
    newer snapshots and released it: the bootstrap's snapshots were deleted under it."""
    seed(kv, 2, 50)
    checkpoint = tmp_path / "ck"

    crash_mid_bootstrap(spark, kv, checkpoint, lease_id="shared")
    held = kv.admin.describe_lease("shared").buckets
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(50)])
        client.trigger_snapshot()  # newer snapshots, which a second reader would lease

    owner = kv.admin.describe_lease("shared").owner  # the query's, kept in its checkpoint's offsets
    assert owner
    refused = rf"option 'lease.id': lease 'shared' belongs to the reader with owner token '{owner}'"
    batch = spark.read.format("kvlease").option("bootstrap", kv.coordinator.address) \
        .option("table", "shop.orders").option("lease.id", "shared").load()
    with pytest.raises(Exception, match=refused):
        batch.collect()
    with pytest.raises(Exception, match=refused):
        run(spark, kv, tmp_path / "another", Collector(), lease_id="shared")
    assert kv.admin.describe_lease("shared").buckets == held

    sink = Collector()  # the stream itself, restarted from its checkpoint, keeps its lease
    run(spark, kv, checkpoint, sink, lease_id="shared")
    assert {r["id"]: r for r in sink.batches[0]}.keys() == set(range(50))
    assert apply_changes(sink.rows()) == current(kv, range(50))
    wait_until(lambda: kv.admin.list_leases() == [], 30, "the lease released once the bootstrap committed")
