"""The lookups' linearizability checkers (ops/drills/read_checks.py) on hand-made histories (tier 1)."""

from __future__ import annotations

import pytest

from kvlease.ops.drills.read_checks import MAX_LISTED, ReadOp, reads_in_order, reads_see_acknowledged_writes
from kvlease.ops.drills.row_checks import WriteOp

pytestmark = pytest.mark.unit

# Key 1, written by one thread: 1, then 10, then deleted, then 30 (not acknowledged: may or may not have
# happened), then 40. Each write is sent at an even second and answered one second later.
HISTORY = {1: [WriteOp(1, 1, 0.0, 1.0, True), WriteOp(1, 10, 2.0, 3.0, True), WriteOp(1, None, 4.0, 5.0, True),
               WriteOp(1, 30, 6.0, 7.0, False), WriteOp(1, 40, 8.0, 9.0, True)]}


def read(value, t0, t1, key=1, error=""):
    return ReadOp(key, value, t0, t1, error)


def stale(*reads):
    return reads_see_acknowledged_writes(HISTORY, reads)


def test_a_read_of_the_last_acknowledged_write_or_of_one_sent_before_its_answer_passes():
    reads = [read(1, 1.5, 1.6), read(10, 3.5, 3.6),
             read(1, 1.5, 2.5), read(10, 1.5, 2.5),  # the write of 10 was under way: either is right
             read(10, 1.5, 9.5), read(40, 1.5, 9.5)]  # a read that waited through every write: any of them
    check = stale(*reads)
    assert check.ok, check.violations
    assert check.checked == len(reads)


def test_a_read_older_than_a_write_acknowledged_before_it_was_sent_is_caught_with_key_times_and_values():
    check = stale(read(1, 3.5, 3.6))
    assert not check.ok
    (violation,) = check.violations
    assert violation.startswith("key 1: a lookup sent at ") and "answered 0.100s later, read 1" in violation
    assert "the write of 10 was acknowledged" in violation and "0.500s before the lookup was sent" in violation


def test_a_read_of_a_write_not_yet_sent_when_it_was_answered_is_caught():
    assert not stale(read(10, 1.5, 1.9)).ok  # 10 was sent at 2.0, after the answer
    check = stale(read(99, 3.5, 3.6))
    assert "99 was never written to key 1" in check.violations[0]


def test_deletes_no_row_after_an_acknowledged_delete_and_a_row_after_an_acknowledged_upsert():
    assert stale(read(None, 5.5, 5.6)).ok
    assert stale(read(None, 3.5, 4.5), read(10, 3.5, 4.5)).ok  # the delete was sent before the answer
    assert not stale(read(None, 3.5, 3.7)).ok  # 10 acknowledged, nothing deleting it sent yet
    check = stale(read(10, 5.5, 5.6))  # the deleted row read back
    assert "the write of no row was acknowledged" in check.violations[0]
    assert stale(read(None, 0.5, 0.6)).ok  # before the first write was acknowledged: no row is right
    assert not stale(read(None, 1.5, 1.6)).ok


def test_an_unacknowledged_write_may_or_may_not_have_happened_until_an_acknowledged_one_overwrites_it():
    assert stale(read(None, 7.5, 7.6), read(30, 7.5, 7.6)).ok
    check = stale(read(30, 9.5, 9.6))  # 40 was acknowledged at 9.0
    assert "the write of 40 was acknowledged" in check.violations[0]
    assert not stale(read(None, 9.5, 9.6)).ok


def test_failed_reads_are_not_judged():
    check = stale(read(None, 3.5, 8.0, error="RequestTimedOutError"))
    assert check.ok and check.checked == 0


def test_violations_are_listed_up_to_a_limit_and_counted():
    check = stale(*[read(1, 3.5 + i / 1000, 3.6 + i / 1000) for i in range(MAX_LISTED + 5)])
    assert len(check.violations) == MAX_LISTED + 1 and check.violations[-1] == "… and 5 more"
    assert check.checked == MAX_LISTED + 5


def in_order(*reads):
    return reads_in_order(HISTORY, reads)


def test_a_read_sent_after_another_was_answered_may_not_show_an_earlier_write():
    # 30 was never acknowledged, but once a read showed it, it happened: a later read must not show the delete
    assert stale(read(30, 6.5, 6.8), read(None, 7.0, 7.2)).ok  # each alone is allowed
    check = in_order(read(30, 6.5, 6.8), read(None, 7.0, 7.2))
    (violation,) = check.violations
    assert "key 1: a lookup sent at" in violation and "read no row, but one answered at" in violation
    assert "0.200s before it was sent, read 30, a later write (not acknowledged to its writer)" in violation
    # a delete seen, then the row it deleted (the delete not acknowledged yet to its writer)
    assert not in_order(read(None, 4.1, 4.2), read(10, 4.3, 4.4)).ok


def test_reads_that_overlap_may_show_either_order_and_equal_or_later_values_pass():
    assert in_order(read(30, 6.5, 6.8), read(None, 6.7, 7.2)).ok  # sent before the first was answered
    assert in_order(read(None, 4.1, 4.2), read(None, 4.3, 4.4), read(None, 5.5, 5.6), read(40, 8.5, 9.5)).ok
    assert in_order(read(10, 1.5, 2.5), read(1, 1.6, 2.6)).ok
    check = in_order(read(10, 2.1, 2.2), read(1, 2.3, 2.4), read(99, 2.5, 2.6), read(1, 2.7, 2.8, error="X"))
    assert len(check.violations) == 1 and check.checked == 2  # the unexplained 99 is the other check's
