"""Every column type through the Spark source on real Spark (local[2]) against a real cluster: a batch read
(snapshot + changelog) equals lookups, the change feed carries the values, a DataFrame write (with safe
widenings) round-trips, a lossy one is refused naming the column, and SQL ``DESCRIBE`` shows the types."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest
from pyspark.sql.types import (ByteType, DecimalType, IntegerType, LongType, ShortType, StructField, StructType)

from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.spark_source.schema import table_schema
from tests.support.spark_tables import kv  # noqa: F401  (kv is a fixture)

TYPES = [Column("id", "BIGINT"), Column("t8", "TINYINT"), Column("s16", "SMALLINT"), Column("f", "FLOAT"),
         Column("amount", "DECIMAL(12,2)"), Column("big", "DECIMAL(38,10)"), Column("day", "DATE"),
         Column("tod", "TIME"), Column("at", "TIMESTAMP"), Column("local", "TIMESTAMP_NTZ"),
         Column("tags", "ARRAY<STRING>"), Column("attrs", "MAP<STRING,BIGINT>"),
         Column("line", "STRUCT<sku STRING,qty INT,when DATE>"), Column("stamps", "ARRAY<TIMESTAMP>")]
SPARK_TYPES = {"id": "bigint", "t8": "tinyint", "s16": "smallint", "f": "float", "amount": "decimal(12,2)",
               "big": "decimal(38,10)", "day": "date", "tod": "bigint", "at": "timestamp", "local": "timestamp_ntz",
               "tags": "array<string>", "attrs": "map<string,bigint>",
               "line": "struct<sku:string,qty:int,when:date>", "stamps": "array<timestamp>"}
BASE = dt.datetime(2026, 3, 1, 12, 0, 0)


def typed_row(i: int, version: int = 0) -> dict:
    return {"id": i, "t8": (i % 200) - 100, "s16": -i, "f": i / 8, "amount": Decimal(i * 100 + version).scaleb(-2),
            "big": Decimal(f"-{i}12345678901234567.0123456789"), "day": dt.date(1965, 1, 1) + dt.timedelta(days=i),
            "tod": dt.time(i % 24, 30, 15, 123456), "at": BASE + dt.timedelta(microseconds=i * 7 + version),
            "local": BASE - dt.timedelta(days=i, microseconds=1),
            "tags": None if i % 5 == 0 else [f"t{i}", None, "x"][: 1 + i % 3],
            "attrs": {"n": i, "v": version} if i % 4 else None,
            "line": {"sku": f"s{i}", "qty": None if i % 3 else i, "when": dt.date(2000, 1, 1)},
            "stamps": [BASE, BASE + dt.timedelta(microseconds=1)] if i % 2 else []}


def as_stored(r: dict) -> dict:
    """A row as Spark gives it back, made comparable with a table row: timestamps naive UTC, maps as dicts, a
    TIME (Spark: microseconds since midnight) as a time."""
    out = dict(r)
    if isinstance(out["tod"], int):
        out["tod"] = (dt.datetime.min + dt.timedelta(microseconds=out["tod"])).time()
    for name in ("at",):
        if out[name] is not None and out[name].tzinfo is not None:
            out[name] = out[name].astimezone(dt.timezone.utc).replace(tzinfo=None)
    if out["stamps"] is not None:
        out["stamps"] = [s.astimezone(dt.timezone.utc).replace(tzinfo=None) if s and s.tzinfo else s
                         for s in out["stamps"]]
    if isinstance(out["attrs"], list):
        out["attrs"] = dict(out["attrs"])
    if out["line"] is not None and not isinstance(out["line"], dict):
        out["line"] = out["line"].asDict()
    return out


def spark_rows(df) -> dict:
    return {r["id"]: as_stored({c.name: r[c.name] for c in TYPES}) for r in df.collect()}


def lookups(client: TableClient, ids) -> dict:
    return {r["id"]: as_stored(r) for r in client.lookup(list(ids)) if r is not None}


def read(spark, kv, table: str, **options):
    reader = spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table)
    for key, value in options.items():
        reader = reader.option(key.replace("_", "."), value)
    return reader.load()


def test_every_type_reads_writes_and_describes_through_spark(spark, kv):
    kv.create_table("shop.typed", TYPES, ["id"], 3)
    with TableClient(kv.admin, "shop.typed") as client:
        client.upsert([typed_row(i) for i in range(60)])
        assert client.trigger_snapshot()
        client.upsert([typed_row(i, 1) for i in range(0, 60, 4)])  # after the snapshot: from the changelog
        client.delete([7, 8])
        expected = lookups(client, range(60))
    assert expected[4]["amount"] == Decimal("4.01") and expected[4]["tod"] == dt.time(4, 30, 15, 123456)

    df = read(spark, kv, "shop.typed")
    assert {f.name: f.dataType.simpleString() for f in df.schema.fields if f.name in SPARK_TYPES} == SPARK_TYPES
    assert spark_rows(df) == expected

    changes = read(spark, kv, "shop.typed", startup_mode="earliest").where("_change_type = 'update_postimage'")
    assert {r["id"]: as_stored({c.name: r[c.name] for c in TYPES}) for r in changes.collect()} == {
        i: as_stored(typed_row(i, 1)) for i in range(0, 60, 4)}

    # a write of the rows read, into a second table, then of narrower types (safe widenings)
    kv.create_table("shop.copy", TYPES, ["id"], 2)
    df.write.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.copy") \
        .mode("append").save()
    with TableClient(kv.admin, "shop.copy") as client:
        assert lookups(client, range(60)) == expected
    kv.create_table("shop.wide", [Column("id", "BIGINT"), Column("n", "INT"), Column("d", "DECIMAL(12,2)")],
                    ["id"], 1)
    narrow = spark.createDataFrame([(1, 2, Decimal("3.5"))], StructType([
        StructField("id", IntegerType()), StructField("n", ShortType()), StructField("d", DecimalType(4, 1))]))
    narrow.write.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.wide") \
        .mode("append").save()
    with TableClient(kv.admin, "shop.wide") as client:
        assert client.lookup([1]) == [{"id": 1, "n": 2, "d": Decimal("3.50")}]
    lossy = spark.createDataFrame([(1, 2, Decimal(1))], StructType([
        StructField("id", ByteType()), StructField("n", LongType()), StructField("d", DecimalType(4, 0))]))
    with pytest.raises(Exception, match=r"column 'n': table shop.wide stores INT \(int\), the DataFrame has bigint"):
        lossy.write.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.wide") \
            .mode("append").save()

    name = f"typed_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {name} USING kvlease OPTIONS (bootstrap '{kv.coordinator.address}', "
              "table 'shop.typed')")
    try:
        described = {r["col_name"]: r["data_type"] for r in spark.sql(f"DESCRIBE TABLE {name}").collect()}
        assert {k: described[k] for k in SPARK_TYPES} == SPARK_TYPES
        assert spark.sql(f"SELECT sum(amount) FROM {name}").collect()[0][0] == sum(
            r["amount"] for r in expected.values())
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
    assert table_schema(kv.admin.get_table("shop.typed"), with_changes=False).simpleString().startswith(
        "struct<id:bigint,t8:tinyint")
    assert kv.admin.list_leases() == []


def test_a_stream_copies_every_type_bootstrap_then_changes(spark, kv, tmp_path):
    kv.create_table("shop.typed", TYPES, ["id"], 2)
    kv.create_table("shop.streamed", TYPES, ["id"], 2)
    with TableClient(kv.admin, "shop.typed") as client:
        client.upsert([typed_row(i) for i in range(40)])
        client.trigger_snapshot()

    def copy() -> None:
        query = (spark.readStream.format("kvlease").option("bootstrap", kv.coordinator.address)
                 .option("table", "shop.typed").load()
                 .writeStream.format("kvlease").option("bootstrap", kv.coordinator.address)
                 .option("table", "shop.streamed").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(120)
        finally:
            query.stop()

    copy()  # the bootstrap from the snapshots
    with TableClient(kv.admin, "shop.typed") as client:
        client.upsert([typed_row(i, 3) for i in range(0, 40, 3)] + [typed_row(i) for i in range(40, 50)])
        client.delete([5, 6])
        expected = lookups(client, range(50))
    copy()  # restarted from its checkpoint: the changelog since
    with TableClient(kv.admin, "shop.streamed") as client:
        assert lookups(client, range(50)) == expected
    assert len(expected) == 48 and expected[3]["tod"] == dt.time(3, 30, 15, 123456)
