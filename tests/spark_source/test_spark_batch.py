"""Batch reads through the kvlease Spark source on real Spark (local[2]) against a real cluster:
the DataFrame equals the table read by lookups, from snapshots plus changelog, or live scans."""

from __future__ import annotations

import json
import time

import pytest

from kvlease.client.table import TableClient
from kvlease.ops.local_cluster import free_ports
from tests.support.spark_tables import ALL_TYPES, kv, row, rows_of, seed  # noqa: F401  (kv is a fixture)


def read(spark, kv, table: str = "shop.orders", **options):
    reader = spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table)
    for key, value in options.items():
        reader = reader.option(key.replace("_", "."), value)
    return reader.load()


def lookups(client: TableClient, ids) -> dict:
    return {r["id"]: r for r in client.lookup(list(ids)) if r is not None}


def test_batch_read_equals_lookups_after_writes_updates_deletes_and_snapshots(spark, kv):
    seed(kv, 4, 400)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(0, 400, 3)])  # updates after the snapshot
        client.delete(list(range(1, 400, 10)))
        client.upsert([row(i) for i in range(400, 450)])  # inserts after the snapshot
        expected = lookups(client, range(450))

    got = rows_of(read(spark, kv))

    assert got == expected
    assert len(got) == 450 - 40
    assert kv.admin.list_leases() == []  # every split released its bucket


def test_batch_read_of_snapshots_on_s3(spark, make_config, s3_overrides, tmp_path):
    from tests.support.local_cluster import LocalCluster

    cluster = LocalCluster(lambda overrides=None, /, **more: make_config({**s3_overrides, **(overrides or {})}, **more),
                           tmp_path, 2)
    try:
        cluster.create_table("shop.orders", ALL_TYPES, ["id"], 3)
        with TableClient(cluster.admin, "shop.orders") as client:
            client.upsert([row(i) for i in range(300)])
            assert client.trigger_snapshot()
            client.upsert([row(i, 2) for i in range(0, 300, 2)])
            client.delete([5, 6, 7])
            expected = lookups(client, range(300))
        assert all(s.handle.metadata_path for s in cluster.admin.list_kv_snapshots(
            cluster.admin.get_table("shop.orders").table_id))

        assert rows_of(read(spark, cluster)) == expected
    finally:
        cluster.close()


def test_live_bootstrap_reads_scans_and_takes_no_lease(spark, kv):
    seed(kv, 4, 200)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(50)])
        client.delete([60, 61])
        expected = lookups(client, range(200))

    df = read(spark, kv, bootstrap_mode="live")

    assert rows_of(df) == expected
    assert kv.admin.list_leases() == []


def test_buckets_without_a_snapshot_are_read_from_the_changelog(spark, kv):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 4)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(0)])
        snapshotted = {s.bucket for s in client.trigger_snapshot()}
        client.upsert([row(i) for i in range(1, 120)])
        client.upsert([row(i, 3) for i in range(0, 120, 5)])
        client.delete([8, 9])
        expected = lookups(client, range(120))
    assert len(snapshotted) == 1  # the other three buckets have no snapshot

    assert rows_of(read(spark, kv)) == expected


def test_projection_and_filters_on_other_columns(spark, kv):
    seed(kv, 2, 100)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(10)])

    df = read(spark, kv).where("qty > 500").select("id", "name")

    got = sorted((r["id"], r["name"]) for r in df.collect())
    expected = sorted((i, row(i, 1 if i < 10 else 0)["name"]) for i in range(100) if i * 10 + (i < 10) > 500)
    assert got == expected
    assert df.columns == ["id", "name"]


def test_primary_key_filters(spark, kv):
    seed(kv, 4, 100)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(42, 5)])

    df = read(spark, kv)
    assert [r["qty"] for r in df.where("id = 42").collect()] == [425]
    assert df.where("id = 42 AND qty = 0").collect() == []  # the filter Spark keeps still applies
    assert sorted(r["id"] for r in df.where("id IN (3, 4, 1000)").collect()) == [3, 4]
    assert df.where("id = 1000").collect() == []
    assert kv.admin.list_leases() == []


def change_feed(spark, kv, table="shop.orders", **options):
    return [r.asDict() for r in read(spark, kv, table, **options).collect()]


def test_change_feed_from_earliest_with_ending_offsets_and_by_time(spark, kv):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with TableClient(kv.admin, "shop.orders") as client:
        first = client.upsert([row(i) for i in range(20)])
        time.sleep(0.05)  # commit times are in ms: the middle is after the first batch's and before the next's
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        client.upsert([row(i, 1) for i in range(5)])
        client.delete([10])
        records = {b: client.fetch_log(b, 0, 1 << 20)[0] for b in range(2)}

    everything = change_feed(spark, kv, startup_mode="earliest")
    assert sorted((r["_bucket"], r["_log_offset"]) for r in everything) == sorted(
        (b, rec["offset"]) for b, recs in records.items() for rec in recs)
    short = {"+I": "insert", "-U": "update_preimage", "+U": "update_postimage", "-D": "delete"}
    by_offset = {(b, rec["offset"]): rec for b, recs in records.items() for rec in recs}
    for r in everything:
        rec = by_offset[(r["_bucket"], r["_log_offset"])]
        assert r["_change_type"] == short[rec["change_type"]] and r["id"] == rec["row"]["id"]
        assert int(r["_commit_timestamp"].timestamp() * 1000) == rec["timestamp"]

    ends = {b: hi for b, (_, hi) in first.items()}
    upto = change_feed(spark, kv, startup_mode="earliest", ending_offsets=json.dumps(ends))
    assert sorted(r["id"] for r in upto) == list(range(20)) and {r["_change_type"] for r in upto} == {"insert"}

    later = change_feed(spark, kv, startup_mode="timestamp", startup_timestamp=str(middle))
    assert sorted((r["id"], r["_change_type"]) for r in later) == sorted(
        [(i, t) for i in range(5) for t in ("update_preimage", "update_postimage")] + [(10, "delete")])
    before = change_feed(spark, kv, startup_mode="earliest", ending_timestamp=str(middle))
    assert sorted(r["id"] for r in before) == list(range(20))


def test_change_feed_split_into_partitions_of_at_most_n_records(spark, kv):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 1)
    with TableClient(kv.admin, "shop.orders") as client:
        for i in range(0, 100, 10):
            client.upsert([row(j) for j in range(i, i + 10)])
    df = read(spark, kv, startup_mode="earliest", **{"split.max-rows": "15"})
    assert df.rdd.getNumPartitions() == 7
    assert sorted(r["_log_offset"] for r in df.collect()) == list(range(100))


def test_a_full_batch_read_carries_the_metadata_of_its_bootstrap(spark, kv):
    seed(kv, 2, 30)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(5)])
        ends = {b: hi for b, (_, hi) in client.list_offsets().items()}
        buckets = {i: b for b, rows, _ in client.split(client.key_batch(list(range(30)))) for i in
                   rows.column("id").to_pylist()}
    rows = read(spark, kv).collect()
    assert {r["_change_type"] for r in rows} == {"insert"}
    assert all(r["_bucket"] == buckets[r["id"]] and r["_log_offset"] == ends[r["_bucket"]] - 1 for r in rows)
    assert all(r["_commit_timestamp"] is None for r in rows)


def test_bad_options_fail_the_query_before_any_job_naming_the_option(spark, kv):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with pytest.raises(Exception, match="unknown option 'colour'"):
        read(spark, kv, colour="red")
    with pytest.raises(Exception, match="option 'lease.duration'"):
        read(spark, kv, lease_duration="forever").collect()
    with pytest.raises(Exception, match="bad table name 'orders'|option 'table'"):
        spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "orders").load()


def test_retry_timeout_bounds_the_wait_for_a_cluster_that_is_not_there(spark):
    """Without it a read of an address where nothing listens waits the client's 60 s before failing."""
    (port,) = free_ports(1)
    started = time.monotonic()
    with pytest.raises(Exception, match=f"cannot reach coordinator 127.0.0.1:{port}"):
        spark.read.format("kvlease").option("bootstrap", f"127.0.0.1:{port}").option("table", "shop.orders") \
            .option("retry.timeout", "2s").load()
    assert time.monotonic() - started < 20


def test_a_change_feed_of_an_empty_range_is_empty_not_an_error(spark, kv):
    """Spark reads one ``InputPartition(None)`` when the plan has no split."""
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(10)])
    assert change_feed(spark, kv, startup_mode="latest") == []
    assert change_feed(spark, kv, startup_mode="timestamp", startup_timestamp="2099-01-01T00:00:00Z") == []
    assert change_feed(spark, kv, startup_mode="earliest", ending_timestamp="0") == []
    assert len(change_feed(spark, kv, startup_mode="earliest")) == 10


def test_a_given_schema_may_name_metadata_columns(spark, kv):
    """A schema the user gives has every column nullable, where the source's own has the metadata not null."""
    seed(kv, 2, 20)
    reader = spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.orders")
    df = reader.schema("id bigint, _log_offset bigint, _change_type string, _bucket int").load()
    rows = df.collect()
    assert sorted(r["id"] for r in rows) == list(range(20))
    assert {r["_change_type"] for r in rows} == {"insert"} and all(r["_log_offset"] >= 0 for r in rows)
    assert kv.admin.list_leases() == []  # every split read, so every bucket released
    feed = reader.option("startup.mode", "earliest").schema("_log_offset bigint not null, id bigint").load()
    assert sorted(r["id"] for r in feed.collect()) == list(range(20))


def test_a_lease_duration_above_the_clusters_maximum_names_the_option(spark, kv):
    seed(kv, 1, 5)
    with pytest.raises(Exception, match=r"option 'lease.duration': lease duration 2592000000 ms exceeds "
                                        r"kv.snapshot.lease.max-duration"):
        read(spark, kv, lease_duration="30d").collect()
    assert kv.admin.list_leases() == []


def test_a_read_that_fails_while_planning_leaves_no_lease_behind(spark, kv):
    """The lease is taken, then the end offsets cannot be read (no tablet server answers): the read fails
    within its retry.timeout, and gives back what it leased."""
    seed(kv, 2, 20)
    for i in list(kv.tablets):
        kv.stop_tablet(i)
    with pytest.raises(Exception, match="shop.orders|tablet|bucket"):
        read(spark, kv, retry_timeout="2s").collect()
    assert kv.admin.list_leases() == []
