"""A Spark stream's micro-batch whose bucket is restored between its planning and its split's first fetch,
on real servers (a coordinator and a tablet server in this process, real ZooKeeper, RocksDB, gRPC on
loopback) driving the stream reader's own calls as Spark would, without the JVM: the plan passes the loss
check (the loss did not exist yet), so only the split's fetch, fenced by the epoch the batch was planned
with, stands between the new changes at reused offsets and the sink. It fails with DATA_LOST naming the
range, as the planning check would, and emits nothing. (With real Spark: test_spark_data_lost.py.)"""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from client.table import TableClient
from common import errors
from spark_source import options as opts
from spark_source.schema import spark_arrow_schema
from spark_source.splits import ReadContext
from spark_source.stream import StreamReader
from tests.tablet.replication.test_data_loss_cluster import (  # noqa: F401
    cluster, lose_and_restore, one_replica_with_tail)

pytestmark = pytest.mark.zk

TABLE = "db.fenced"


def _rows(stream: StreamReader, start: dict, end: dict) -> list[int]:
    return [i for split in stream.partitions(start, end) for batch in stream.read(split)
            for i in batch.column("id").to_pylist()]


def test_a_batch_planned_before_a_restore_fails_at_its_first_fetch_and_emits_nothing(cluster, tmp_path):
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, TABLE, tail=5)  # snapshot at offset 10, then offsets 10..14: to be lost
    given = {"bootstrap": c.coordinator.address, "table": TABLE, "startup.mode": "earliest"}
    ctx = ReadContext((c.coordinator.address,), table, None, tuple(spark_arrow_schema(table, with_changes=True).names))
    stream = StreamReader(opts.parse(given), ctx)
    try:
        start = stream.initialOffset()
        first = stream.latestOffset(start, ReadAllAvailable())
        assert first["buckets"]["0"]["offset"] == 15 and "epoch" in first["buckets"]["0"]
        assert sorted(_rows(stream, start, first)) == list(range(15))  # the query read offsets 0..14
        stream.commit(first)
        with TableClient(c.admin, TABLE) as client:
            client.upsert([{"id": i, "v": "more"} for i in range(15, 18)])  # offsets 15..17
        second = stream.latestOffset(first, ReadAllAvailable())
        splits = stream.partitions(first, second)  # planned: offsets 15..17, after the epoch of offset 14
        assert [(s.start, s.end, s.start_epoch) for s in splits] == [(15, 18, first["buckets"]["0"]["epoch"])]

        assert server.log_ends.run_once() == 1
        lose_and_restore(c, tmp_path, table, range(100, 110))  # offsets 10..19 of the restored log

        emitted = []
        with pytest.raises(errors.DataLostError, match=rf"bucket 0 of {TABLE}: offsets 10\.\.14 this query read "
                                                       rf"were lost when the bucket was restored from snapshot 1"):
            for batch in stream.read(splits[0]):
                emitted += batch.column("id").to_pylist()
        assert emitted == []  # none of the new changes at offsets 15..17
    finally:
        stream.stop()


def test_a_batch_after_an_end_cut_by_max_rows_is_fenced_at_the_cut_and_at_each_piece(cluster, tmp_path):
    """The previous batch's end was cut by maxRowsPerTrigger (not the log's end) and the next batch's range
    is cut in pieces by split.max-rows: after a restore reuses offsets below the cut, the first piece is
    refused at its first fetch (the cut's epoch), and so is a later piece (the epoch below its start)."""
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, TABLE, tail=10)  # snapshot at offset 10, then offsets 10..19
    given = {"bootstrap": c.coordinator.address, "table": TABLE, "startup.mode": "earliest", "split.max-rows": "3"}
    ctx = ReadContext((c.coordinator.address,), table, None, tuple(spark_arrow_schema(table, with_changes=True).names))
    stream = StreamReader(opts.parse(given), ctx)
    try:
        start = stream.initialOffset()
        assert start["buckets"]["0"] == {"snapshot": -1, "offset": 0}  # the log's start: nothing below
        first = stream.latestOffset(start, ReadMaxRows(12))
        assert first["buckets"]["0"]["offset"] == 12 and "epoch" in first["buckets"]["0"]  # a cut end, fenced
        assert sorted(_rows(stream, start, first)) == list(range(12))  # the query read offsets 0..11
        stream.commit(first)
        second = stream.latestOffset(first, ReadAllAvailable())
        splits = stream.partitions(first, second)  # 12..19 in pieces of 3, each after the epoch below its start
        assert [(s.start, s.end) for s in splits] == [(12, 15), (15, 18), (18, 20)]
        assert all(s.start_epoch == first["buckets"]["0"]["epoch"] for s in splits)

        assert server.log_ends.run_once() == 1
        lose_and_restore(c, tmp_path, table, range(100, 112))  # offsets 10..21 of the restored log

        for split, lost in zip(splits, ("10..11", "10..14", "10..17")):
            emitted = []
            with pytest.raises(errors.DataLostError, match=rf"bucket 0 of {TABLE}: offsets {lost} this query read "
                                                           rf"were lost when the bucket was restored from snapshot 1"):
                for batch in stream.read(split):
                    emitted += batch.column("id").to_pylist()
            assert emitted == []  # none of the new changes at the reused offsets
    finally:
        stream.stop()
