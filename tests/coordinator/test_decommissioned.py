"""A decommissioned tablet server is remembered, on a real ZooKeeper with a real controller: the mark
(/decommissioned/{id}) is written with the decommission's moves, keeps new tables, unassigned one-replica
buckets, rebalances and reassigns off the server across its restart and a coordinator failover, and a
recommission clears it; retried calls answer the same. Tablet servers are registered by hand."""

from __future__ import annotations

import pytest

from kvlease.common import errors, zkpaths
from kvlease.coordinator import requests as rq
from tests.coordinator.test_assignment import call
from tests.coordinator.test_reassignment import catch_up, reassign
from tests.coordinator.test_replication import create, make_ctrl, register, states, unregister  # noqa: F401

pytestmark = pytest.mark.zk


def marked(ctrl) -> list[int]:
    """The marks stored in ZooKeeper."""
    return sorted(int(n) for n in ctrl.zk.get_children(zkpaths.DECOMMISSIONED))


def holders(ctrl, table) -> set[int]:
    return {r for a in states(ctrl, table).values() for r in a.replicas}


def servers(ctrl) -> dict[int, bool]:
    rows, _offline, _under, _ids = call(ctrl, rq.ListTabletServers())
    return {sid: retired for sid, _address, _led, _held, retired in rows}


def finish(ctrl, table, moves) -> None:
    """Every moved bucket's new replicas catch up: the moves complete."""
    for _t, bucket, a in moves:
        for joining in (r for r in a.reassign if r not in a.isr):
            catch_up(ctrl, table, bucket, joining)


def test_a_decommissioned_server_takes_no_new_replicas(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 3, rf=2)
    moves = call(ctrl, rq.DecommissionTablet(1))
    assert moves and marked(ctrl) == [1] and 1 in ctrl.members.decommissioned
    assert servers(ctrl) == {1: True, 2: False, 3: False}
    assert call(ctrl, rq.ListTabletServers())[3] == [1]
    assert call(ctrl, rq.DecommissionTablet(1)) == moves  # resent: the mark is there, the same moves
    after = create(ctrl, "after", 4, rf=2)
    assert holders(ctrl, after) == {2, 3}
    one = create(ctrl, "one", 4, rf=1)
    assert holders(ctrl, one) == {2, 3}
    with pytest.raises(errors.InvalidRequestError, match=r"more than the 2 live .* \[1\] are decommissioned"):
        create(ctrl, "three", 1, rf=3)
    finish(ctrl, t, moves)
    assert 1 not in holders(ctrl, t)
    assert call(ctrl, rq.Rebalance()) == ([], [])  # 1 holds nothing and may take nothing
    a = states(ctrl, after)[0]
    with pytest.raises(errors.InvalidRequestError, match=r"\[1\] are decommissioned and take no new replicas"):
        reassign(ctrl, after, 0, (1, a.leader))
    assert call(ctrl, rq.DecommissionTablet(1)) == []  # resent once done: nothing in progress, still marked
    assert marked(ctrl) == [1]


def test_the_mark_survives_the_servers_restart_and_unassigned_buckets_avoid_it(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    assert call(ctrl, rq.DecommissionTablet(2)) == []  # holds nothing: only marked
    unregister(ctrl, 1, 2)
    waiting = create(ctrl, "waiting", 2, rf=1)  # none live: its buckets wait unassigned
    register(ctrl, 2, incarnation="b")  # the decommissioned one comes back alone (restarted)
    assert servers(ctrl) == {2: True}
    assert all(a.leader == -1 for a in states(ctrl, waiting).values())  # not placed on it
    register(ctrl, 1, 2, incarnation="b")
    assert {a.leader for a in states(ctrl, waiting).values()} == {1}
    assert marked(ctrl) == [2]


def test_a_failover_keeps_the_mark_and_recommission_clears_it(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 3, rf=2)
    moves = call(ctrl, rq.DecommissionTablet(3))
    finish(ctrl, t, moves)
    successor = make_ctrl()  # the old coordinator is deposed: the next one loads the mark
    register(successor, 1, 2, 3)
    assert 3 in successor.members.decommissioned and servers(successor)[3] is True
    assert 3 not in holders(successor, create(successor, "after", 4, rf=2))
    assert call(successor, rq.Rebalance()) == ([], [])
    with pytest.raises(errors.CoordinatorFencedError):  # the deposed one clears nothing
        call(ctrl, rq.RecommissionTablet(3))
    assert marked(successor) == [3]

    assert call(successor, rq.RecommissionTablet(3)) is True
    assert marked(successor) == [] and servers(successor)[3] is False
    assert call(successor, rq.RecommissionTablet(3)) is False  # resent: nothing to clear, no error
    moves, _leaders = call(successor, rq.Rebalance())  # 3 holds nothing: the rebalance may fill it now
    assert moves and all(3 in a.reassign for _t, _b, a in moves)


def test_a_rebalance_moves_replicas_left_on_a_decommissioned_server(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    t = create(ctrl, "t", 2, rf=2)
    with pytest.raises(errors.InvalidRequestError, match="no other live server"):
        call(ctrl, rq.DecommissionTablet(1))  # refused as a whole: nothing started, not marked
    assert marked(ctrl) == [] and all(a.reassign is None for a in states(ctrl, t).values())
    register(ctrl, 1, 2, 3)
    assert call(ctrl, rq.DecommissionTablet(1))  # marked, moves started
    successor = make_ctrl()  # a failover while they wait
    register(successor, 1, 2, 3)
    ongoing = call(successor, rq.ListReassignments())
    assert len(ongoing) == 2 and all(1 not in a.reassign for _t, _b, a in ongoing)
    assert call(successor, rq.Rebalance()) == ([], [])  # the moves in progress take care of 1


def test_unknown_tablet_ids_are_refused_and_nothing_is_marked(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    for request, verb in ((rq.DecommissionTablet(9), "decommission"), (rq.RecommissionTablet(9), "recommission")):
        with pytest.raises(errors.InvalidRequestError) as refused:
            call(ctrl, request)
        assert refused.value.message == (f"cannot {verb} tablet server 9: no tablet server with this id is "
                                         "registered or holds a replica (registered: [1, 2])")
    assert marked(ctrl) == []
    assert call(ctrl, rq.RecommissionTablet(2)) is False  # known, not marked


def test_a_deposed_coordinators_decommission_writes_neither_the_mark_nor_the_moves(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 3, rf=2)
    successor = make_ctrl()
    with pytest.raises(errors.CoordinatorFencedError):
        call(ctrl, rq.DecommissionTablet(1))  # one fenced multi-op: the mark and the moves
    register(successor, 1, 2, 3)
    assert marked(successor) == [] and all(a.reassign is None for a in states(successor, t).values())
