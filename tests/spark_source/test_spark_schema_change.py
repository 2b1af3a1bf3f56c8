"""A table altered under a running streaming query, on real Spark: the query keeps the schema it started
with (a renamed column under its old name, an added one not read, a widened one converted back) and goes
on; restarted from its checkpoint it reads the new schema; a batch read reads the new schema; SQL DESCRIBE
shows it. The driver's one log line is checked by the unit test below (the driver runs it in a Spark
Python worker, whose log is Spark's)."""

from __future__ import annotations

import logging

import pytest

from kvlease.client.table import TableClient
from kvlease.common.tables import Column, TableInfo
from kvlease.ops.wait import wait_until
from kvlease.spark_source.stream_schema import SchemaCheck
from tests.spark_source.test_spark_stream import Collector, kv, run  # noqa: F401 (kv: a fixture)

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING"), Column("n", "INT")]


def test_a_running_query_keeps_its_schema_and_a_restarted_one_takes_the_new_one(spark, kv, tmp_path):  # noqa: F811
    kv.create_table("shop.items", COLUMNS, ["id"], 1)
    with TableClient(kv.admin, "shop.items") as client:
        client.upsert([{"id": i, "v": f"v{i}", "n": i} for i in range(3)])
    sink, checkpoint = Collector(), tmp_path / "checkpoint"
    query = (spark.readStream.format("kvlease").option("bootstrap", kv.coordinator.address)
             .option("table", "shop.items").load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: len(sink.rows()) >= 3, 120, "the bootstrap")
        kv.admin.alter_table("shop.items", add_column="c STRING")
        kv.admin.alter_table("shop.items", rename_column=("v", "label"))
        kv.admin.alter_table("shop.items", widen_column="n BIGINT")
        with TableClient(kv.admin, "shop.items") as client:
            client.upsert([{"id": 7, "label": "seven", "n": 70, "c": "new"}])
        tail = wait_until(lambda: [r for r in sink.rows() if r["id"] == 7], 60, "the row written after")
    finally:
        query.stop()
    assert {k: tail[0][k] for k in ("id", "v", "n")} == {"id": 7, "v": "seven", "n": 70}  # as it started
    assert "c" not in tail[0] and "label" not in tail[0]

    with TableClient(kv.admin, "shop.items") as client:
        client.upsert([{"id": 8, "label": "eight", "n": 2**40, "c": "wide"}])
    later = Collector()
    run(spark, kv, checkpoint, later, table="shop.items")  # restarted from its checkpoint: the new schema
    rows = {r["id"]: (r["label"], r["n"], r["c"]) for r in later.rows()}
    assert rows.pop(8) == ("eight", 2**40, "wide")
    assert rows in ({}, {7: ("seven", 70, "new")})  # the stopped query's last batch may be replayed: new schema too

    batch = (spark.read.format("kvlease").option("bootstrap", kv.coordinator.address)
             .option("table", "shop.items").load())
    assert [f.name for f in batch.schema.fields][:4] == ["id", "label", "n", "c"]
    assert sorted((r["id"], r["label"], r["c"]) for r in batch.collect()) == [
        (0, "v0", None), (1, "v1", None), (2, "v2", None), (7, "seven", "new"), (8, "eight", "wide")]


class _Admin:
    def __init__(self, table: TableInfo) -> None:
        self.table, self.asked = table, 0

    def get_table_by_id(self, table_id: int) -> TableInfo:
        self.asked += 1
        return self.table


@pytest.mark.unit
def test_the_query_logs_once_that_the_schema_changed_after_it_started(caplog):
    started = TableInfo(5, "shop", "items", tuple(COLUMNS), ("id",), 1)
    now = TableInfo(5, "shop", "items", (*started.columns, Column("c", "STRING", 3)), ("id",), 1, schema_id=2)
    clock = [0.0]
    check, admin = SchemaCheck(started, clock=lambda: clock[0]), _Admin(started)
    check.poll(admin)
    admin.table = now
    check.poll(admin)  # within the interval: not asked again
    assert admin.asked == 1 and not caplog.records
    with caplog.at_level(logging.WARNING, "kvlease.spark_source.stream_schema"):
        for _ in range(3):
            clock[0] += 11
            check.poll(admin)
    assert admin.asked == 2  # once noted, never asked again
    [record] = caplog.records
    assert ("table shop.items changed to schema id 2 after this streaming query took schema id 1" in record.message
            and "the new column(s) c are not read" in record.message and "restart the query" in record.message)
