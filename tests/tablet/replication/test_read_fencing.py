"""Tier 1: where a reader's history left a bucket's log (EpochCache.reader_divergence, KIP-320's fetch
fencing), the reader's position (client/log_position.py) and the epoch below a planned start
(BucketReads.epochs_at, over a real store).

A log is modelled as the list of the epochs its records were written under (as in test_epochs.py); a
reader sends the epoch of the record just below the offset it reads from.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from kvlease.client.log_position import LogPosition
from kvlease.common.logentry import NO_ID, LogEntry
from kvlease.tablet.log.epochs import EpochCache
from tests.tablet.log.test_epochs import cache_of
from tests.tablet.bucket.test_bucket import bucket_dir, rows  # noqa: F401
from tests.tablet.bucket.test_bucket_replicated import open_store

pytestmark = pytest.mark.unit


def test_a_reader_of_the_same_history_is_never_refused() -> None:
    log = [1, 1, 2, 2, 2, 4, 4]
    cache = cache_of(log)
    cache.assign(5, len(log))  # a clean new leader assigns its epoch at its log end
    for offset in range(1, len(log) + 1):
        assert cache.reader_divergence(log[offset - 1], offset, len(log)) is None, offset


def test_a_restored_log_refuses_a_reader_past_its_start_and_not_one_at_it() -> None:
    # the lost history: epoch 1 wrote offsets 0..14; the restore started the log at its snapshot, 10
    restored = EpochCache()
    restored.assign(3, 10)  # the restored leader's epoch; then new changes at 10, 11, ...
    assert restored.reader_divergence(1, 15, 16) == 10  # it read 10..14 of the lost history
    assert restored.reader_divergence(1, 11, 16) == 10
    assert restored.reader_divergence(1, 10, 16) is None  # 0..9 are the snapshot's: its history too
    assert restored.reader_divergence(3, 12, 16) is None  # a reader of the new log


def test_an_empty_cache_refuses_only_a_reader_past_the_log_end() -> None:
    empty = EpochCache()  # restored at 10, nothing written or led yet
    assert empty.reader_divergence(1, 12, 10) == 10
    assert empty.reader_divergence(1, 10, 10) is None


def test_an_unclean_leader_refuses_readers_past_its_own_end_of_their_epoch() -> None:
    lost = [1] * 8 + [2] * 4  # the lost leader's log: epoch 2 wrote 8..11 while the new leader was out
    new = cache_of([1] * 8)
    new.assign(3, 8)  # elected unclean at its log end, 8; writes 8.. under 3
    assert new.reader_divergence(lost[11], 12, 14) == 8
    assert new.reader_divergence(lost[7], 8, 14) is None
    assert new.reader_divergence(lost[5], 6, 14) is None  # below the divergence: the same history


def test_a_log_that_never_had_the_readers_epoch_refuses_below_the_offset() -> None:
    # the reader read offset 5 under epoch 2, which this log never had: it holds offsets up to 9 under 1
    log = cache_of([1] * 10 + [3] * 2)
    assert log.reader_divergence(2, 6, 12) == 5


def _entry(base: int, count: int, epoch: int) -> LogEntry:
    records = pa.RecordBatch.from_pydict({"change_type": pa.array([0] * count, pa.int8()),
                                          "key": pa.array([b"k"] * count), "value": pa.array([b"v"] * count)})
    return LogEntry(base, records, 0, epoch)


def test_a_position_moves_to_the_end_and_epoch_of_the_last_entry_read() -> None:
    start = LogPosition(3)
    assert start.after([]) == start
    assert start.after([_entry(3, 2, 4), _entry(5, 3, 6)]) == LogPosition(8, 6)
    assert LogPosition(8, 6).after([_entry(8, 1, NO_ID)]) == LogPosition(9, None)  # written without an epoch


def test_the_epoch_below_a_planned_start_is_told_only_for_committed_entries(bucket_dir):  # noqa: F811
    with open_store(bucket_dir) as store:
        store.become_leader(1)
        store.write(rows((1, "a", 0.0), (2, "b", 0.0)))  # offsets 0, 1 under epoch 1
        store.become_leader(3)
        store.write(rows((3, "c", 0.0)))  # offset 2 under epoch 3
        store.advance_high_watermark(2)
        # 0: nothing below; 3: offset 2 is above the high watermark; 4: past the log end
        assert store.epochs_at([0, 1, 2, 3, 4]) == [None, 1, 1, None, None]
        store.advance_high_watermark(3)
        assert store.epochs_at([3, 2, 3]) == [3, 1, 3]  # in the order asked, repeats answered
        assert store.end_epoch() == (0, 3, store.epochs_at([3])[0])
        assert store.epochs_at([]) == []
