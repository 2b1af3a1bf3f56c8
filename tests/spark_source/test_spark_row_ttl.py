"""A Spark stream of a table with a row TTL (real Spark, an in-process cluster whose leaders look for expired
rows every 200 ms): the stream's copy drops the rows that expire, through the -D records the leader's
deletes write to the changelog (docs/changelog.md, "Row TTL")."""

from __future__ import annotations

import time

import pytest

from kvlease.client.table import TableClient
from kvlease.common.row_ttl import row_ttl
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.spark_source.test_spark_stream import Collector, run
from tests.support.local_cluster import LocalCluster

COLUMNS = [Column("id", "BIGINT"), Column("ts", "BIGINT"), Column("v", "STRING")]


@pytest.fixture
def kv(make_config, tmp_path):
    cluster = LocalCluster(make_config, tmp_path, 1, {"row-ttl.check-interval": "200ms"})
    try:
        yield cluster
    finally:
        cluster.close()


def _state(rows: list[dict]) -> dict[int, str]:
    state: dict[int, str] = {}
    for r in sorted(rows, key=lambda r: (r["_bucket"], r["_log_offset"])):
        if r["_change_type"] in ("insert", "update_postimage"):
            state[r["id"]] = r["v"]
        elif r["_change_type"] == "delete":
            state.pop(r["id"], None)
    return state


def test_a_streams_copy_drops_the_rows_that_expire(spark, kv, tmp_path):
    kv.admin.create_table("shop.events", COLUMNS, ["id"], 2, row_ttl=row_ttl("1h", "ts"))
    now = int(time.time() * 1000)
    with TableClient(kv.admin, "shop.events") as client:
        client.upsert([{"id": i, "ts": now, "v": f"v{i}"} for i in range(15)])
        client.trigger_snapshot()
        sink, checkpoint = Collector(), tmp_path / "ck"
        run(spark, kv, checkpoint, sink, table="shop.events")  # the bootstrap: nothing expired
        assert set(_state(sink.rows())) == set(range(15))
        client.upsert([{"id": i, "ts": now - 7_200_000, "v": f"old{i}"} for i in range(10)])  # expired at once
        # 15 inserts, 10 updates (-U, +U), 10 deletes by the leader
        wait_until(lambda: sum(end for _, end in client.list_offsets().values()) >= 45, 30, "the expired rows deleted")
    run(spark, kv, checkpoint, sink, table="shop.events")
    tail = [r for b, rows in sink.batches.items() if b > 0 for r in rows]
    deletes = [r for r in tail if r["_change_type"] == "delete"]
    assert sorted(r["id"] for r in deletes) == list(range(10))
    assert all(r["v"] == f"old{r['id']}" for r in deletes)  # the -D rows carry the before-image
    assert _state(sink.rows()) == {i: f"v{i}" for i in range(10, 15)}


def test_a_spark_write_needs_no_write_time_column():
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from kvlease.common.tables import TableInfo, TableSpec, validate_spec
    from kvlease.spark_source.options import OptionError
    from kvlease.spark_source.writer import check_schema

    spec = validate_spec(TableSpec("shop", "w", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1,
                                   row_ttl=row_ttl("1d")))
    table = TableInfo(1, "shop", "w", spec.columns, ("id",), 1, row_ttl=spec.row_ttl)
    frame = StructType([StructField("id", LongType()), StructField("v", StringType())])
    assert check_schema(table, frame) == {"id": "id", "v": "v"}
    column_ttl = TableInfo(2, "shop", "c", (*spec.columns[:2], Column("ts", "BIGINT")), ("id",), 1,
                           row_ttl=row_ttl("1d", "ts"))
    with pytest.raises(OptionError, match="column 'ts' of table shop.c is missing from the DataFrame"):
        check_schema(column_ttl, frame)
