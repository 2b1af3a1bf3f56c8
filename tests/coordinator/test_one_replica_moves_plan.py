"""Planning the moves of one-replica (RF 1) buckets: reassign, decommission, rebalance, and what elections do to
such a bucket in the middle of its move (coordinator/reassignment_plan.py, rebalance.py, election_plan.py). Pure: no
ZooKeeper, no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.coordinator import data_loss_plan, election_plan
from kvlease.coordinator import reassignment_plan as ra
from kvlease.coordinator import rebalance_plan as rb
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment
from tests.coordinator.test_reassignment_plan import state, table_of


def joined_isr(a: BucketAssignment, *servers: int) -> BucketAssignment:
    """``a`` once its leader's AlterIsr added ``servers`` (they caught up)."""
    return election_plan.alter_isr(a, a.leader, a.leader_epoch, a.bucket_epoch, a.isr + servers, set(a.replicas))


def test_a_one_replica_bucket_may_move_to_one_live_server():
    assert ra.check_target("bucket 0 of db.t", 1, [2], {1, 2}, current=[1]) == (2,)
    with pytest.raises(errors.InvalidRequestError, match=r"2 replica\(s\) \[2, 3\] given, .* replication factor 1"):
        ra.check_target("bucket 0 of db.t", 1, [2, 3], {1, 2, 3}, current=[1])
    with pytest.raises(errors.InvalidRequestError, match=r"tablet server\(s\) \[9\] are not live"):
        ra.check_target("bucket 0 of db.t", 1, [9], {1, 2}, current=[1])


def test_a_bucket_whose_only_replica_is_down_cannot_move():
    with pytest.raises(errors.InvalidRequestError, match=r"none of its replicas \[1\] is live") as info:
        ra.check_target("bucket 0 of db.t", 1, [2], {2, 3}, current=[1])
    assert "bucket 0 of db.t" in info.value.message and "\n" not in info.value.message


def test_a_one_replica_move_copies_through_a_second_replica_then_keeps_the_new_one():
    a = state([1])
    moving = ra.start(a, (2,))
    assert (moving.replicas, moving.isr, moving.leader, moving.reassign) == ((2, 1), (1,), 1, (2,))
    assert moving.replication_factor == 2  # a replicated bucket while it moves: the new replica follows
    assert (moving.leader_epoch, moving.bucket_epoch) == (a.leader_epoch + 1, a.bucket_epoch + 1)
    assert ra.start(moving, (2,)) is moving  # resent: the move in progress
    assert ra.progress(moving, {1, 2}) is None  # the new replica has not caught up
    done = ra.progress(joined_isr(moving, 2), {1, 2})
    assert (done.replicas, done.isr, done.leader, done.reassign) == ((2,), (2,), 2, None)
    assert done.leader_epoch == moving.leader_epoch + 1
    assert ra.removed_replicas(joined_isr(moving, 2), done) == {1}


def test_the_old_leader_gone_before_the_new_replica_caught_up_leaves_the_bucket_offline_until_it_returns():
    moving = ra.start(state([1]), (2,))
    plan = Assignments()
    plan.set(1, {0: moving})
    changes, _unclean = election_plan.servers_changed(plan, {1}, set(), {2}, {})
    offline = changes[1][0]
    assert offline.offline and offline.isr == (1,) and offline.reassign == (2,)  # not led by the empty copy
    assert ra.progress(offline, {2}) is None
    plan.set(1, {0: offline})
    changes, _unclean = election_plan.servers_changed(plan, set(), {1}, {1, 2}, {})
    back = changes[1][0]
    assert (back.leader, back.isr, back.reassign) == (1, (1,), (2,))  # it leads again; the move goes on
    assert back.leader_epoch > offline.leader_epoch
    done = ra.progress(joined_isr(back, 2), {1, 2})
    assert (done.replicas, done.leader) == ((2,), 2)


def test_the_old_leader_gone_after_the_new_replica_caught_up_hands_the_bucket_to_it_and_the_move_completes():
    caught_up = joined_isr(ra.start(state([1]), (2,)), 2)
    plan = Assignments()
    plan.set(1, {0: caught_up})
    changes, _unclean = election_plan.servers_changed(plan, {1}, set(), {2}, {})
    led = changes[1][0]
    assert (led.leader, led.isr) == (2, (2,))
    done = ra.progress(led, {2})
    assert (done.replicas, done.isr, done.leader, done.reassign) == ((2,), (2,), 2, None)
    assert ra.removed_replicas(led, done) == {1}


def test_the_old_leaders_disk_lost_mid_move_is_offline_for_lost_data_and_a_restore_completes_the_move():
    moving = ra.start(state([1]), (2,))
    offline = data_loss_plan.replica_lost(moving, 1, data_loss_plan.new_dir_reason(1), {1, 2})
    assert offline.offline and offline.isr == () and offline.reassign == (2,)  # never led by the copy in progress
    assert "tablet server 1" in offline.offline_reason and ra.progress(offline, {1, 2}) is None
    restored, loss = data_loss_plan.restore(offline, {1, 2}, (3, 60), 80, 5, accept_data_loss=True, where="b")
    assert (restored.leader, restored.isr, restored.reassign, loss.owed_by) == (2, (2,), (2,), (2, 1))
    done = ra.progress(restored, {1, 2})
    assert (done.replicas, done.leader, done.reassign) == ((2,), 2, None)
    assert done.losses == (replace(loss, owed_by=(2,)),)  # the loss stays; 1, moved off, no longer owes it
    assert done.leader_epoch == restored.leader_epoch + 1 and ra.removed_replicas(restored, done) == {1}


def test_a_move_completes_only_once_an_unclean_leader_reported_its_log_end():
    moving = ra.start(state([1]), (2,))
    offline = data_loss_plan.replica_lost(moving, 1, data_loss_plan.new_dir_reason(1), {1, 2})
    elected, loss = data_loss_plan.elect(offline, {1, 2}, unclean=True, tablet=None, last_known_end=40, at_ms=5, where="b")
    assert (elected.leader, elected.isr, elected.reassign) == (2, (2,), (2,))
    assert ra.progress(elected, {1, 2}) is None  # its takeover report names the loss's epoch: wait for it
    reported = data_loss_plan.takeover_reported(elected, 2, loss.leader_epoch, 40)
    done = ra.progress(reported, {1, 2})
    assert (done.replicas, done.leader, done.losses[-1].from_offset) == ((2,), 2, 40)


def test_decommission_moves_one_replica_buckets_too():
    a = Assignments()
    a.set(1, {0: state([1]), 1: state([2]), 2: state([1])})
    a.set(2, {0: state([1, 2]), 1: state([3, 1])})
    moves = rb.decommission(a, 1, {1, 2, 3}, {})
    assert sorted((t, b) for t, b, _target in moves) == [(1, 0), (1, 2), (2, 0), (2, 1)]
    for _t, _b, target in moves:
        assert 1 not in target
    one = {b: target for t, b, target in moves if t == 1}
    assert all(len(target) == 1 for target in one.values())
    assert a.table(2)[0].replicas == (1, 2) and dict(((t, b), tg) for t, b, tg in moves)[(2, 0)] == (3, 2)


def test_rebalance_moves_one_replica_buckets_to_an_empty_server():
    a = table_of(state([1]), state([1]), state([1]), state([2]), state([2]), state([2]))
    plan = rb.rebalance(a, {1, 2, 3}, {})
    moved = {b: target for _t, b, target in plan.moves}
    load = {s: sum(moved.get(b, s_.replicas) == (s,) for b, s_ in a.table(1).items()) for s in (1, 2, 3)}
    assert load == {1: 2, 2: 2, 3: 2}
    assert plan.leaders == {}  # the only replica leads: nothing to elect


def test_an_unassigned_one_replica_bucket_is_not_moved():
    a = table_of(BucketAssignment(UNASSIGNED, 1), state([1]), state([1]))
    plan = rb.rebalance(a, {1, 2}, {})
    assert [b for _t, b, _target in plan.moves] == [1]


def test_an_unclean_election_never_hands_the_bucket_to_the_replica_a_move_is_adding():
    moving = ra.start(state([1]), (2,))
    assert election_plan.server_gone(moving, {1}, {2}, unclean=True).state.offline  # the new copy may hold nothing
    offline = election_plan.server_gone(moving, {1}, {2}, unclean=False).state
    assert election_plan.server_joined(offline, {2}, {2}, unclean=True) is None
    replicated = ra.start(state([1, 2], isr=[1]), (3, 1))  # 2 is out of sync and leaves, 3 is being added
    took = election_plan.server_gone(replicated, {1}, {2, 3}, unclean=True)
    assert took.unclean and took.state.leader == 2


def test_decommission_of_a_stopped_server_holding_a_one_replica_bucket_is_refused():
    a = table_of(state([1]), state([1, 2]))
    with pytest.raises(errors.InvalidRequestError, match=r"cannot decommission tablet server 1: none of the replicas "
                       r"\[1\] of bucket 0 of 1 is live, so no replica can copy it"):
        rb.decommission(a, 1, {2, 3}, {})
