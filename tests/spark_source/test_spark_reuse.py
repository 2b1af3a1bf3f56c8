"""Many queries on one DataFrame (and one temp view) of the kvlease source, each against the same query on
a fresh ``load()``: Spark keeps a Python source's planned partitions and read function on the DataFrame's
relation and reuses them, so nothing a query pushes may leak into the next."""

from __future__ import annotations

import math

import pytest

from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from tests.support.spark_tables import kv, row, seed, spark_row  # noqa: F401  (kv is a fixture)

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
TABLE_COLUMNS = ["id", "name", "qty", "price", "ok", "raw", "at"]


def load(spark, kv, table: str = "shop.orders"):
    return (spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table)
            .load())


def rows(df) -> list:
    """The rows, comparable and in one order (table and metadata columns alike)."""
    return sorted((tuple(sorted(spark_row(r.asDict()).items())) for r in df.collect()), key=repr)


#: (what, the query on a DataFrame): every kind of read, and the combinations of them.
QUERIES = [
    ("full", lambda df: df),
    ("count", lambda df: df.count()),
    ("id = 7", lambda df: df.where("id = 7")),
    ("count id = 7", lambda df: df.where("id = 7").count()),
    ("id IN", lambda df: df.where("id IN (3, 4, 250, 1000)")),
    ("non-key", lambda df: df.where("qty > 2500")),
    ("key and non-key", lambda df: df.where("id = 42 AND qty = 420")),
    ("key or non-key", lambda df: df.where("id = 42 OR qty < 30")),
    ("projection", lambda df: df.select("id", "name")),
    ("projection of a key filter", lambda df: df.where("id IN (5, 6)").select("name")),
    ("limit", lambda df: df.limit(7).count()),
    ("key filter and limit", lambda df: df.where("id = 9").limit(3)),
    ("in and projection and limit", lambda df: df.where("id IN (1, 2, 3)").select("id").limit(2).count()),
]
VIEW_QUERIES = [
    "SELECT * FROM v", "SELECT count(*) FROM v", "SELECT * FROM v WHERE id = 7", "SELECT count(*) FROM v",
    "SELECT id FROM v WHERE id IN (3, 4, 1000)", "SELECT * FROM v", "SELECT name FROM v WHERE qty > 2500",
    "SELECT count(*) FROM (SELECT * FROM v LIMIT 5)", "SELECT * FROM v WHERE id = 250 AND ok", "SELECT * FROM v",
]


def result(value):
    return value if isinstance(value, int) else rows(value)


def test_queries_on_one_dataframe_and_one_view_equal_fresh_reads(spark, kv):
    """With filter pushdown on (as register() sets it; when the source pushed key filters, they leaked into later
    queries) and then off (the reader failed to plan), on the same DataFrame and view."""
    seed(kv, 2, 300)  # 2 buckets, not 4: a query's 2 tasks run at once on local[2]
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(0, 300, 7)])  # the changelog on top of the snapshot
    fresh: dict = {}  # the table does not change: each query's fresh result once

    def expected(key, query):
        if key not in fresh:
            fresh[key] = query(load(spark, kv))
        return fresh[key]

    previous = spark.conf.get(PUSHDOWN, "false")
    df = load(spark, kv)
    df.createOrReplaceTempView("v")
    try:
        for pushdown in ("true", "false"):
            spark.conf.set(PUSHDOWN, pushdown)
            for what, query in QUERIES + QUERIES[::-1]:  # every query after every other kind
                assert result(query(df)) == expected(what, lambda d: result(query(d))), (pushdown, what)
            for sql in VIEW_QUERIES:
                assert rows(spark.sql(sql)) == expected(sql, lambda d: rows(_on_view(spark, d, sql))), (pushdown, sql)
    finally:
        spark.conf.set(PUSHDOWN, previous)
        spark.catalog.dropTempView("v")
        spark.catalog.dropTempView("fresh")
    assert kv.admin.list_leases() == []


def _on_view(spark, df, sql: str):
    df.createOrReplaceTempView("fresh")
    return spark.sql(sql.replace(" v", " fresh"))


def test_equality_on_a_double_key_finds_what_sparks_own_filter_finds(spark, kv):
    """Spark normalises -0.0 to 0.0 and takes NaN = NaN; a filter on a DOUBLE key finds those rows."""
    kv.create_table("shop.d", [Column("d", "DOUBLE"), Column("v", "STRING")], ["d"], 2)
    keys = [-0.0, 1.5, math.nan, -2.0]
    with TableClient(kv.admin, "shop.d") as client:
        client.upsert([{"d": d, "v": f"v{i}"} for i, d in enumerate(keys)])
        client.trigger_snapshot()
    previous = spark.conf.get(PUSHDOWN, "false")
    spark.conf.set(PUSHDOWN, "true")  # as register() sets it
    try:
        df = load(spark, kv, "shop.d")
        assert sorted(r["v"] for r in df.where("d = 0.0").collect()) == ["v0"]
        assert sorted(r["v"] for r in df.where("d = double('NaN')").collect()) == ["v2"]
        assert sorted(r["v"] for r in df.where("d IN (0.0, -2.0)").collect()) == ["v0", "v3"]
        assert df.count() == 4
    finally:
        spark.conf.set(PUSHDOWN, previous)
