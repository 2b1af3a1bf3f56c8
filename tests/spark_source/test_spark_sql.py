"""SQL and Spark's session catalog on real Spark: CREATE TABLE … USING kvlease OPTIONS (…), then SELECT, INSERT
INTO, writeTo, saveAsTable, a stream of the table, and a temporary view; and the forms refused, with their
messages (docs/spark.md, "SQL")."""

from __future__ import annotations

import json
import tempfile
import uuid

import pytest
from pyspark.sql.functions import lit
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kvlease.client.table import TableClient
from kvlease.spark_source import catalog
from kvlease.spark_source.options import OptionError
from kvlease.spark_source.schema import table_schema
from tests.support.spark_tables import ALL_TYPES, kv, row, rows_of, seed  # noqa: F401  (kv is a fixture)

COLUMNS = ", ".join(c.name for c in ALL_TYPES)


@pytest.fixture
def sql(spark):
    """``sql(statement)`` collects; the catalog tables and views a test made are dropped after it."""
    made: list[str] = []

    def run(statement: str):
        return spark.sql(statement).collect()

    run.name = lambda prefix: made.append(f"{prefix}_{uuid.uuid4().hex[:8]}") or made[-1]
    yield run
    for name in made:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.sql(f"DROP VIEW IF EXISTS {name}")


def options(kv, table: str) -> str:
    return f"bootstrap '{kv.coordinator.address}', table '{table}'"


def with_options(kv, table: str) -> str:
    return f"WITH ('bootstrap' = '{kv.coordinator.address}', 'table' = '{table}')"


def table_rows(kv, table: str, ids) -> list:
    with TableClient(kv.admin, table) as client:
        return client.lookup(list(ids))


def test_create_table_then_select_reads_the_table_and_a_query_adds_read_options(spark, kv, sql):
    seed(kv, 2, 30)
    t = sql.name("orders")
    sql(f"CREATE TABLE {t} USING kvlease OPTIONS ({options(kv, 'shop.orders')}, 'split.max-rows' '1000') "
        "COMMENT 'kvlease orders'")
    assert rows_of(spark.sql(f"SELECT * FROM {t}")) == {i: row(i) for i in range(30)}
    assert rows_of(spark.table(t)) == {i: row(i) for i in range(30)}
    assert [r[0] for r in sql(f"SELECT count(*) FROM {t} WHERE qty >= 100")] == [20]
    # a query's WITH (…) options go on top of the table's: here a change feed of the same table
    changes = sql(f"SELECT id, _change_type FROM {t} WITH ('startup.mode' = 'earliest')")
    assert sorted(r.id for r in changes) == list(range(30)) and {r._change_type for r in changes} == {"insert"}


def test_insert_into_a_catalog_table_needs_the_options_with_the_write(spark, kv, sql):
    seed(kv, 2, 10)
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    orders, copy = sql.name("orders"), sql.name("copy")
    sql(f"CREATE TABLE {orders} USING kvlease OPTIONS ({options(kv, 'shop.orders')})")
    sql(f"CREATE TABLE {copy} USING kvlease OPTIONS ({options(kv, 'shop.copy')})")
    # Spark gives the writer no options; the schema's metadata here is orders' (the SELECT's), not copy's
    with pytest.raises(Exception, match="this write names no kvlease table"):
        sql(f"INSERT INTO {copy} SELECT * FROM {orders}")
    assert table_rows(kv, "shop.copy", range(10)) == [None] * 10
    sql(f"INSERT INTO {copy} {with_options(kv, 'shop.copy')} ({COLUMNS}) SELECT {COLUMNS} FROM {orders} WHERE id < 5")
    sql(f"INSERT INTO {copy} {with_options(kv, 'shop.copy')} BY NAME SELECT {COLUMNS} FROM {orders} WHERE id >= 5")
    assert table_rows(kv, "shop.copy", range(10)) == [row(i) for i in range(10)]
    assert rows_of(spark.table(copy)) == {i: row(i) for i in range(10)}


def test_dataframe_writes_to_a_catalog_table(spark, kv, sql):
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    copy = sql.name("copy")
    sql(f"CREATE TABLE {copy} USING kvlease OPTIONS ({options(kv, 'shop.copy')})")
    schema = table_schema(kv.admin.get_table("shop.copy"), with_changes=False)
    df = spark.createDataFrame([row(1), row(2)], schema)
    with pytest.raises(Exception, match="this write names no kvlease table"):
        df.writeTo(copy).append()
    df.writeTo(copy).option("bootstrap", kv.coordinator.address).option("table", "shop.copy").append()
    assert table_rows(kv, "shop.copy", [1, 2]) == [row(1), row(2)]
    more = spark.createDataFrame([row(3, 1)], schema)
    more.write.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.copy") \
        .mode("append").saveAsTable(copy)
    assert table_rows(kv, "shop.copy", [3]) == [row(3, 1)]


def test_overwrite_is_refused_in_every_form(spark, kv, sql):
    seed(kv, 1, 3)
    orders = sql.name("orders")
    sql(f"CREATE TABLE {orders} USING kvlease OPTIONS ({options(kv, 'shop.orders')})")
    with pytest.raises(Exception, match="'overwrite' is not supported"):
        sql(f"INSERT OVERWRITE {orders} SELECT * FROM {orders}")
    df = spark.table(orders)
    with pytest.raises(Exception, match="'overwrite' is not supported"):
        df.writeTo(orders).overwrite(lit(True))
    with pytest.raises(Exception, match="does not support dynamic overwrite"):  # Spark's own refusal
        df.writeTo(orders).overwritePartitions()
    assert table_rows(kv, "shop.orders", range(3)) == [row(i) for i in range(3)]


def test_a_stream_of_a_catalog_table_into_another(spark, kv, sql):
    seed(kv, 2, 12)
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    orders, copy = sql.name("orders"), sql.name("copy")
    sql(f"CREATE TABLE {orders} USING kvlease OPTIONS ({options(kv, 'shop.orders')})")
    sql(f"CREATE TABLE IF NOT EXISTS {copy} USING kvlease OPTIONS ({options(kv, 'shop.copy')})")
    with tempfile.TemporaryDirectory() as checkpoint:
        query = spark.readStream.table(orders).writeStream.option("checkpointLocation", checkpoint) \
            .option("bootstrap", kv.coordinator.address).option("table", "shop.copy") \
            .trigger(availableNow=True).toTable(copy)
        assert query.awaitTermination(120), "the stream did not catch up"
    assert table_rows(kv, "shop.copy", range(12)) == [row(i) for i in range(12)]


def test_a_temporary_view_with_a_column_list_reads_and_takes_inserts(spark, kv, sql):
    seed(kv, 2, 5)
    kv.create_table("shop.copy", ALL_TYPES, ["id"], 2)
    source, target = sql.name("src"), sql.name("dst")
    columns = ", ".join(f"{f.name} {f.dataType.simpleString()}"
                        for f in table_schema(kv.admin.get_table("shop.copy"), with_changes=False).fields)
    sql(f"CREATE TEMPORARY VIEW {source} USING kvlease OPTIONS ({options(kv, 'shop.orders')})")
    sql(f"CREATE TEMPORARY VIEW {target} ({columns}) USING kvlease OPTIONS ({options(kv, 'shop.copy')})")
    sql(f"INSERT INTO {target} SELECT {COLUMNS} FROM {source}")
    assert table_rows(kv, "shop.copy", range(5)) == [row(i) for i in range(5)]
    assert rows_of(spark.table(target)) == {i: row(i) for i in range(5)}


def test_a_table_created_with_a_column_list_or_table_properties_says_what_to_do(spark, kv, sql):
    seed(kv, 1, 2)
    listed, props = sql.name("listed"), sql.name("props")
    sql(f"CREATE TABLE {listed} (id BIGINT) USING kvlease OPTIONS ({options(kv, 'shop.orders')})")
    with pytest.raises(Exception, match="without a column list"):
        sql(f"SELECT * FROM {listed}")
    ctas = sql.name("ctas")
    with pytest.raises(Exception, match="this write names no kvlease table"):
        sql(f"CREATE TABLE {ctas} USING kvlease OPTIONS ({options(kv, 'shop.orders')}) AS SELECT 1L AS id")
    assert ctas not in {t.name for t in spark.catalog.listTables()}
    with pytest.raises(Exception, match="table property 'colour' means nothing to kvlease"):
        sql(f"CREATE TABLE {props} USING kvlease OPTIONS ({options(kv, 'shop.orders')}) TBLPROPERTIES ('colour'='red')")


# --- the catalog's pure parts ---------------------------------------------------------------------------------

@pytest.mark.unit
def test_create_options_are_the_prefixed_ones_without_spark_properties():
    spark_passes = {"option.table": "shop.orders", "option.Split.Max-Rows": "5", "provider": "kvlease",
                    "owner": "root", "comment": "hi", "table": "shop.orders", "split.max-rows": "5",
                    "location": "file:/x", "path": "file:/x"}
    assert catalog.is_create(spark_passes) and not catalog.is_create({"table": "a.b"})
    assert catalog.from_create(spark_passes) == {"table": "shop.orders", "split.max-rows": "5"}
    with pytest.raises(OptionError, match="table property 'colour'"):
        catalog.from_create({**spark_passes, "colour": "red"})
    with pytest.raises(OptionError, match="use option 'password-file'"):
        catalog.from_create({**spark_passes, "option.password": "pw", "password": "pw"})


@pytest.mark.unit
def test_a_read_takes_the_tables_options_unless_it_names_a_table_itself():
    kept = {"bootstrap": "h:1", "table": "shop.orders", "lease.duration": "5m"}
    schema = catalog.remember(StructType([StructField("id", LongType(), False),
                                          StructField("_change_type", StringType(), False)]), kept)
    assert all(f.nullable for f in schema.fields)
    assert json.loads(schema.fields[0].metadata[catalog.METADATA_KEY]) == kept
    assert catalog.recall({}, schema) == kept
    assert catalog.recall({"Startup.Mode": "earliest"}, schema) == {**kept, "startup.mode": "earliest"}
    assert catalog.recall({"table": "a.b"}, schema) == {"table": "a.b"}
    assert catalog.recall({}, StructType([StructField("id", LongType())])) == {}
