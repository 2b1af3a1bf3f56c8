"""Batch reads through the kvlease Spark source on real Spark (local[2]) against a real cluster:
the DataFrame equals the table read by lookups, from snapshots plus changelog, or live scans."""

from __future__ import annotations

import pytest

from client.table import TableClient
from tests.spark_tables import ALL_TYPES, kv, row, rows_of  # noqa: F401  (kv is a fixture)


def read(spark, kv, table: str = "shop.orders", **options):
    reader = spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table)
    for key, value in options.items():
        reader = reader.option(key.replace("_", "."), value)
    return reader.load()


def lookups(client: TableClient, ids) -> dict:
    return {r["id"]: r for r in client.lookup(list(ids)) if r is not None}


def test_batch_read_equals_lookups_after_writes_updates_deletes_and_snapshots(spark, kv):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 4)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(400)])
        client.trigger_snapshot()
        client.upsert([row(i, 1) for i in range(0, 400, 3)])  # updates after the snapshot
        client.delete(list(range(1, 400, 10)))
        client.upsert([row(i) for i in range(400, 450)])  # inserts after the snapshot
        expected = lookups(client, range(450))

    got = rows_of(read(spark, kv))

    assert got == expected
    assert len(got) == 450 - 40
    assert kv.admin.list_leases() == []  # every split released its bucket


def test_batch_read_of_snapshots_on_s3(spark, make_config, s3_overrides, tmp_path):
    from tests.local_cluster import LocalCluster

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
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 4)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(200)])
        client.trigger_snapshot()
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
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(100)])
        client.trigger_snapshot()
        client.upsert([row(i, 1) for i in range(10)])

    df = read(spark, kv).where("qty > 500").select("id", "name")

    got = sorted((r["id"], r["name"]) for r in df.collect())
    expected = sorted((i, row(i, 1 if i < 10 else 0)["name"]) for i in range(100) if i * 10 + (i < 10) > 500)
    assert got == expected
    assert df.columns == ["id", "name"]


def test_primary_key_equality_reads_by_lookup(spark, kv):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 4)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(100)])
        client.trigger_snapshot()
        client.upsert([row(42, 5)])

    df = read(spark, kv)
    assert [r["qty"] for r in df.where("id = 42").collect()] == [425]
    assert df.where("id = 42 AND qty = 0").collect() == []  # the filter Spark keeps still applies
    assert sorted(r["id"] for r in df.where("id IN (3, 4, 1000)").collect()) == [3, 4]
    assert df.where("id = 1000").collect() == []
    assert kv.admin.list_leases() == []
