"""The Spark stream's fetches fenced by the leader epoch, without Spark: offsets carry per bucket the epoch
of the entry below the offset (older offsets without it still load; an end cut by a read limit, a later
split piece and a startup position ask it before the loss check), a split's first fetch sends it and
later fetches the last entry's, and a split whose fetch is refused with DATA_LOST emits nothing of it and
fails naming the range as the query's loss check does. (Real servers: tests/tablet/replication/
test_read_fencing_cluster.py; the stream on real Spark: tests/spark_source/test_spark_data_lost.py.)"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from kvlease.client.log_position import LogPosition
from kvlease.client.transport import RetryPolicy
from kvlease.common import errors
from kvlease.common.data_loss import RESTORE, DataLoss
from kvlease.common.logentry import ChangeType, decode_entry, encode_payload, frame_header, record_batch
from kvlease.common.tables import Column, TableInfo
from kvlease.spark_source.changelog import read_entries
from kvlease.spark_source.enumerator import plan_changes
from kvlease.spark_source.reader import _loss_named
from kvlease.spark_source.splits import LogSplit, ReadContext
from kvlease.spark_source.stream import StreamReader
from kvlease.spark_source.stream_offsets import _offset, _parse, _with_epochs
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


def test_an_entry_under_an_epoch_newer_than_the_planned_ends_fails_the_read_before_it_is_handed_on():
    leader = Leader([1, 1, 3, 3, 3])  # a loss rewrote offsets 2.. under epoch 3 after the range was planned
    read = []
    with pytest.raises(errors.DataLostError, match=r"offsets 2\.\.3 were planned when the entry below offset 4 "
                                                   r"had leader epoch 1, .* \(written under leader epoch 3\)") as raised:
        for e in read_entries(leader, 0, 0, 4, start_epoch=None, end_epoch=1):
            read.append(e.base_offset)
    assert read == [0, 1] and raised.value.details == {"bucket": 0, "from_offset": 2, "position": 4}
    assert [e.base_offset for e in read_entries(leader, 0, 0, 4, end_epoch=3)] == [0, 1, 2, 3]  # as planned


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
    """A one-bucket table's ListOffsets: the log holds entries under ``epochs[offset]`` from ``log_start`` on;
    records what was asked, and when (``calls``, shared with :class:`_Admin` to see the loss check)."""

    def __init__(self, epochs: list[int], log_start: int = 0, calls: list | None = None, hw: int | None = None) -> None:
        """``hw``: the high watermark of the leader that answers epochs (a new leader not caught up yet;
        default: the log's end)."""
        self.epochs, self.log_start, self.calls = epochs, log_start, [] if calls is None else calls
        self.hw = len(epochs) if hw is None else hw

    def _epoch(self, offset: int) -> int | None:
        return self.epochs[offset - 1] if self.log_start < offset <= self.hw else None

    def end_positions(self):
        return {0: LogPosition(len(self.epochs), self.epochs[-1] if self.epochs else None)}

    def list_offsets(self, buckets=None, timestamp=None):
        return {0: 5} if timestamp is not None else {0: (self.log_start, len(self.epochs))}

    def epochs_at(self, offsets):
        self.calls.append(("epochs_at", {b: sorted(at) for b, at in offsets.items()}))
        return {b: {o: self._epoch(o) for o in at} for b, at in offsets.items()}

    def positions(self, offsets):
        self.calls.append(("positions", dict(offsets)))
        return {b: LogPosition(o, self._epoch(o)) for b, o in offsets.items()}


class _CheckedAdmin(_Admin):
    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls

    def get_table_assignment(self, table_id):
        self.calls.append(("loss check",))
        return super().get_table_assignment(table_id)

    def get_table_by_id(self, table_id):  # the stream's schema check (spark_source/stream_schema.py): unchanged
        return TABLE


def _stream(table, split_max_rows=None, **options) -> StreamReader:
    given = SimpleNamespace(split_max_rows=split_max_rows, startup_mode="earliest", startup_timestamp_ms=None)
    given.__dict__.update(options)
    stream = StreamReader(given, ReadContext((), TABLE, None, ("id",)))
    stream._clients = (_CheckedAdmin(table.calls if table is not None else []), table)
    return stream


EPOCHS = [1] * 10 + [2] * 2 + [3] * 3  # offsets 0..9 under epoch 1, 10..11 under 2, 12..14 under 3


def test_the_planned_end_carries_the_epoch_list_offsets_told():
    table = _Table(EPOCHS)
    stream = _stream(table)
    start = _offset(None, {0: (-1, 10)}, 7, None, {0: 1})
    end = stream.latestOffset(start, SimpleNamespace())
    assert end["buckets"]["0"] == {"snapshot": -1, "offset": 15, "epoch": 3}
    assert table.calls == [("loss check",)]  # the end's epoch came with the end: nothing asked


def test_an_end_cut_by_a_read_limit_carries_the_epoch_asked_before_the_loss_check():
    table = _Table(EPOCHS)
    stream = _stream(table)
    start = _offset(None, {0: (-1, 10)}, 7, None, {0: 1})
    end = stream.latestOffset(start, ReadMaxRows(2))  # maxRowsPerTrigger: 10..11
    assert end["buckets"]["0"] == {"snapshot": -1, "offset": 12, "epoch": 2}
    assert table.calls == [("positions", {0: 12}), ("loss check",)]
    table.calls.clear()
    stream._target = {0: LogPosition(11, None)}  # Trigger.AvailableNow's target, the log's end when it began
    assert stream.latestOffset(start, SimpleNamespace())["buckets"]["0"]["epoch"] == 2
    table.calls.clear()
    assert stream.latestOffset(end, ReadMaxRows(2)) == end  # nothing new below the target: asks nothing
    assert table.calls == [("loss check",)]


def test_the_first_split_of_a_range_starts_with_the_start_epoch_and_later_pieces_with_the_asked_ones():
    table = _Table(EPOCHS)
    stream = _stream(table, split_max_rows=2)
    start, end = _offset(None, {0: (-1, 9)}, 7, None, {0: 1}), _offset(None, {0: (-1, 14)}, 7, None, {0: 3})
    splits = stream.partitions(start, end)
    assert [(s.start, s.end, s.start_epoch, s.end_epoch) for s in splits] == [(9, 11, 1, 3), (11, 13, 2, 3),
                                                                               (13, 14, 3, 3)]
    assert table.calls == [("epochs_at", {0: [11, 13]}), ("loss check",)]
    table.calls.clear()
    assert [s.start_epoch for s in _stream(table).partitions(start, end)] == [1]  # one piece: nothing asked
    assert table.calls == [("loss check",)]


def test_a_checkpoint_written_before_epochs_is_fenced_from_its_first_fetch_by_the_end_epoch():
    """An offset without ``"epoch"`` (it still loads): the first piece starts with the epoch below the batch's
    end, the end's own when the end offset tells it, else asked with the later pieces before the loss check."""
    table = _Table(EPOCHS)
    stream = _stream(table, split_max_rows=2)
    old_start = {"table": 7, "lease": None, "buckets": {"0": {"snapshot": -1, "offset": 9}}}
    end = _offset(None, {0: (-1, 14)}, 7, None, {0: 3})  # planned by this version: it tells its epoch
    assert [(s.start, s.start_epoch) for s in stream.partitions(old_start, end)] == [(9, 3), (11, 2), (13, 3)]
    table.calls.clear()
    old_end = {"table": 7, "lease": None, "buckets": {"0": {"snapshot": -1, "offset": 13}}}  # replayed as logged
    splits = stream.partitions(old_start, old_end)
    assert [(s.start, s.start_epoch, s.end_epoch) for s in splits] == [(9, 3, 3), (11, 2, 3)]
    assert table.calls == [("epochs_at", {0: [11, 13]}), ("loss check",)]


def test_a_piece_above_the_leaders_high_watermark_starts_with_the_end_epoch():
    """Right after a failover the leader asked may not have caught up to the end the range was planned to
    (its high watermark below a later piece's start: no epoch there yet): that piece starts with the epoch
    below the end, a bound of the same history, never unfenced."""
    table = _Table(EPOCHS, hw=11)
    start, end = _offset(None, {0: (-1, 7)}, 7, None, {0: 1}), _offset(None, {0: (-1, 15)}, 7, None, {0: 3})
    splits = _stream(table, split_max_rows=3).partitions(start, end)
    assert [(s.start, s.start_epoch, s.end_epoch) for s in splits] == [(7, 1, 3), (10, 1, 3), (13, 3, 3)]
    options = SimpleNamespace(startup_mode="earliest", ending_timestamp_ms=None, ending_offsets=None,
                              split_max_rows=5)
    table.table = TABLE
    assert [(s.start, s.start_epoch, s.end_epoch) for s in plan_changes(table, options)] == [
        (0, 3, 3), (5, 1, 3), (10, 1, 3)]  # the log's start: the end's epoch too; 10 <= HW: its own


def test_an_end_the_leader_cannot_tell_the_epoch_of_takes_the_latest_epoch_as_its_bound():
    table = _Table(EPOCHS, hw=11)  # the end's epoch is asked of a leader that has not caught up to 12
    end = _stream(table).latestOffset(_offset(None, {0: (-1, 10)}, 7, None, {0: 1}), ReadMaxRows(2))
    assert end["buckets"]["0"] == {"snapshot": -1, "offset": 12, "epoch": 3}  # the log's end's (15), a bound


@pytest.mark.parametrize("mode, offset, epoch", [("latest", 15, 3), ("timestamp", 5, 1), ("earliest", 3, None)])
def test_a_startup_position_carries_the_epoch_below_it(mode, offset, epoch):
    table = _Table(EPOCHS, log_start=3)
    start = _stream(table, startup_mode=mode, startup_timestamp_ms=0).initialOffset()
    assert _with_epochs(_parse(start)[2], start) == {0: ((-1, offset), epoch)}
    # the log's start: nothing of the log below it, nothing asked
    assert ("positions", {0: 3}) not in table.calls


def test_a_batch_change_feed_fences_its_first_piece_by_the_start_and_later_ones_by_their_own():
    table = _Table(EPOCHS)
    table.table = TABLE
    options = SimpleNamespace(startup_mode="timestamp", startup_timestamp_ms=0, ending_timestamp_ms=None,
                              ending_offsets=None, split_max_rows=4)
    splits = plan_changes(table, options)  # from offset 5 (the timestamp's) to the end, 15
    assert [(s.start, s.end, s.start_epoch) for s in splits] == [(5, 9, 1), (9, 13, 1), (13, 15, 3)]
    assert table.calls == [("positions", {0: 5}), ("epochs_at", {0: [9, 13]})]
