"""The Spark stream's guard against reused offsets, without Spark: its offsets record per bucket the loss
records seen (older offsets without them count 0), and a position past an unseen loss fails with DATA_LOST.
(The stream itself on a real cluster and real Spark: tests/spark_source/test_spark_data_lost.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvlease.client.lost_ranges import check_losses
from kvlease.common import errors
from kvlease.common.data_loss import RESTORE, DataLoss
from kvlease.common.tables import Column, TableInfo
from kvlease.spark_source.splits import ReadContext
from kvlease.spark_source.stream import StreamReader
from kvlease.spark_source.stream_offsets import _losses_seen, _offset, _parse


def test_offsets_carry_the_losses_seen_and_old_offsets_count_none():
    doc = _offset(None, {0: (-1, 15), 1: (-1, 3)}, 7, {0: 2, 1: 0})
    assert doc["buckets"]["0"] == {"snapshot": -1, "offset": 15, "losses": 2}
    assert "losses" not in doc["buckets"]["1"]
    assert _losses_seen(doc) == {0: 2, 1: 0}
    assert _parse(doc)[2] == {0: (-1, 15), 1: (-1, 3)}
    assert _losses_seen({"buckets": {"0": {"snapshot": -1, "offset": 5}}}) == {0: 0}


def test_a_query_past_an_unseen_loss_fails_naming_the_range_and_one_before_it_adopts_it():
    loss = DataLoss(RESTORE, 3, 1200, 1535, 4, 0, 1)
    with pytest.raises(errors.DataLostError, match=r"bucket 0 of db\.t: offsets 1200\.\.1533 this query read were "
                                                   r"lost when the bucket was restored from snapshot 4 at .*new "
                                                   r"checkpoint") as raised:
        check_losses("db.t", {0: (loss,)}, {0: 1534}, {})
    assert raised.value.code == 35 and raised.value.details["from_offset"] == 1200
    assert check_losses("db.t", {0: (loss,)}, {0: 1200}, {}) == {0: 1}  # nothing it read was reused
    assert check_losses("db.t", {0: (loss,)}, {0: -1}, {}) == {0: 1}  # not started: adopts it
    assert check_losses("db.t", {0: (loss,)}, {0: 9999}, {0: 1}) == {0: 1}  # seen before


class _Admin:
    """``get_table_assignment`` of a one-bucket table with the given loss records."""

    def __init__(self, *losses: DataLoss) -> None:
        self.losses = losses

    def get_table_assignment(self, table_id):
        return None, {0: SimpleNamespace(losses=self.losses)}


def test_a_batch_planned_before_a_loss_is_not_run_over_the_reused_offsets():
    """Spark runs a logged micro-batch again after a restart (the query died in it) without asking for a new
    offset: its planning checks the batch's range against the losses its end offset has not seen."""
    one_bucket = TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 1)
    stream = StreamReader(SimpleNamespace(split_max_rows=None), ReadContext((), one_bucket, None, ("id",)))
    start, end = _offset(None, {0: (-1, 1000)}, 7, None, {0: 2}), _offset(None, {0: (-1, 1534)}, 7, None, {0: 2})
    stream._clients = (_Admin(), None)
    assert [(s.bucket, s.start, s.end) for s in stream.partitions(start, end)] == [(0, 1000, 1534)]
    stream._clients = (_Admin(DataLoss(RESTORE, 3, 1200, 1535, 4, 0, 1)), None)  # lost after the batch was planned
    with pytest.raises(errors.DataLostError, match=r"bucket 0 of db\.t: offsets 1200\.\.1533"):
        stream.partitions(start, end)
    seen = _offset(None, {0: (-1, 1534)}, 7, {0: 1}, {0: 3})  # a batch planned after it (from 1200 on, say)
    assert len(stream.partitions(_offset(None, {0: (-1, 1200)}, 7, {0: 1}, {0: 3}), seen)) == 1
    stream._clients = (_Admin(DataLoss(RESTORE, 3, 1534, 1600, 4, 0, 1)), None)  # past the batch: nothing reused
    assert len(stream.partitions(start, end)) == 1
