"""Moves of one-replica (RF 1) buckets on a real ZooKeeper with a real controller (coordinator/moves.py):
reassign (both phases, its retry), the old leader lost in the middle, and decommission of a server holding RF-1
and RF-2 buckets. Tablet servers are registered by hand; their catching up is the leader's AlterIsr, sent by
hand."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.coordinator import requests as rq
from tests.coordinator.test_assignment import call
from tests.coordinator.test_reassignment import catch_up, reassign
from tests.coordinator.test_replication import create, make_ctrl, register, states, stored, unregister  # noqa: F401

pytestmark = pytest.mark.zk


def test_a_one_replica_bucket_moves_through_a_second_replica(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    t = create(ctrl, "one", 1, rf=1)
    before = states(ctrl, t)[0]
    new = 2 if before.leader == 1 else 1
    moving = reassign(ctrl, t, 0, (new,))
    assert (moving.replicas, moving.isr, moving.leader, moving.reassign) == ((new, before.leader),
                                                                             (before.leader,), before.leader, (new,))
    assert (t.table_id, 0) in ctrl.recorder.held[new]  # told: it follows and copies the bucket
    assert reassign(ctrl, t, 0, (new,)) == moving  # resent: the same move, nothing written
    assert stored(ctrl, t)[0]["reassign"] == {"target": [new]}
    done = catch_up(ctrl, t, 0, new)
    assert (done.replicas, done.isr, done.leader, done.reassign) == ((new,), (new,), new, None)
    assert (t.table_id, 0) in ctrl.recorder.removed[before.leader]  # told to delete its copy
    assert reassign(ctrl, t, 0, (new,)) == done  # resent after it completed: done


def test_a_one_replica_bucket_whose_leader_left_mid_move_waits_for_it_then_completes(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    t = create(ctrl, "one", 1, rf=1)
    old = states(ctrl, t)[0].leader
    new = 2 if old == 1 else 1
    reassign(ctrl, t, 0, (new,))
    unregister(ctrl, old)
    offline = states(ctrl, t)[0]
    assert offline.offline and offline.isr == (old,) and offline.reassign == (new,)  # the empty copy never leads
    register(ctrl, 1, 2, incarnation="b")
    back = states(ctrl, t)[0]
    assert back.leader == old and back.reassign == (new,)
    done = catch_up(ctrl, t, 0, new)
    assert (done.replicas, done.leader, done.reassign) == ((new,), new, None)


def test_a_bucket_whose_only_replica_is_down_is_not_moved(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    t = create(ctrl, "one", 2, rf=1)
    held = {b: a.leader for b, a in states(ctrl, t).items()}
    gone = held[0]
    unregister(ctrl, gone)
    register(ctrl, *({1, 2, 3} - {gone}))
    with pytest.raises(errors.InvalidRequestError, match=rf"none of its replicas \[{gone}\] is live"):
        reassign(ctrl, t, 0, (3,))
    with pytest.raises(errors.InvalidRequestError, match=rf"cannot decommission tablet server {gone}: none of the "
                       rf"replicas \[{gone}\] of bucket 0 of table db.one is live"):
        call(ctrl, rq.DecommissionTablet(gone))
    assert all(a.reassign is None for a in states(ctrl, t).values())  # nothing started


def test_decommission_moves_one_replica_and_replicated_buckets_off_a_server(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    one = create(ctrl, "one", 3, rf=1)
    two = create(ctrl, "two", 3, rf=2)
    server = states(ctrl, one)[0].leader
    moves = call(ctrl, rq.DecommissionTablet(server))
    tables = {table.path for table, _b, _a in moves}
    assert tables == {"db.one", "db.two"} or (tables == {"db.one"} and
                                              all(server not in a.replicas for a in states(ctrl, two).values()))
    assert call(ctrl, rq.DecommissionTablet(server)) == moves  # resent: the same moves, nothing new
    for table, bucket, a in moves:
        for joining in (r for r in a.reassign if r not in a.isr):
            catch_up(ctrl, one if table.path == "db.one" else two, bucket, joining)
    assert ctrl.assignments.held_by(server) == []
    assert all(len(a.replicas) == 1 and a.leader == a.replicas[0] for a in states(ctrl, one).values())
    assert all(len(a.replicas) == 2 for a in states(ctrl, two).values())
    assert call(ctrl, rq.DecommissionTablet(server)) == []
