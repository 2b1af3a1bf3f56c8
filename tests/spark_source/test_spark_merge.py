"""Merge engines and partial updates through the Spark writer on real Spark (docs/spark.md, "Merge engines and
partial updates"): -U/-D rows retract from an aggregation table, a partial update writes the DataFrame's columns,
and engine options that disagree with the table are refused."""

from __future__ import annotations

import uuid

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kvlease.client.table import TableClient
from kvlease.common.merge_engine import parse_engine
from kvlease.common.tables import parse_schema
from kvlease.ops.wait import wait_until
from tests.support.spark_tables import kv  # noqa: F401  (kv is a fixture)

FULL = StructType([StructField("id", LongType()), StructField("total", LongType()), StructField("note", StringType()),
                   StructField("_change_type", StringType())])


def writer(df, kv, **options):
    w = df.write.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.sums")
    for name, value in options.items():
        w = w.option(name.replace("_", "-"), value)
    return w.mode("append")


def test_retracts_partial_updates_and_engine_options(spark, kv):
    info = kv.admin.create_table("shop.sums", parse_schema("id BIGINT, total BIGINT, note STRING"), ["id"], 2,
                                 merge_engine=parse_engine("aggregation", aggregates={"total": "sum"}))
    wait_until(lambda: all(b.leader_address for b in kv.admin.get_table_assignment(info.table_id)[1].values()), 30,
               "shop.sums led")
    changes = [(1, 10, "a", "+I"), (2, 5, "b", "insert"), (1, 10, "a", "-U"), (1, 12, "a", "+U"),
               (2, 5, "b", "delete"), (2, 7, None, "+I")]
    writer(spark.createDataFrame(changes, FULL).coalesce(1), kv).save()
    with TableClient(kv.admin, "shop.sums") as client:
        # 2's note: its -D retracted "b" (last_value_ignore_nulls: cleared), its +I wrote a null (ignored)
        assert client.lookup([1, 2]) == [{"id": 1, "total": 12, "note": "a"}, {"id": 2, "total": 7, "note": None}]
        notes = spark.createDataFrame([(1, "x"), (2, "y")], "id long, note string")
        writer(notes, kv, partial_update="true").save()
        assert client.lookup([1, 2]) == [{"id": 1, "total": 12, "note": "x"}, {"id": 2, "total": 7, "note": "y"}]
    with pytest.raises(Exception, match="column 'total' of table shop.sums is missing from the DataFrame"):
        writer(notes, kv).save()
    with pytest.raises(Exception, match="say first_row, but table shop.sums has aggregation"):
        writer(notes, kv, partial_update="true", merge_engine="first_row").save()
    writer(notes, kv, partial_update="true", merge_engine="aggregation", agg="total=sum").save()  # agrees
    name = f"sums_{uuid.uuid4().hex[:8]}"
    opts = f"bootstrap '{kv.coordinator.address}', table 'shop.sums'"
    with pytest.raises(Exception, match="say versioned .*but table shop.sums has aggregation"):
        spark.sql(f"CREATE TABLE {name} USING kvlease OPTIONS ({opts}, 'merge-engine' 'versioned', "
                  f"'version-column' 'total')")
    try:
        spark.sql(f"CREATE TABLE {name} USING kvlease OPTIONS ({opts}, 'merge-engine' 'aggregation', 'agg' 'total=sum')")
        assert {r.id for r in spark.table(name).collect()} == {1, 2}  # a read takes the engine options too
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
