"""KeyRanges: the key ranges that let a write skip before-image lookups of keys that cannot exist."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from kvlease.tablet.store.key_ranges import MAX_RANGES, KeyRanges

pytestmark = pytest.mark.unit


def k(i: int) -> bytes:
    return i.to_bytes(8, "big")


def array(*ids: int) -> pa.Array:
    return pa.array([k(i) for i in ids], pa.binary())


def test_overlapping_ranges_merge_and_disjoint_ones_stay_apart():
    ranges = KeyRanges()
    ranges.add(k(10), k(20))
    ranges.add(k(30), k(40))
    assert ranges.ranges == [(k(10), k(20)), (k(30), k(40))]
    ranges.add(k(15), k(35))
    assert ranges.ranges == [(k(10), k(40))]
    ranges.add(k(41), k(50))  # touching, but without a key width something could lie between
    assert ranges.ranges == [(k(10), k(40)), (k(41), k(50))]
    with pytest.raises(ValueError):
        ranges.add(k(2), k(1))


def test_with_a_key_width_ranges_with_nothing_between_them_merge():
    ranges = KeyRanges(key_width=8)
    for start in (20, 0, 40, 10, 30):  # batches of consecutive ids, out of order
        ranges.add(k(start), k(start + 9))
    assert ranges.ranges == [(k(0), k(49))]
    ranges.add(k(51), k(60))  # 50 may come: stays apart
    assert ranges.ranges == [(k(0), k(49)), (k(51), k(60))]


def test_maybe_stored_is_none_for_a_batch_in_a_gap_and_exact_otherwise():
    ranges = KeyRanges()
    assert ranges.maybe_stored(array(1, 2)) is None  # nothing stored
    ranges.add(k(10), k(20))
    ranges.add(k(40), k(50))
    assert ranges.maybe_stored(array(21, 39, 30)) is None
    assert ranges.maybe_stored(array(60, 99)) is None
    assert ranges.maybe_stored(array()) is None
    assert ranges.maybe_stored(array(5, 10, 20, 21, 45, 51)).tolist() == [False, True, True, False, True, False]


def test_capped_ranges_still_cover_every_key_added():
    rng = random.Random(5)
    ranges, added = KeyRanges(), []
    for _ in range(300):
        low = rng.randrange(10_000)
        high = low + rng.randrange(20)
        ranges.add(k(low), k(high))
        added += [low, high, rng.randint(low, high)]
        assert len(ranges.ranges) <= MAX_RANGES
        lows = [lo for lo, _ in ranges.ranges]
        assert lows == sorted(lows) and all(a[1] < b[0] for a, b in zip(ranges.ranges, ranges.ranges[1:]))
    assert ranges.maybe_stored(array(*added)).all()
    assert ranges.maybe_stored(array(20_000, 30_000)) is None
