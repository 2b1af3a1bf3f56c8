"""Tier 1: the writer sequence table of idempotent writes (tablet/log/sequences.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvlease.tablet.log.sequences import (APPEND, MAX_SEQUENCE, NO_WRITER, BatchMeta, Duplicate, OutOfOrder,
                                          SequenceTable, WriterBatch)

pytestmark = pytest.mark.unit

W = 7


def table_with(batches: int, *, window: int = 5, committed: int = 10**9, writer: int = W) -> SequenceTable:
    """``batches`` batches of 2 sequences and 3 records each: batch i has sequences 2i..2i+1, offsets 3i..3i+2."""
    t = SequenceTable(window=window, committed=committed)
    for i in range(batches):
        t.record(writer, 2 * i, 2 * i + 1, 3 * i, 3 * i + 2, 1_000 + i)
    return t


def test_a_new_writer_starts_at_zero() -> None:
    t = SequenceTable()
    assert t.check(W, 0, 3) == APPEND
    assert t.check(W, 1, 3) == OutOfOrder(0)
    assert len(t) == 0 and t.last_sequence(W) is None


def test_not_idempotent_writes_are_always_appended_and_never_recorded() -> None:
    t = table_with(2, writer=1)
    assert t.check(NO_WRITER, 5, 5) == APPEND
    assert t.check(NO_WRITER, 0, 0) == APPEND
    t.record(NO_WRITER, 0, 0, 100, 100, 0)
    assert list(t.view()) == [1]


def test_next_in_order_gap_and_overlap() -> None:
    t = table_with(3)  # sequences 0..5
    assert t.last_sequence(W) == 5
    assert t.check(W, 6, 6) == APPEND
    assert t.check(W, 6, 9) == APPEND
    assert t.check(W, 7, 7) == OutOfOrder(6)  # a gap
    assert t.check(W, 4, 6) == OutOfOrder(6)  # overlaps the newest batch
    assert t.check(W, 2, 2) == OutOfOrder(6)  # inside a remembered batch, not the batch itself


def test_a_retry_gets_the_original_offsets() -> None:
    t = table_with(3)
    assert t.check(W, 4, 5) == Duplicate(6, 8)
    assert t.check(W, 0, 1) == Duplicate(0, 2)


def test_duplicates_at_the_window_edge() -> None:
    t = table_with(6, window=5)  # batches 0..5; batch 0 fell out of the window
    assert t.check(W, 2, 3) == Duplicate(3, 5)  # the oldest remembered
    assert t.check(W, 0, 1) == OutOfOrder(12)  # one older than the window
    assert len(t.view()[W]) == 5


def test_the_window_is_the_same_while_batches_are_uncommitted() -> None:
    t = table_with(6, window=5, committed=0)  # nothing committed: all six kept for a truncation
    assert t.check(W, 0, 1) == OutOfOrder(12)  # but answers come from the newest five only
    assert t.view() == table_with(6, window=5).view()


# -- ranges: no wrap -------------------------------------------------------------

def test_the_last_sequence_is_the_maximum_and_nothing_wraps() -> None:
    t = SequenceTable(committed=10**9)
    t.record(W, 0, MAX_SEQUENCE - 1, 0, 9, 0)
    assert t.check(W, MAX_SEQUENCE, MAX_SEQUENCE) == APPEND
    t.record(W, MAX_SEQUENCE, MAX_SEQUENCE, 10, 10, 0)
    with pytest.raises(ValueError, match="new id"):
        t.check(W, MAX_SEQUENCE + 1, MAX_SEQUENCE + 1)
    assert t.check(W, 0, 0) == OutOfOrder(MAX_SEQUENCE + 1)  # no wrap to 0: a new writer id is needed


@pytest.mark.parametrize("writer, first, last", [
    (W, -1, 0), (W, 3, 2), (W, 0, MAX_SEQUENCE + 1), (-2, 0, 0), (2**63, 0, 0),
])
def test_out_of_range_raises(writer: int, first: int, last: int) -> None:
    t = SequenceTable()
    with pytest.raises(ValueError):
        t.check(writer, first, last)
    with pytest.raises(ValueError):
        t.record(writer, first, last, 0, 0, 0)
    assert len(t) == 0


@pytest.mark.parametrize("base, last", [(6, 9), (8, 8), (11, 10), (-1, 0)])
def test_record_refuses_offsets_that_do_not_follow(base: int, last: int) -> None:
    t = table_with(3)  # newest batch at offsets 6..8
    with pytest.raises(ValueError):
        t.record(W, 6, 6, base, last, 0)
    with pytest.raises(ValueError):
        t.record(W + 1, 0, 0, 5, 4, 0)
    assert t.view() == table_with(3).view()  # unchanged, and no empty writer left behind


# -- truncation -----------------------------------------------------------------

def test_truncation_in_the_middle_of_a_batch_forgets_it() -> None:
    t = table_with(3, committed=0)  # offsets 0..2, 3..5, 6..8
    t.truncate_from(7)
    assert t.last_sequence(W) == 3
    assert t.check(W, 4, 5) == APPEND  # the retry of the lost batch is appended again


def test_a_writer_truncated_away_is_unknown() -> None:
    t = table_with(2, committed=0)
    t.record(W + 1, 0, 0, 6, 6, 0)
    t.truncate_from(6)
    assert list(t.view()) == [W]
    assert t.check(W + 1, 0, 0) == APPEND


def test_truncation_below_the_committed_offset_is_refused() -> None:
    t = table_with(3, committed=0)
    t.advance_committed(6)
    t.advance_committed(2)  # never backwards
    assert t.committed == 6
    with pytest.raises(ValueError, match="rebuild"):
        t.truncate_from(5)
    t.truncate_from(6)
    assert t.last_sequence(W) == 3


def test_truncation_brings_back_batches_that_had_left_the_window() -> None:
    t = SequenceTable(window=2, committed=0)
    for i in range(5):
        t.record(W, i, i, i, i, 0)
        t.advance_committed(3)  # offsets 0..2 committed, 3 and 4 not
    t.truncate_from(3)
    assert t.view() == {W: (BatchMeta(1, 1, 1, 1, 0), BatchMeta(2, 2, 2, 2, 0))}
    assert t.check(W, 1, 1) == Duplicate(1, 1)


# -- expiry ---------------------------------------------------------------------

def test_idle_writers_expire() -> None:
    t = table_with(2, committed=100)  # newest batch of W at time 1_001
    t.record(W + 1, 0, 0, 50, 50, 5_000)
    assert t.expire(1_001 + 3_000, 3_000) == []  # exactly the expiration: not idle for longer
    assert t.expire(1_001 + 3_001, 3_000) == [W]
    assert t.check(W, 4, 5) == OutOfOrder(0)  # forgotten: the client takes a new writer id
    assert t.expire(10**6, 3_000) == [W + 1]
    assert len(t) == 0


def test_a_writer_with_an_uncommitted_batch_does_not_expire() -> None:
    t = table_with(2, committed=4)  # the newest batch, offsets 3..5, is not committed
    assert t.expire(10**9, 1) == []
    t.advance_committed(6)
    assert t.expire(10**9, 1) == [W]


# -- properties -----------------------------------------------------------------

@st.composite
def logs(draw: st.DrawFn) -> list[WriterBatch]:
    """Entries in log order from a few writers (each numbering its batches in order) and unidempotent ones."""
    entries, offset, next_seq = [], 0, {1: 0, 2: 0, 3: 0}
    for _ in range(draw(st.integers(0, 25))):
        writer = draw(st.sampled_from([1, 2, 3, NO_WRITER]))
        count, seqs = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        first = next_seq.get(writer, 0)
        entries.append(WriterBatch(writer, first, first + seqs - 1, offset, offset + count - 1, offset))
        next_seq[writer] = first + seqs
        offset += count
    return entries


def replay(entries: list[WriterBatch], committed: int, window: int) -> SequenceTable:
    t = SequenceTable(window=window)
    t.rebuild(entries, committed=committed)
    return t


@settings(max_examples=300, deadline=None)
@given(logs(), st.integers(0, 60), st.integers(0, 60), st.integers(1, 4))
def test_truncating_gives_the_table_of_the_remaining_entries(entries: list[WriterBatch], committed: int,
                                                             cut: int, window: int) -> None:
    committed, cut = min(committed, cut), max(committed, cut)
    t = SequenceTable(window=window)
    for e in entries:  # as a replica: records, and learns the HW as it goes
        t.record(e.writer_id, e.first_seq, e.last_seq, e.base_offset, e.last_offset, e.time_ms)
        t.advance_committed(min(committed, e.last_offset))
    t.advance_committed(committed)
    t.truncate_from(cut)
    remaining = [e for e in entries if e.last_offset < cut]
    assert t.view() == replay(remaining, 0, window).view()
    # the same entries give the same table, whatever was known to be committed
    assert replay(entries, committed, window).view() == replay(entries, 0, window).view() \
        == replay(entries, 10**9, window).view()
