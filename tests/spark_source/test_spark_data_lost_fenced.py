"""A Spark stream's micro-batch whose bucket is restored between its planning and its split's first fetch,
on real servers (a coordinator and a tablet server in this process, real ZooKeeper, RocksDB, gRPC on
loopback) driving the stream reader's own calls as Spark would, without the JVM: the plan passes the loss
check (the loss did not exist yet), so only the split's fetch, fenced by the epoch the batch was planned
with, stands between the new changes at reused offsets and the sink. It fails with DATA_LOST naming the
range, as the planning check would, and emits nothing. (With real Spark: test_spark_data_lost.py.)

Also: split pieces planned above the high watermark of a leader elected unclean right before their epochs
are asked, an offset from a checkpoint written before epochs, and a restore that starts inside a planned
range: each read is fenced, and fails with DATA_LOST naming the offsets instead of emitting other rows."""

from __future__ import annotations

import re

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.spark_source import options as opts
from kvlease.spark_source.enumerator import fence_pieces, log_splits_for
from kvlease.spark_source.reader import read_split
from kvlease.spark_source.schema import spark_arrow_schema
from kvlease.spark_source.splits import ReadContext
from kvlease.spark_source.stream import StreamReader
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_data_loss_cluster import (  # noqa: F401
    _served, cluster, lose_and_restore, one_replica_with_tail, two_in_sync)
from tests.tablet.replication.test_replicated_buckets import bucket_state, crash, server_by_id

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


def _context(c, table) -> ReadContext:
    return ReadContext((c.coordinator.address,), table, None, tuple(spark_arrow_schema(table, with_changes=True).names))


def _read(ctx: ReadContext, split) -> tuple[list[int], errors.KvLeaseError | None]:
    """The ids a split emits, and the error that ended it (None: it read to its end)."""
    emitted: list[int] = []
    try:
        for batch in read_split(ctx, split):
            emitted += batch.column("id").to_pylist()
    except errors.KvLeaseError as exc:
        return emitted, exc
    return emitted, None


def test_pieces_planned_above_an_unclean_leaders_high_watermark_are_fenced(cluster, tmp_path):
    """A batch change feed of offsets 4..19 in pieces of 4 is planned while the leader has them all; the leader
    dies, and the out-of-sync replica (offsets 0..7) is elected unclean right before the pieces' epochs are
    asked: it cannot tell the epoch at 12 and 16 (above its high watermark, 8). Those pieces start with the
    epoch below the planned end instead of none, and the piece at 8 meets the new leader's entries under a
    newer epoch: after new changes reuse offsets 8.., each piece past 8 fails with DATA_LOST naming the
    offsets and emits nothing; the piece below 8, still the same history, reads its rows."""
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, TABLE)
    with TableClient(c.admin, TABLE) as client:
        client.upsert([{"id": i, "v": "a"} for i in range(8)])  # offsets 0..7 on both replicas
        crash(c, server_by_id(c, follower))
        wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the follower out of the ISR")
        client.upsert([{"id": i, "v": "b"} for i in range(8, 20)])  # offsets 8..19 on the leader alone
        start, end = client.positions({0: 4})[0], client.end_positions()[0]  # planned: 4..19
    assert end.offset == 20 and start.epoch == end.epoch
    splits = log_splits_for({0: (start.offset, end.offset)}, 4)
    crash(c, server_by_id(c, leader))
    c.tablet(follower, tmp_path / f"t{follower}")
    # the coordinator learns of the restarted server from ZooKeeper's watch, after start() returned
    wait_until(lambda: [s.id for s in c.admin.list_tablet_servers()] == [follower], 15, "only the follower live")
    c.admin.elect_leader(TABLE, 0, unclean=True, tablet=follower)
    with TableClient(c.admin, TABLE) as client:
        wait_until(lambda: _served(client), 20, "the unclean leader to serve")
        assert client.epochs_at({0: [8, 12, 16]}) == {0: {8: start.epoch, 12: None, 16: None}}  # above its HW
        pieces = fence_pieces(client, splits, {0: start.epoch}, {0: end.epoch})
        assert [(p.start, p.start_epoch, p.end_epoch) for p in pieces] == [(o, end.epoch, end.epoch)
                                                                           for o in (4, 8, 12, 16)]
        client.upsert([{"id": i, "v": "c"} for i in range(30, 42)])  # offsets 8..19 of the new leader's log
    ctx = _context(c, table)
    assert _read(ctx, pieces[0]) == ([4, 5, 6, 7], None)
    for piece, lost in zip(pieces[1:], ("8..11", "8..11", "8..15")):
        emitted, error = _read(ctx, piece)
        assert emitted == [] and isinstance(error, errors.DataLostError), (piece, emitted, error)
        assert re.search(rf"bucket 0 of {TABLE}: offsets {lost} this query read were lost when tablet server "
                         rf"{follower}, out of sync, was elected its leader", error.message), error.message


def test_an_offset_from_a_checkpoint_written_before_epochs_is_fenced_from_its_first_fetch(cluster, tmp_path):
    """The query's offset has no ``"epoch"`` (a checkpoint of the version before epochs): the next batch's first
    fetch is fenced by the epoch below the batch's end, asked before the plan's loss check; a restore that
    reuses offsets the query read before that fetch fails it with DATA_LOST, and nothing is emitted."""
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, TABLE, tail=5)  # snapshot at offset 10, then offsets 10..14
    given = {"bootstrap": c.coordinator.address, "table": TABLE, "startup.mode": "earliest"}
    stream = StreamReader(opts.parse(given), _context(c, table))
    try:
        start = stream.initialOffset()
        first = stream.latestOffset(start, ReadAllAvailable())
        assert sorted(_rows(stream, start, first)) == list(range(15))  # the query read offsets 0..14
        stream.commit(first)
        old = {**first, "buckets": {"0": {k: v for k, v in first["buckets"]["0"].items() if k != "epoch"}}}
        with TableClient(c.admin, TABLE) as client:
            client.upsert([{"id": i, "v": "more"} for i in range(15, 18)])  # offsets 15..17
        second = stream.latestOffset(old, ReadAllAvailable())
        [split] = stream.partitions(old, second)
        assert (split.start, split.start_epoch) == (15, second["buckets"]["0"]["epoch"])  # never unfenced

        assert server.log_ends.run_once() == 1
        lose_and_restore(c, tmp_path, table, range(100, 110))  # offsets 10..19 of the restored log
        emitted, error = _read(stream.ctx, split)
        assert emitted == [] and isinstance(error, errors.DataLostError), (emitted, error)
        assert re.search(rf"bucket 0 of {TABLE}: offsets 10\.\.14 this query read were lost when the bucket was "
                         rf"restored from snapshot 1", error.message), error.message
    finally:
        stream.stop()


def test_a_restore_starting_inside_a_planned_range_fails_the_split_at_the_first_reused_offset(cluster, tmp_path):
    """The batch of offsets 10..19 is planned; the bucket is then restored from its snapshot at offset 10 and new
    changes take offsets 10..: the split's first fetch (from 10) is served, as nothing below 10 was lost, but its
    entries are of a newer leader epoch than the one below the planned end, so the split fails with DATA_LOST
    naming offsets 10..19 and emits nothing of them."""
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, TABLE, tail=10)  # snapshot at offset 10, then offsets 10..19
    given = {"bootstrap": c.coordinator.address, "table": TABLE, "startup.mode": "earliest"}
    stream = StreamReader(opts.parse(given), _context(c, table))
    try:
        start = stream.initialOffset()
        first = stream.latestOffset(start, ReadMaxRows(10))
        assert sorted(_rows(stream, start, first)) == list(range(10))  # offsets 0..9
        stream.commit(first)
        second = stream.latestOffset(first, ReadAllAvailable())
        [split] = stream.partitions(first, second)
        assert (split.start, split.end) == (10, 20)

        assert server.log_ends.run_once() == 1
        lose_and_restore(c, tmp_path, table, range(100, 112))  # offsets 10..21 of the restored log
        emitted, error = _read(stream.ctx, split)
        assert emitted == [] and isinstance(error, errors.DataLostError), (emitted, error)
        assert re.search(rf"bucket 0 of {TABLE}: offsets 10\.\.19 this query read were lost when the bucket was "
                         rf"restored from snapshot 1", error.message), error.message
    finally:
        stream.stop()
