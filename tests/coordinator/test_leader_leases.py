"""The coordinator's side of leader leases (coordinator/leader_leases.py): which servers' demotions nodes a
change bumps, how long a new leader waits, and that an old leader taking its push ends the wait. Pure: a fake
monotonic clock."""

from __future__ import annotations

import pytest

from kvlease.common import zkpaths
from kvlease.coordinator.leader_leases import LeaderLeases, ServerLease

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leases(clock: Clock, live=(1, 2, 3), lease_ms: int = 4000) -> LeaderLeases:
    state = LeaderLeases(6000, monotonic=clock)
    state.servers_seen({s: ServerLease(session_id=10 + s, demotions=5, lease_ms=lease_ms) for s in live})
    return state


def test_a_change_bumps_only_live_servers_and_their_new_leaders_wait_a_lease():
    clock = Clock()
    state = leases(clock, live=(1, 2))
    assert [op.path for op in state.bump_ops([3, 1, 1])] == [zkpaths.tablet_demotions(1)]  # 3 is not live
    state.bumped([1, 3], [((7, 0), 1), ((7, 1), 3)])
    assert state.servers[1].demotions == 6 and state.servers[2].demotions == 5
    assert state.wait_ms((7, 0)) == 4001  # server 1 may hold its lease for one more duration
    assert state.wait_ms((7, 1)) == 0  # server 3 is not live: its lease ended with its session
    clock.now += 3.0
    assert state.wait_ms((7, 0)) == 1001
    clock.now += 1.01
    assert state.wait_ms((7, 0)) == 0


def test_the_old_leader_taking_a_push_built_after_the_change_ends_the_wait():
    clock = Clock()
    state = leases(clock)
    before = state.push_for(1, [(7, 0)])  # built before the change: does not end it
    state.bumped([1], [((7, 0), 1), ((7, 1), 1)])
    state.bumped([2], [((8, 0), 2)])
    assert state.delivered(1, before.seq) == []
    after = state.push_for(1, [])
    assert after.seq > before.seq and (after.session_id, after.demotions) == (11, 6)
    assert state.delivered(1, after.seq) == [(7, 0), (7, 1)]  # tell their new leaders again
    assert state.wait_ms((7, 0)) == 0 and state.wait_ms((8, 0)) == 4001  # server 2 has not let go
    assert state.delivered(1, after.seq) == []  # a second confirmation changes nothing


def test_the_wait_is_the_longest_of_the_earlier_leaders():
    clock = Clock()
    state = leases(clock)
    state.servers_seen({**state.servers, 2: ServerLease(12, 5, 9000)})
    state.bumped([1], [((7, 0), 1)])
    clock.now += 1.0
    state.bumped([2], [((7, 0), 2)])  # led by 2 for a second, then moved on
    assert state.wait_ms((7, 0)) == 9001
    assert state.delivered(2, state.push_for(2, []).seq) == [(7, 0)]
    assert state.wait_ms((7, 0)) == 3001  # server 1 still may hold its lease
    push = state.push_for(3, [(7, 0)])
    assert push.waits == {(7, 0): 3001}


def test_a_new_coordinator_waits_a_lease_for_buckets_it_found_not_for_new_ones():
    clock = Clock()
    state = leases(clock)
    state.took_over([7])
    assert state.wait_ms((7, 3)) == 6001  # the default bound: its predecessor may have moved a leader
    assert state.wait_ms((9, 0)) == 0  # a table created since has had no other leader
    clock.now += 6.01
    assert state.wait_ms((7, 3)) == 0


def test_an_unknown_server_gets_no_lease_basis_and_a_dropped_table_is_forgotten():
    clock = Clock()
    state = leases(clock)
    push = state.push_for(9, [])
    assert push.session_id is None and push.demotions == 0
    state.bumped([1], [((7, 0), 1)])
    state.forget_table(7)
    assert state.wait_ms((7, 0)) == 0
