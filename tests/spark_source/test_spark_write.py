"""Writes through the kvlease Spark source on real Spark: upserts of every type, deletes by _change_type,
and schemas refused at planning."""

from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from kvlease.client.table import TableClient
from kvlease.spark_source.schema import table_schema
from tests.support.spark_tables import ALL_TYPES, kv, row, rows_of  # noqa: F401  (kv is a fixture)


def source(spark_io, kv, table: str):
    return spark_io.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table)


def frame(spark, kv, rows, table: str = "shop.copy"):
    info = kv.admin.get_table(table)
    return spark.createDataFrame(rows, table_schema(info, with_changes=False))


def test_write_then_read_round_trips_every_type_and_null(spark, kv):
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 3)
    rows = [row(i) for i in range(120)]
    frame(spark, kv, rows).write.format("kvlease").option("bootstrap", kv.coordinator.address) \
        .option("table", "shop.copy").mode("append").save()

    with TableClient(kv.admin, "shop.copy") as client:
        assert client.lookup([0, 3, 119]) == [rows[0], rows[3], rows[119]]
    back = rows_of(source(spark.read, kv, "shop.copy").load())
    assert back == {r["id"]: r for r in rows}
    assert any(v is None for r in back.values() for v in r.values())  # nulls in every nullable type went through


def test_a_change_type_column_upserts_and_deletes_in_row_order(spark, kv):
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    with TableClient(kv.admin, "shop.copy") as client:
        client.upsert([row(i) for i in range(10)])
    info = kv.admin.get_table("shop.copy")
    schema = StructType([StructField(f.name, f.dataType, True) for f in table_schema(info, with_changes=True).fields])
    changes = [(row(1, 1), "update_preimage"), (row(1, 2), "update_postimage"), (row(2), "delete"),
               (row(20), "insert"), (row(20), "delete"), (row(3, 9), "insert"), (row(4, 0), None)]
    data = [{**r, "_change_type": ct, "_bucket": 0, "_log_offset": i, "_commit_timestamp": None}
            for i, (r, ct) in enumerate(changes)]
    spark.createDataFrame(data, schema).coalesce(1).write.format("kvlease") \
        .option("bootstrap", kv.coordinator.address).option("table", "shop.copy").mode("append").save()

    with TableClient(kv.admin, "shop.copy") as client:
        got = client.lookup([1, 2, 20, 3, 4, 5])
    assert got == [row(1, 2), None, None, row(3, 9), row(4, 0), row(5)]


@pytest.mark.parametrize("change, named", [
    (lambda s: StructType([f if f.name != "qty" else StructField("qty", LongType()) for f in s.fields]), "'qty'"),
    (lambda s: StructType([f for f in s.fields if f.name != "price"]), "'price'"),
    (lambda s: StructType(s.fields + [StructField("colour", LongType())]), "'colour'"),
])
def test_a_schema_that_does_not_fit_the_table_is_refused_at_planning(spark, kv, change, named):
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    schema = change(table_schema(kv.admin.get_table("shop.copy"), with_changes=False))
    df = spark.createDataFrame([], schema)
    with pytest.raises(Exception) as info:
        df.write.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.copy") \
            .mode("append").save()
    assert named in str(info.value)


def test_overwrite_and_read_options_are_refused_for_writes(spark, kv):
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    df = frame(spark, kv, [row(1)])
    with pytest.raises(Exception, match="mode 'overwrite' is not supported"):
        source(df.write, kv, "shop.copy").mode("overwrite").save()
    with pytest.raises(Exception, match="'startup.mode' applies to reads only"):
        source(df.write, kv, "shop.copy").option("startup.mode", "full").mode("append").save()


def test_a_null_primary_key_fails_the_task_naming_the_row(spark, kv):
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    rows = [row(i) for i in range(5)] + [{**row(5), "id": None}]
    df = frame(spark, kv, rows).coalesce(1)
    with pytest.raises(Exception, match=r"row 5 of partition 0 has a null primary key column 'id'"):
        source(df.write, kv, "shop.copy").mode("append").save()


def churn(kv, table: str = "shop.orders") -> None:
    """Inserts, updates and deletes, some after a snapshot."""
    with TableClient(kv.admin, table) as client:
        client.upsert([row(i) for i in range(150)])
        client.trigger_snapshot()
        client.upsert([row(i, 1) for i in range(0, 150, 3)])
        client.delete(list(range(0, 150, 7)))
        client.upsert([row(i, 2) for i in range(140, 170)])


def test_a_change_feed_replayed_into_a_second_table_reproduces_the_first(spark, kv):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 3)
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    churn(kv)
    feed = source(spark.read, kv, "shop.orders").option("startup.mode", "earliest").load()
    feed.repartition(1).sortWithinPartitions("_bucket", "_log_offset").write.format("kvlease") \
        .option("bootstrap", kv.coordinator.address).option("table", "shop.copy").mode("append").save()

    original = rows_of(source(spark.read, kv, "shop.orders").load())
    assert rows_of(source(spark.read, kv, "shop.copy").load()) == original
    assert len(original) == 170 - len(range(0, 140, 7))


def test_a_streaming_copy_upserts_each_micro_batch_into_a_second_table(spark, kv, tmp_path):
    kv.create_table("shop.orders", ALL_TYPES, ["id"], 3)
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 3)
    churn(kv)

    def copy():
        query = source(spark.readStream, kv, "shop.orders").load().writeStream.format("kvlease") \
            .option("bootstrap", kv.coordinator.address).option("table", "shop.copy") \
            .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
        try:
            assert query.awaitTermination(120)
        finally:
            query.stop()
        assert query.exception() is None

    copy()
    assert rows_of(source(spark.read, kv, "shop.copy").load()) == rows_of(source(spark.read, kv, "shop.orders").load())
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 5) for i in range(100, 200)])
        client.delete([1, 2, 4])
    copy()
    assert rows_of(source(spark.read, kv, "shop.copy").load()) == rows_of(source(spark.read, kv, "shop.orders").load())
