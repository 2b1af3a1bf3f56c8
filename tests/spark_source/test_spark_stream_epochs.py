"""The Spark stream's fetches fenced by the leader epoch, without Spark: offsets carry per bucket the epoch
of the entry below the offset (older offsets without it still load), a split's first fetch sends it and
later fetches the last entry's, and a split whose fetch is refused with DATA_LOST emits nothing of it and
fails naming the range as the query's loss check does. (Real servers: tests/tablet/replication/
test_read_fencing_cluster.py; the stream on real Spark: tests/spark_source/test_spark_data_lost.py.)"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from client.log_position import LogPosition
from client.transport import RetryPolicy
from common import errors
from common.data_loss import RESTORE, DataLoss
from common.logentry import ChangeType, decode_entry, encode_payload, frame_header, record_batch
from common.tables import Column, TableInfo
from spark_source.changelog import read_entries
from spark_source.reader import _loss_named
from spark_source.splits import LogSplit, ReadContext
from spark_source.stream import StreamReader, _offset, _parse, _with_epochs
from tests.spark_source.test_spark_stream_losses import _Admin

pytestmark = pytest.mark.unit

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 1)


def entry(offset: int, epoch: int) -> object:
    payload = encode_payload(record_batch([ChangeType.INSERT], [b"k%d" % offset], [b"v"]))
    return decode_entry(frame_header(offset, 1, payload, 1, leader_epoch=epoch) + payload.to_pybytes())


class Leader:
    """Serves one entry per fetch under ``epochs[offset]``; a fetch from ``lost_at`` on is refused with
    DATA_LOST (as the tablet server tells it: a message, no details). Records the epochs fetches sent."""

    def __init__(self, epochs: list[int], lost_at: int | None = None) -> None:
        self.epochs, self.lost_at, self.sent = epochs, lost_at, []
        self.table = SimpleNamespace(path="db.t")
        self.retry = RetryPolicy(1.0, 0.01, time.sleep)

    def fetch_log_entries(self, bucket, offset, max_bytes, last_fetched_epoch=None):
        self.sent.append((offset, last_fetched_epoch))
        if self.lost_at is not None and offset >= self.lost_at:
            raise errors.DataLostError(f"bucket 0 of db.t: offsets 2..{offset - 1} this reader read (...) are not "
                                       f"in the bucket's log any more")
        return [entry(offset, self.epochs[offset])], len(self.epochs)


def test_each_fetch_sends_the_epoch_of_the_entry_below_it():
    leader = Leader([1, 1, 2, 2, 3])
    assert [e.base_offset for e in read_entries(leader, 0, 1, 5, start_epoch=1)] == [1, 2, 3, 4]
    assert leader.sent == [(1, 1), (2, 1), (3, 2), (4, 2)]
    leader.sent.clear()
    list(read_entries(leader, 0, 3, 4))  # an offset without an epoch (an old checkpoint): sent unset
    assert leader.sent == [(3, None)]


def test_a_refused_fetch_emits_nothing_and_names_where_it_was_refused():
    leader = Leader([1, 1, 1, 1, 1, 1], lost_at=3)
    read = []
    with pytest.raises(errors.DataLostError, match=r"offsets 2\.\.2 this reader read") as raised:
        for e in read_entries(leader, 0, 0, 6, start_epoch=None):
            read.append(e.base_offset)
    assert read == [0, 1, 2] and raised.value.details == {"bucket": 0, "position": 3}


def _split_read(admin, leader: Leader, split: LogSplit) -> tuple[list[int], BaseException | None]:
    ctx = ReadContext((), TABLE, None, ("id",))
    emitted: list[int] = []
    try:
        for e in _loss_named(admin, ctx, split, read_entries(leader, 0, split.start, split.end, split.start_epoch)):
            emitted.append(e.base_offset)
    except errors.KvLeaseError as exc:
        return emitted, exc
    return emitted, None


def test_a_split_refused_by_data_lost_fails_as_the_query_loss_check_says():
    split = LogSplit(0, 0, 6, start_epoch=None, losses_seen=0)
    loss = DataLoss(RESTORE, 3, 2, 6, 4, 0, 1)  # restored from snapshot 4 at offset 2
    emitted, error = _split_read(_Admin(loss), Leader([1] * 6, lost_at=3), split)
    assert emitted == [0, 1, 2] and isinstance(error, errors.DataLostError)
    assert "offsets 2..2 this query read were lost when the bucket was restored from snapshot 4" in error.message
    # the loss record not there (yet): the server's word
    emitted, error = _split_read(_Admin(), Leader([1] * 6, lost_at=3), split)
    assert emitted == [0, 1, 2] and "offsets 2..2 this reader read" in error.message


def test_offsets_carry_the_epoch_below_and_old_offsets_have_none():
    doc = _offset(None, {0: (-1, 15), 1: (-1, 3)}, 7, {0: 1}, {0: 4, 1: None})
    assert doc["buckets"]["0"] == {"snapshot": -1, "offset": 15, "losses": 1, "epoch": 4}
    assert "epoch" not in doc["buckets"]["1"]
    assert _with_epochs(_parse(doc)[2], doc) == {0: ((-1, 15), 4), 1: ((-1, 3), None)}
    old = {"buckets": {"0": {"snapshot": -1, "offset": 5}}}  # a checkpoint of the previous version
    assert _with_epochs(_parse(old)[2], old) == {0: ((-1, 5), None)}


class _Table:
    def __init__(self, positions: dict[int, LogPosition]) -> None:
        self.positions = positions

    def end_positions(self):
        return dict(self.positions)


def _stream(table, split_max_rows=None) -> StreamReader:
    stream = StreamReader(SimpleNamespace(split_max_rows=split_max_rows), ReadContext((), TABLE, None, ("id",)))
    stream._clients = (_Admin(), table)
    return stream


def test_the_planned_end_carries_the_epoch_list_offsets_told():
    stream = _stream(_Table({0: LogPosition(12, 3)}))
    start = _offset(None, {0: (-1, 10)}, 7, None, {0: 2})
    end = stream.latestOffset(start, SimpleNamespace())
    assert end["buckets"]["0"] == {"snapshot": -1, "offset": 12, "epoch": 3}
    stream._target = {0: LogPosition(11, None)}  # an end not at the log's end: its epoch is not known
    assert "epoch" not in stream.latestOffset(start, SimpleNamespace())["buckets"]["0"]


def test_the_first_split_of_a_range_starts_with_the_epoch_of_the_start_offset():
    stream = _stream(None, split_max_rows=2)
    start, end = _offset(None, {0: (-1, 10)}, 7, None, {0: 2}), _offset(None, {0: (-1, 14)}, 7)
    splits = stream.partitions(start, end)
    assert [(s.start, s.end, s.start_epoch) for s in splits] == [(10, 12, 2), (12, 14, None)]
    old_start = {"table": 7, "lease": None, "buckets": {"0": {"snapshot": -1, "offset": 10}}}
    assert [s.start_epoch for s in stream.partitions(old_start, end)] == [None, None]
