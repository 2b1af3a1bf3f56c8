"""Tier 1: the leader's view of its followers and the writes waiting for the HW (tablet/replication/isr.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvlease.tablet.replication.isr import LeaderView, PendingAcks, can_write

pytestmark = pytest.mark.unit

MAX_LAG = 10_000


def view(isr: tuple[int, ...] = (1, 2, 3), *, end: int = 10, hw: int = 10, epoch_start: int = 10,
         now: int = 0) -> LeaderView:
    """Leader 1 of replicas 1, 2, 3."""
    return LeaderView(1, (1, 2, 3), isr, leader_log_end=end, high_watermark=hw, epoch_start_offset=epoch_start,
                      now_ms=now)


# -- the high watermark ----------------------------------------------------------

def test_a_new_leader_keeps_its_hw_until_every_isr_follower_fetched() -> None:
    v = view(end=10, hw=6)
    assert v.high_watermark() == 6
    assert not v.on_fetch(2, 10, 5, 10)  # 3 has not fetched: its log end is unknown
    assert v.high_watermark() == 6
    assert v.on_fetch(3, 8, 5, 10)
    assert v.high_watermark() == 8


def test_hw_is_the_lowest_log_end_in_the_isr_with_the_leaders_own() -> None:
    v = view(end=10, hw=10)
    v.on_append(15)
    v.on_fetch(2, 15, 1, 15)
    assert v.high_watermark() == 10  # 3 has not fetched yet
    v.on_fetch(3, 12, 1, 15)
    assert v.high_watermark() == 12
    v.on_fetch(3, 15, 2, 15)
    assert v.high_watermark() == 15
    assert v.committed(15) and not v.committed(16)


def test_a_single_replica_isr_commits_on_append() -> None:
    v = view(isr=(1,), end=0, hw=0, epoch_start=0)
    assert v.on_append(3)
    assert v.high_watermark() == 3


def test_hw_never_moves_backwards_when_a_follower_rejoins_below_it() -> None:
    v = view(isr=(1, 2), end=20, hw=20)
    v.on_fetch(3, 5, 0, 20)  # out of the ISR, far behind
    assert v.set_isr((1, 2, 3)) is False  # say the coordinator's state holds it anyway
    assert v.high_watermark() == 20
    v.on_append(25)
    v.on_fetch(2, 25, 1, 25)
    assert v.high_watermark() == 20  # held by 3 now, not lowered
    v.on_fetch(3, 22, 1, 25)
    assert v.high_watermark() == 22


def test_removing_a_slow_member_advances_the_hw() -> None:
    v = view(end=10, hw=10)
    v.on_append(20)
    v.on_fetch(2, 20, 1, 20)
    v.on_fetch(3, 11, 1, 20)
    assert v.high_watermark() == 11
    v.propose_isr((1, 2))
    assert v.high_watermark() == 11  # not before the coordinator accepted
    assert v.set_isr((1, 2))
    assert v.high_watermark() == 20


def test_hw_waits_for_a_follower_joining_while_the_change_is_in_flight() -> None:
    v = view(isr=(1, 2), end=10, hw=10)
    v.on_fetch(3, 10, 1, 10)
    assert v.expand_candidates() == {3}
    v.propose_isr((1, 2, 3))
    v.on_append(20)
    v.on_fetch(2, 20, 2, 20)
    assert v.high_watermark() == 10  # 3 is joining: the maximal ISR holds it
    v.isr_change_failed()
    assert v.high_watermark() == 20
    with pytest.raises(ValueError):
        v.propose_isr((1, 2, 4))


def test_one_isr_change_at_a_time() -> None:
    v = view()
    v.propose_isr((1, 2))
    with pytest.raises(ValueError):
        v.propose_isr((1,))
    v.set_isr((1, 2))
    assert v.proposed_isr is None and v.isr == {1, 2}


# -- bad input -----------------------------------------------------------------

def test_a_follower_ahead_of_the_leader_is_refused_and_changes_nothing() -> None:
    v = view(end=10, hw=8)
    v.on_fetch(2, 9, 1, 10)
    with pytest.raises(ValueError, match="truncate"):
        v.on_fetch(2, 11, 2, 10)
    assert v.follower(2).log_end == 9 and v.follower(2).last_fetch_ms == 1


@pytest.mark.parametrize("call", [
    lambda v: v.on_fetch(1, 10, 0, 10),   # the leader itself
    lambda v: v.on_fetch(4, 10, 0, 10),   # not a replica
    lambda v: v.on_fetch(2, -1, 0, 10),
    lambda v: v.on_fetch(2, 5, 0, 9),     # the leader's log end went back
    lambda v: v.on_append(9),
    lambda v: v.set_isr((2, 3)),          # without the leader
    lambda v: v.set_isr((1, 4)),          # a non-replica
])
def test_bad_input_raises(call) -> None:
    with pytest.raises(ValueError):
        call(view())


@pytest.mark.parametrize("kwargs", [dict(hw=11), dict(epoch_start=11), dict(isr=(2, 3)), dict(hw=-1)])
def test_a_bad_start_raises(kwargs) -> None:
    with pytest.raises(ValueError):
        view(**kwargs)


# -- shrink and expand -----------------------------------------------------------

def test_a_follower_that_stops_fetching_leaves_after_max_lag() -> None:
    v = view(end=10, hw=10, now=0)
    v.on_append(11)
    assert v.shrink_candidates(MAX_LAG, MAX_LAG) == set()  # exactly max lag: not more
    assert v.shrink_candidates(MAX_LAG + 1, MAX_LAG) == {2, 3}
    v.on_fetch(2, 11, MAX_LAG, 11)
    assert v.shrink_candidates(MAX_LAG + 1, MAX_LAG) == {3}


def test_a_follower_at_the_leaders_end_is_never_lagging() -> None:
    v = view(end=10, hw=10, now=0)
    v.on_fetch(2, 10, 0, 10)
    v.on_fetch(3, 10, 0, 10)
    assert v.shrink_candidates(10 * MAX_LAG, MAX_LAG) == set()  # an idle bucket keeps its ISR


def test_keeping_pace_under_steady_writes_counts_as_caught_up() -> None:
    v = view(isr=(1, 2), end=10, hw=10, now=0)
    end = 10
    for t in range(1, 40):
        end += 5
        v.on_append(end)
        v.on_fetch(2, end - 5, t * 1_000, end)  # always reaches where the leader was at its previous fetch
    assert v.follower(2).last_caught_up_ms == 38_000
    assert v.shrink_candidates(39_000, MAX_LAG) == set()


def test_falling_behind_under_steady_writes_is_lagging() -> None:
    v = view(isr=(1, 2), end=10, hw=10, now=0)
    end = 10
    for t in range(1, 40):
        end += 5
        v.on_append(end)
        v.on_fetch(2, end - 5 - t, t * 1_000, end)  # falls one record further behind every time
    assert v.shrink_candidates(39_000, MAX_LAG) == {2}


def test_expand_needs_the_hw_and_the_epoch_start() -> None:
    v = view(isr=(1, 3), end=30, hw=18, epoch_start=25)
    v.on_fetch(2, 19, 1, 30)
    v.on_fetch(3, 20, 1, 30)
    assert v.high_watermark() == 20
    assert v.expand_candidates() == set()  # 2 is below the HW
    v.on_fetch(2, 22, 1, 30)
    assert v.expand_candidates() == set()  # 2 reached the HW, not the epoch's start
    v.on_fetch(2, 25, 2, 30)
    assert v.expand_candidates() == {2}
    v.set_isr((1, 2, 3))
    assert v.expand_candidates() == set()


def test_a_member_that_left_the_isr_is_not_expanded_on_its_old_fetches() -> None:
    """A follower at the HW dies; the coordinator takes it out of the ISR; with no write since, its last
    fetch still reached the HW. Its next incarnation (a wiped disk holds nothing) must fetch again before
    it may come back (it was proposed again on the dead one's log end, rebuilt or not)."""
    v = view(isr=(1, 2, 3), end=30, hw=30, epoch_start=10)
    v.on_fetch(2, 30, 1, 30)
    v.on_fetch(3, 30, 1, 30)
    v.set_isr((1, 3))
    assert v.expand_candidates() == set()
    v.on_fetch(2, 30, 2, 30)
    assert v.expand_candidates() == {2}


def test_can_write() -> None:
    assert can_write({1, 2}, 2) and can_write({1}, 1)
    assert not can_write({1}, 2)


@st.composite
def scenarios(draw: st.DrawFn) -> list[tuple]:
    return draw(st.lists(st.one_of(
        st.tuples(st.just("append"), st.integers(0, 5)),
        st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 5)),
        st.tuples(st.just("isr"), st.sets(st.sampled_from([2, 3]))),
        st.tuples(st.just("force"), st.sets(st.sampled_from([2, 3]))),
    ), max_size=40))


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_hw_is_monotone_and_never_above_an_isr_members_log_end(steps: list[tuple]) -> None:
    v = view(end=10, hw=4, epoch_start=10)
    last_hw = v.high_watermark()
    below: set[int] = set()  # members the coordinator's ISR holds below the HW (they have not caught up since)
    for step in steps:
        if step[0] == "append":
            v.on_append(v.leader_log_end + step[1])
        elif step[0] == "fetch":
            # an ISR member of a new leader holds at least the HW it starts with (committed data)
            known = v.follower(step[1]).log_end
            v.on_fetch(step[1], min(v.leader_log_end, (4 if known is None else known) + step[2]), 0,
                       v.leader_log_end)
        else:
            joining = (step[1] - v.isr) & v.expand_candidates()
            v.set_isr({1} | (step[1] & v.isr) | joining)  # only caught-up replicas join
        if step[0] == "force":  # the coordinator's ISR, whatever the followers' log ends
            v.set_isr({1} | step[1])
            below |= {r for r in step[1] if (v.follower(r).log_end or 0) < v.high_watermark()}
        below = {r for r in below & v.isr if (v.follower(r).log_end or 0) < v.high_watermark()}
        hw = v.high_watermark()
        assert hw >= last_hw
        for member in v.isr - {1} - below:
            assert v.follower(member).log_end is None or hw <= v.follower(member).log_end
        assert hw <= v.leader_log_end
        last_hw = hw


# -- the writes waiting for the HW ---------------------------------------------

def test_pending_acks_are_released_in_order_as_the_hw_passes_them() -> None:
    acks: PendingAcks[str] = PendingAcks()
    assert not acks.add(5, "a")
    assert not acks.add(12, "c")
    assert not acks.add(8, "b")
    assert acks.advance(4) == []
    assert acks.advance(8) == ["a", "b"]  # an end offset equal to the HW is committed
    assert acks.advance(6) == []  # a lower HW is ignored
    assert len(acks) == 1
    assert acks.add(8, "late")  # already committed: answered at once, not kept
    assert acks.advance(20) == ["c"]
    assert len(acks) == 0


def test_pending_acks_discard_and_fail_all() -> None:
    acks: PendingAcks[object] = PendingAcks()
    a, b, c = object(), object(), object()
    acks.add(9, c)
    acks.add(3, a)
    acks.add(6, b)
    assert acks.discard(b) and not acks.discard(b)
    assert acks.fail_all() == [a, c]
    assert acks.advance(100) == []
