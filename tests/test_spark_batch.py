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
