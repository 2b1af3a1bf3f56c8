"""Tier 1: the leader-epoch cache and the divergence of a follower's log (tablet/log/epochs.py).

Logs are modelled as the list of the epochs their records were written
under: a record is named by (epoch, offset), since one leader writes each
epoch. The property test plays random leader changes, appends and partial
copies, and checks that the rounds of KIP-279 always truncate a follower to
exactly the longest common prefix of the two logs.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvlease.tablet.log.epochs import EpochCache, EpochEnd, EpochEntry, Truncation, divergence

pytestmark = pytest.mark.unit


def cache_of(log: list[int]) -> EpochCache:
    """The cache a replica holding ``log`` (one epoch per record) would have built by assigning on append."""
    cache = EpochCache()
    for offset, epoch in enumerate(log):
        if offset == 0 or log[offset - 1] != epoch:
            cache.assign(epoch, offset)
    return cache


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- assign ------------------------------------------------------------------

def test_assign_keeps_epochs_and_starts_growing() -> None:
    cache = EpochCache()
    assert cache.latest_epoch is None and len(cache) == 0
    cache.assign(1, 0)
    cache.assign(3, 10)
    cache.assign(3, 10)  # the same latest pair again: a retried append, no-op
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 10)]
    assert cache.latest_epoch == 3


@pytest.mark.parametrize("epoch, start", [
    (2, 12),   # a stale epoch
    (3, 12),   # the latest epoch at another start
    (4, 10),   # a new epoch at the latest start: the latest epoch would hold no record
    (4, 9),    # a new epoch at a smaller start
    (-1, 20), (5, -1), (True, 20),
])
def test_assign_refuses_what_does_not_follow(epoch: int, start: int) -> None:
    cache = EpochCache([(1, 0), (3, 10)])
    with pytest.raises(ValueError):
        cache.assign(epoch, start)
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 10)]


def test_epoch_at() -> None:
    cache = EpochCache([(2, 5), (4, 10)])
    assert [cache.epoch_at(o) for o in (0, 4, 5, 9, 10, 99)] == [None, None, 2, 2, 4, 4]


# -- truncation ----------------------------------------------------------------

def test_truncate_from_in_the_middle_of_an_epoch_keeps_it() -> None:
    cache = EpochCache([(1, 0), (2, 10), (4, 20)])
    cache.truncate_from(15)
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(2, 10)]
    assert cache.end_offset_for(2, 15) == EpochEnd(2, 15)  # the latest again: ends at the log end


def test_truncate_from_at_an_epoch_start_drops_it_and_all_after() -> None:
    cache = EpochCache([(1, 0), (2, 10), (4, 20)])
    cache.truncate_from(10)
    assert cache.entries == [EpochEntry(1, 0)]
    cache.truncate_from(0)
    assert len(cache) == 0
    cache.assign(5, 0)  # the log starts again under a new epoch
    assert cache.entries == [EpochEntry(5, 0)]


def test_truncate_from_past_the_end_changes_nothing() -> None:
    cache = EpochCache([(1, 0), (2, 10)])
    cache.truncate_from(11)
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(2, 10)]


def test_truncate_before_moves_the_first_kept_epoch_up() -> None:
    cache = EpochCache([(1, 0), (2, 10), (4, 20)])
    cache.truncate_before(5)
    assert cache.entries == [EpochEntry(1, 5), EpochEntry(2, 10), EpochEntry(4, 20)]
    cache.truncate_before(10)
    assert cache.entries == [EpochEntry(2, 10), EpochEntry(4, 20)]
    cache.truncate_before(25)  # into the latest epoch: it stays, starting at the new log start
    assert cache.entries == [EpochEntry(4, 25)]
    cache.truncate_before(3)  # below the start: nothing to do
    assert cache.entries == [EpochEntry(4, 25)]
    with pytest.raises(ValueError):
        cache.assign(5, 25)


# -- OffsetsForLeaderEpoch ---------------------------------------------------

@pytest.mark.parametrize("requested, expected", [
    (2, EpochEnd(2, 20)),   # a known epoch ends where the next starts
    (4, EpochEnd(4, 30)),   # the latest ends at the log end
    (9, EpochEnd(4, 30)),   # newer than any known: the latest
    (3, EpochEnd(2, 20)),   # never had it: the largest smaller epoch, and its end
    (0, EpochEnd(0, 10)),   # older than every known epoch: Kafka's answer, ends at the first known start
])
def test_end_offset_for(requested: int, expected: EpochEnd) -> None:
    assert EpochCache([(1, 10), (2, 15), (4, 20)]).end_offset_for(requested, 30) == expected


def test_end_offset_for_on_an_empty_cache_is_the_log_end() -> None:
    assert EpochCache().end_offset_for(3, 0) == EpochEnd(None, 0)
    assert EpochCache().end_offset_for(3, 42) == EpochEnd(None, 42)


# -- divergence ---------------------------------------------------------------

def test_a_follower_behind_in_the_same_epoch_keeps_everything() -> None:
    leader, follower = [1] * 5 + [2] * 5, [1] * 5 + [2] * 3
    assert divergence(cache_of(leader), 10, cache_of(follower), 8) == 8


def test_a_follower_ahead_of_the_leader_in_the_same_epoch_truncates_to_the_leader_end() -> None:
    leader, follower = [1] * 5 + [2] * 2, [1] * 5 + [2] * 6
    answer = cache_of(leader).end_offset_for(2, 7)
    assert answer == EpochEnd(2, 7)
    assert cache_of(follower).truncation_for(answer, 11) == Truncation(7, True)
    assert divergence(cache_of(leader), 7, cache_of(follower), 11) == 7


def test_a_follower_whose_last_epoch_the_leader_never_had() -> None:
    # the follower led epoch 3 from offset 5 (only it saw those records); the leader went on in epoch 2, then 4
    leader, follower = [1] * 5 + [2] * 3 + [4] * 2, [1] * 5 + [3] * 4
    assert divergence(cache_of(leader), 10, cache_of(follower), 9) == 5


def test_kip101s_single_step_is_not_enough() -> None:
    """Epoch 3's leader wrote 12 records; the future leader copied all, the follower 10, then led epoch 4.

    Asked for epoch 4, the leader answers epoch 3 ending at 12. KIP-101's
    min(follower end, 12) = 12 would keep the follower's epoch-4 records at
    10 and 11, which differ from the leader's. The follower's own end of
    epoch 3 (10) is where they diverge.
    """
    leader, follower = [3] * 12, [3] * 10 + [4] * 5
    answer = cache_of(leader).end_offset_for(4, 12)
    assert answer == EpochEnd(3, 12)
    assert min(len(follower), answer.end_offset) == 12  # the KIP-101 answer, wrong here
    assert cache_of(follower).truncation_for(answer, 15) == Truncation(10, True)
    assert divergence(cache_of(leader), 12, cache_of(follower), 15) == 10 == common_prefix(leader, follower)


def test_several_rounds_when_neither_has_the_others_epoch() -> None:
    leader, follower = [1] * 3 + [2] * 3 + [5] * 2, [1] * 3 + [3] * 2 + [4] * 2
    first = cache_of(leader).end_offset_for(4, 8)
    assert first == EpochEnd(2, 6)
    assert cache_of(follower).truncation_for(first, 7) == Truncation(3, False)  # drop epochs 3 and 4, ask again
    assert divergence(cache_of(leader), 8, cache_of(follower), 7) == 3


def test_a_leader_that_knows_only_newer_epochs() -> None:
    # the leader's log starts at 10 (retention); the follower's epoch 1 runs to 15
    leader = EpochCache([(2, 10)])
    follower = EpochCache([(1, 0)])
    assert leader.end_offset_for(1, 20) == EpochEnd(1, 10)
    assert divergence(leader, 20, follower, 15) == 10


def test_empty_caches() -> None:
    assert divergence(EpochCache(), 0, EpochCache([(1, 0)]), 4) == 0  # the leader holds nothing: drop all
    assert divergence(EpochCache([(1, 0)]), 4, EpochCache(), 0) == 0  # the follower holds nothing: keep it
    assert divergence(EpochCache(), 7, EpochCache(), 7) == 7  # both rebuilt from the same snapshot at 7
    assert EpochCache([(1, 0)]).truncation_for(EpochEnd(None, 0), 4) == Truncation(0, True)


def test_divergence_does_not_change_the_follower_cache() -> None:
    follower = cache_of([1] * 3 + [3] * 2)
    divergence(cache_of([1] * 3 + [2] * 2), 5, follower, 5)
    assert follower == cache_of([1] * 3 + [3] * 2)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Two replicas' logs after random leader changes: each epoch's leader appends, the others copy a part
    of its log (after truncating to their common prefix, as a follower does)."""
    n = draw(st.integers(2, 4))
    logs: list[list[int]] = [[] for _ in range(n)]
    for epoch in range(1, draw(st.integers(1, 7)) + 1):
        leader = draw(st.integers(0, n - 1))
        logs[leader] = logs[leader] + [epoch] * draw(st.integers(0, 4))
        for r in range(n):
            if r != leader and draw(st.booleans()):
                keep = common_prefix(logs[r], logs[leader])
                logs[r] = logs[leader][:draw(st.integers(keep, len(logs[leader])))]
    a, b = draw(st.permutations(range(n)))[:2]
    return logs[a], logs[b]


@settings(max_examples=400, deadline=None)
@given(histories())
def test_divergence_is_the_longest_common_prefix(logs: tuple[list[int], list[int]]) -> None:
    leader, follower = logs
    at = divergence(cache_of(leader), len(leader), cache_of(follower), len(follower))
    assert at == common_prefix(leader, follower)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 5)), max_size=6), st.integers(0, 40))
def test_the_checkpoint_round_trips(steps: list[tuple[int, int]], cut: int) -> None:
    cache, epoch, start = EpochCache(), 0, 0
    for de, ds in steps:
        epoch, start = epoch + de + 1, start + ds
        cache.assign(epoch, start)
    cache.truncate_before(cut)
    assert EpochCache.from_bytes(cache.to_bytes()) == cache


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe", b"{", b"[]", b'{"version": 2, "epochs": []}', b'{"version": 1}',
    b'{"version": 1, "epochs": [[1, 0]], "x": 1}', b'{"version": 1, "epochs": {"1": 0}}',
    b'{"version": 1, "epochs": [[1]]}', b'{"version": 1, "epochs": [[1, "0"]]}',
    b'{"version": 1, "epochs": [[1, 0.5]]}', b'{"version": 1, "epochs": [[2, 0], [1, 5]]}',
    b'{"version": 1, "epochs": [[1, 5], [2, 5]]}', b'{"version": 1, "epochs": [[-1, 0]]}',
    b'{"version": 1, "epochs": [[true, 0]]}',
])
def test_a_corrupt_checkpoint_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        EpochCache.from_bytes(data)


def test_an_empty_checkpoint_is_an_empty_cache() -> None:
    assert len(EpochCache.from_bytes(EpochCache().to_bytes())) == 0
