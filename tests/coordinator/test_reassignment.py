"""Replica moves on a real ZooKeeper with a real controller (coordinator/moves.py): reassign (both phases, its
retry and its errors), a move resumed by the next coordinator, decommission, rebalance and preferred-leader
elections. Tablet servers are registered by hand; their catching up is the leader's AlterIsr, sent by hand."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.coordinator import requests as rq
from kvlease.coordinator.controller import LeaderRebalance
from kvlease.coordinator.fencing import FencedWriter, bump_epoch
from tests.coordinator.test_assignment import call
from tests.coordinator.test_replication import create, make_ctrl, register, states, stored, unregister  # noqa: F401

pytestmark = pytest.mark.zk


def catch_up(ctrl, table, bucket, *joining):
    """The bucket's leader adds ``joining`` to its ISR (they caught up)."""
    a = states(ctrl, table)[bucket]
    call(ctrl, rq.AlterIsr(a.leader, table.table_id, bucket, a.leader_epoch, a.bucket_epoch, tuple(a.isr) + joining))
    return states(ctrl, table)[bucket]


def reassign(ctrl, table, bucket, replicas):
    _table, _bucket, a = call(ctrl, rq.ReassignBucket("db", table.name, bucket, tuple(replicas)))
    return a


def test_a_move_adds_the_new_replica_then_drops_the_old_one(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 1, rf=2)
    before = states(ctrl, t)[0]
    old = [r for r in before.replicas]
    new = next(s for s in (1, 2, 3) if s not in old)
    target = (new, before.leader)
    moving = reassign(ctrl, t, 0, target)
    assert moving.reassign == target and moving.replicas == (*target, next(r for r in old if r != before.leader))
    assert moving.leader == before.leader and moving.isr == before.isr
    assert moving.leader_epoch == before.leader_epoch + 1  # the leader learns its new follower
    assert stored(ctrl, t)[0]["reassign"] == {"target": list(target)}
    assert (t.table_id, 0) in ctrl.recorder.held[new]  # told: it follows and copies the bucket
    assert reassign(ctrl, t, 0, target) == moving  # resent: the same move, nothing written
    assert [m[2] for m in call(ctrl, rq.ListReassignments())] == [moving]
    with pytest.raises(errors.InvalidRequestError, match="is in progress"):
        reassign(ctrl, t, 0, (3, 2) if target != (3, 2) else (2, 3))

    done = catch_up(ctrl, t, 0, new)
    assert done.replicas == target and set(done.isr) == set(target) and done.reassign is None
    assert done.leader == before.leader and done.leader_epoch == before.leader_epoch + 2
    assert "reassign" not in stored(ctrl, t)[0] and stored(ctrl, t)[0]["replicas"] == list(target)
    removed = next(r for r in old if r != before.leader)
    assert (t.table_id, 0) in ctrl.recorder.removed[removed]  # told to delete its copy
    assert (t.table_id, 0) not in ctrl.recorder.held[removed]
    assert call(ctrl, rq.ListReassignments()) == []
    assert reassign(ctrl, t, 0, target) == done  # resent after it completed: done, nothing written


def test_a_leader_moved_away_hands_over_to_the_target(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3, 4)
    t = create(ctrl, "t", 1, rf=2)
    before = states(ctrl, t)[0]
    target = tuple(s for s in (1, 2, 3, 4) if s not in before.replicas)
    reassign(ctrl, t, 0, target)
    catch_up(ctrl, t, 0, target[0])
    assert states(ctrl, t)[0].reassign == target  # one of the two is not in sync yet
    done = catch_up(ctrl, t, 0, target[1])
    assert done.leader == target[0] and done.replicas == target and done.reassign is None
    assert all((t.table_id, 0) in ctrl.recorder.removed[r] for r in before.replicas)


def test_bad_reassign_requests_are_refused(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 2, rf=2)
    one = create(ctrl, "one", 1, rf=1)
    for replicas, message in (((1, 2, 3), "replication factor 2"), ((1, 9), r"\[9\] are not live"),
                              ((1, 1), "more than once"), ((), "empty")):
        with pytest.raises(errors.InvalidRequestError, match=message):
            reassign(ctrl, t, 0, replicas)
    with pytest.raises(errors.InvalidRequestError, match="replication factor 1"):
        reassign(ctrl, one, 0, (2, 3))
    with pytest.raises(errors.BucketOutOfRangeError, match="has no bucket 5"):
        reassign(ctrl, t, 5, (1, 2))
    with pytest.raises(errors.TableNotExistError):
        call(ctrl, rq.ReassignBucket("db", "nope", 0, (1, 2)))
    assert all(a.reassign is None for a in states(ctrl, t).values())


def test_the_next_coordinator_resumes_a_move(make_ctrl, zk_config):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 2, rf=2)
    targets = {}
    for bucket, a in states(ctrl, t).items():
        new = next(s for s in (1, 2, 3) if s not in a.replicas)
        targets[bucket] = (new, a.leader)
        reassign(ctrl, t, bucket, targets[bucket])
    catch_up(ctrl, t, 0, targets[0][0])  # bucket 0 completes here
    assert states(ctrl, t)[0].reassign is None
    # the old coordinator is deposed before bucket 1's new replica caught up
    successor = make_ctrl()
    with pytest.raises(errors.CoordinatorFencedError):
        catch_up(ctrl, t, 1, targets[1][0])
    register(successor, 1, 2, 3)
    moving = states(successor, t)[1]
    assert moving.reassign == targets[1]  # loaded from ZooKeeper
    assert [(m[0].path, m[1]) for m in call(successor, rq.ListReassignments())] == [("db.t", 1)]
    done = catch_up(successor, t, 1, targets[1][0])
    assert done.replicas == targets[1] and done.reassign is None


def test_a_move_whose_isr_was_complete_at_the_failover_completes_at_once(make_ctrl, zk_config):
    """The old coordinator wrote the ISR with the new replica and was deposed before completing the move."""
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 1, rf=2)
    a = states(ctrl, t)[0]
    new = next(s for s in (1, 2, 3) if s not in a.replicas)
    reassign(ctrl, t, 0, (new, a.leader))
    ctrl.moves.progress = lambda table_ids=None: None  # this one stops before the second phase
    ctrl.members.on_changed = ctrl.moves.progress
    catch_up(ctrl, t, 0, new)
    assert states(ctrl, t)[0].reassign == (new, a.leader) and new in states(ctrl, t)[0].isr
    successor = make_ctrl()
    register(successor, 1, 2, 3)  # its first look at the servers completes the move
    done = states(successor, t)[0]
    assert done.replicas == (new, a.leader) and done.reassign is None
    assert stored(successor, t)[0]["replicas"] == [new, a.leader]


def test_decommission_moves_everything_off_a_server(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    t = create(ctrl, "t", 3, rf=2)
    with pytest.raises(errors.InvalidRequestError, match="cannot decommission tablet server 1: .*no other live"):
        call(ctrl, rq.DecommissionTablet(1))
    assert all(a.reassign is None for a in states(ctrl, t).values())  # nothing started
    register(ctrl, 1, 2, 3, 4)
    moves = call(ctrl, rq.DecommissionTablet(1))
    assert sorted(b for _t, b, _a in moves) == [0, 1, 2]
    assert all(1 not in a.reassign and 1 in a.replicas for _t, _b, a in moves)
    joining = sorted(r for _t, _b, a in moves for r in a.reassign if r not in a.isr)
    assert len(joining) == 3 and set(joining) == {3, 4}  # spread over the two servers that hold nothing
    assert call(ctrl, rq.DecommissionTablet(1)) == moves  # resent: the same moves, nothing new
    for _t, bucket, a in moves:
        for joining in (r for r in a.reassign if r not in a.isr):
            catch_up(ctrl, t, bucket, joining)
    assert all(1 not in a.replicas and a.reassign is None for a in states(ctrl, t).values())
    assert ctrl.assignments.held_by(1) == []
    assert all((t.table_id, b) in ctrl.recorder.removed[1] for b in range(3))
    assert call(ctrl, rq.DecommissionTablet(1)) == []


def test_decommission_of_a_server_gone_for_good(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 2, rf=3)
    unregister(ctrl, 3)  # gone for good: out of every ISR
    register(ctrl, 1, 2, 4)
    moves = call(ctrl, rq.DecommissionTablet(3))
    assert len(moves) == 2 and all(set(a.reassign) == {1, 2, 4} for _t, _b, a in moves)
    for _t, bucket, _a in moves:
        catch_up(ctrl, t, bucket, 4)
    assert all(set(a.replicas) == {1, 2, 4} and a.isr == a.replicas for a in states(ctrl, t).values())


def test_rebalance_fills_a_new_server_and_moves_leaders_back(make_ctrl):
    ctrl = make_ctrl(leader_rebalance=LeaderRebalance(enabled=False))  # not elected when back in the ISR
    register(ctrl, 1, 2)
    t = create(ctrl, "t", 4, rf=2)
    unregister(ctrl, 1)
    register(ctrl, 1, 2, incarnation="b")  # 1 restarted: 2 leads everything now
    assert all(a.leader == 2 for a in states(ctrl, t).values())
    for bucket, a in states(ctrl, t).items():
        if 1 not in a.isr:
            catch_up(ctrl, t, bucket, 1)
    moves, leaders = call(ctrl, rq.Rebalance())
    assert moves == []
    assert sorted(b for (_t, b, _a), old in leaders) == sorted(b for b, a in states(ctrl, t).items()
                                                               if a.replicas[0] == 1)
    assert all(a.leader == a.replicas[0] for a in states(ctrl, t).values())
    register(ctrl, 1, 2, 3)
    moves, leaders = call(ctrl, rq.Rebalance())
    assert len(moves) == 2 and leaders == []
    assert all(3 in a.reassign for _t, _b, a in moves)
    assert call(ctrl, rq.Rebalance()) == ([], [])  # resent: the moves in progress count as done
    for _t, bucket, _a in moves:
        catch_up(ctrl, t, bucket, 3)
    load = ctrl.assignments.load_per_server()
    assert sorted(load.values()) == [2, 3, 3]
