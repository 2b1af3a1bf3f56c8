"""Pure planning of replica moves (coordinator/reassignment_plan.py) and of decommission / rebalance
(coordinator/rebalance_plan.py): no ZooKeeper, no processes."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.coordinator import reassignment_plan as ra
from kvlease.coordinator import rebalance_plan as rb
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment


def state(replicas, leader=None, isr=None, epoch=3, bucket_epoch=5, reassign=None) -> BucketAssignment:
    replicas = tuple(replicas)
    return BucketAssignment(replicas[0] if leader is None else leader, epoch, replicas,
                            replicas if isr is None else tuple(isr), bucket_epoch, reassign)


def table_of(*states_) -> Assignments:
    a = Assignments()
    a.set(1, dict(enumerate(states_)))
    return a


# -- the ZooKeeper node ---------------------------------------------------------------------------

def test_the_move_round_trips_through_json_and_old_nodes_load():
    moving = state([4, 1, 2], leader=1, isr=[1, 2], reassign=(4, 1))
    node = moving.to_json()
    assert node["reassign"] == {"target": [4, 1]}
    assert BucketAssignment.from_json(node) == moving
    plain = state([1, 2])
    assert "reassign" not in plain.to_json()  # default-valued keys are omitted
    assert BucketAssignment.from_json(plain.to_json()) == plain
    assert BucketAssignment.from_json({"leader": 2, "leader_epoch": 4}).reassign is None


# -- checking a target ------------------------------------------------------------------------------

@pytest.mark.parametrize("target, rf, message", [
    ([], 2, "the new replica list is empty"),
    ([1, 1], 2, r"tablet server\(s\) \[1\] named more than once"),
    ([1, 2, 3], 2, r"3 replica\(s\) \[1, 2, 3\] given, its table has replication factor 2"),
    ([1, 9], 2, r"tablet server\(s\) \[9\] are not live \(live: \[1, 2, 3\]\)"),
    ([2, 3], 1, r"2 replica\(s\) \[2, 3\] given, its table has replication factor 1"),
])
def test_bad_targets_are_refused_in_one_line(target, rf, message):
    with pytest.raises(errors.InvalidRequestError, match=message) as info:
        ra.check_target("bucket 0 of db.t", rf, target, {1, 2, 3})
    assert "\n" not in info.value.message and "bucket 0 of db.t" in info.value.message


def test_a_good_target_is_returned_as_a_tuple_and_a_current_replica_may_be_down():
    assert ra.check_target("b", 2, [3, 1], [1, 2, 3]) == (3, 1)
    assert ra.check_target("b", 2, [3, 1], [2, 3], current=[1, 2]) == (3, 1)


# -- the two phases -----------------------------------------------------------------------------------

def test_start_adds_the_new_replicas_and_bumps_the_epochs():
    a = state([1, 2], isr=[1, 2])
    moving = ra.start(a, (3, 1))
    assert moving.replicas == (3, 1, 2) and moving.reassign == (3, 1)
    assert moving.leader == 1 and moving.isr == (1, 2)
    assert (moving.leader_epoch, moving.bucket_epoch) == (a.leader_epoch + 1, a.bucket_epoch + 1)
    assert ra.start(moving, (3, 1)) is moving  # resent: the move in progress
    with pytest.raises(errors.InvalidRequestError, match=r"its move to \[3, 1\] is in progress"):
        ra.start(moving, (4, 1))


def test_start_of_the_same_replicas_changes_nothing_and_a_new_order_only_reorders():
    a = state([1, 2, 3])
    assert ra.start(a, (1, 2, 3)) is a
    reordered = ra.start(a, (2, 1, 3))
    assert reordered.replicas == (2, 1, 3) and reordered.reassign is None and reordered.leader == 1
    assert reordered.bucket_epoch == a.bucket_epoch + 1 and reordered.leader_epoch == a.leader_epoch


def test_an_offline_bucket_cannot_start_a_move():
    offline = state([1, 2], leader=UNASSIGNED, isr=[1])
    with pytest.raises(errors.InvalidRequestError, match="has no leader"):
        ra.start(offline, (3, 4))


def test_progress_waits_for_every_target_replica_in_the_isr():
    moving = ra.start(state([1, 2]), (3, 1))
    assert ra.progress(moving, {1, 2, 3}) is None
    caught_up = BucketAssignment(moving.leader, moving.leader_epoch, moving.replicas, (1, 2, 3),
                                 moving.bucket_epoch + 1, moving.reassign)
    done = ra.progress(caught_up, {1, 2, 3})
    assert done.replicas == (3, 1) and done.isr == (3, 1) and done.reassign is None
    assert done.leader == 1 and done.leader_epoch == caught_up.leader_epoch + 1
    assert done.bucket_epoch == caught_up.bucket_epoch + 1
    assert ra.removed_replicas(caught_up, done) == {2}
    assert ra.progress(done, {1, 2, 3}) is None


def test_a_leader_not_in_the_target_hands_over_to_the_first_live_target_replica():
    moving = state([3, 4, 1, 2], leader=1, isr=[3, 4, 1, 2], reassign=(3, 4))
    assert ra.progress(moving, {1, 2, 4}).leader == 4  # 3 is not live
    done = ra.progress(moving, {1, 2, 3, 4})
    assert (done.leader, done.replicas, done.isr) == (3, (3, 4), (3, 4))
    assert ra.removed_replicas(moving, done) == {1, 2}
    assert ra.progress(moving, {1, 2}) is None  # no live target replica to lead: it waits


def test_progress_all_names_only_the_tables_with_a_move_to_complete():
    a = Assignments()
    a.set(1, {0: state([3, 1, 2], leader=1, isr=[1, 2, 3], reassign=(3, 1)), 1: state([1, 2])})
    a.set(2, {0: state([3, 1, 2], leader=1, isr=[1, 2], reassign=(3, 1))})
    changes = ra.progress_all(a, {1, 2, 3})
    assert set(changes) == {1} and changes[1][0].replicas == (3, 1) and changes[1][1] == state([1, 2])
    assert ra.progress_all(a, {1, 2, 3}, table_ids=[2]) == {}


def test_move_state_says_what_is_waiting_and_what_goes():
    moving = state([3, 1, 2], leader=1, isr=[1, 2], reassign=(3, 1))
    assert ra.move_state(moving) == {"replicas": [3, 1, 2], "target": [3, 1], "isr": [1, 2], "leader": 1,
                                     "state": "moving", "waiting": [3], "removing": [2]}
    assert ra.move_state(state([1, 2]))["state"] == "done"


# -- decommission --------------------------------------------------------------------------------------

def test_decommission_moves_every_replica_to_the_least_loaded_servers():
    a = table_of(state([1, 2]), state([2, 3]), state([3, 1]), state([1, 3]))
    moves = rb.decommission(a, 1, {1, 2, 3, 4}, {})
    assert [b for _t, b, _target in moves] == [0, 2, 3]
    for _t, b, target in moves:
        assert 1 not in target and len(set(target)) == 2
    counts = {s: sum(s in t for _t, _b, t in moves) for s in (2, 3, 4)}
    assert counts[4] >= 2  # the empty server takes the most


def test_decommission_keeps_the_replaced_place_so_preferred_leaders_stay_spread():
    a = table_of(state([1, 2]), state([1, 3]))
    moves = rb.decommission(a, 1, {1, 2, 3, 4}, {})
    assert [target[1:] for _t, _b, target in moves] == [(2,), (3,)]


def test_decommission_errors_name_the_reason():
    a = table_of(state([1, 2]))
    with pytest.raises(errors.InvalidRequestError, match="no other live server with room"):
        rb.decommission(a, 1, {1, 2}, {})
    with pytest.raises(errors.InvalidRequestError, match="no other live server with room"):
        rb.decommission(a, 1, {1, 2, 3}, {3: 0})
    with pytest.raises(errors.InvalidRequestError, match="no other live server with room"):
        rb.decommission(table_of(state([1])), 1, {1}, {})
    busy = table_of(state([3, 1, 2], reassign=(3, 1)))
    with pytest.raises(errors.InvalidRequestError, match=r"being moved to \[3, 1\]"):
        rb.decommission(busy, 1, {1, 2, 3, 4}, {})


def test_a_resent_decommission_starts_nothing_new():
    a = table_of(state([4, 1, 2], reassign=(4, 2)), state([2, 3]))
    assert rb.decommission(a, 1, {1, 2, 3, 4}, {}) == []


# -- rebalance ------------------------------------------------------------------------------------------

def test_rebalance_evens_out_replicas_after_a_server_joined():
    a = table_of(*(state(r) for r in ([1, 2], [2, 3], [3, 1], [1, 2], [2, 3], [3, 1])))
    plan = rb.rebalance(a, {1, 2, 3, 4}, {})
    load = {s: 0 for s in (1, 2, 3, 4)}
    moved = {b: target for _t, b, target in plan.moves}
    for b, s in a.table(1).items():
        for r in moved.get(b, s.replicas):
            load[r] += 1
    assert max(load.values()) - min(load.values()) <= 1 and load[4] >= 2
    for _t, b, target in plan.moves:
        assert len(set(target)) == 2
    balanced = Assignments()
    balanced.set(1, {b: state(moved.get(b, s.replicas)) for b, s in a.table(1).items()})
    assert rb.rebalance(balanced, {1, 2, 3, 4}, {}).moves == []


def test_rebalance_moves_leaders_back_to_their_preferred_replica():
    a = table_of(state([1, 2], leader=2), state([2, 1], leader=2), state([3, 1], leader=1, isr=[1]),
                 state([2, 3], leader=3))
    plan = rb.rebalance(a, {1, 2, 3}, {})
    assert plan.moves == []
    assert set(plan.leaders) == {(1, 0), (1, 3)}  # 3 is not in bucket 2's ISR
    elected = plan.leaders[(1, 0)]
    assert elected.leader == 1 and elected.leader_epoch == 4 and elected.bucket_epoch == 6
    assert rb.preferred_leader(state([1, 2], leader=2), {2}) is None  # the preferred one is not live
    assert rb.preferred_leader(state([1, 2], leader=2, reassign=(1, 3)), {1, 2}) is None
