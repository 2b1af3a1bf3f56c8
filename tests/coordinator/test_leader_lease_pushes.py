"""The coordinator's side of leader leases on a real ZooKeeper with a real controller (coordinator/leader_leases.py,
coordinator/membership.py): a change that takes a leadership from a live server bumps its demotions node first,
the new leader is told to wait a lease until the old one took a push built after the change, pushes carry what
each server's lease rests on, one that did not arrive is sent again, and a registration in a new ZooKeeper
session is a server that left and came back. Tablet servers are registered by hand (their ZooKeeper nodes)."""

from __future__ import annotations

import pytest

from kvlease.common import zkpaths
from kvlease.coordinator import requests as rq
from kvlease.leases import state as ls
from tests.coordinator.test_assignment import call
from tests.coordinator.test_replication import create, make_ctrl, register, states  # noqa: F401 (fixture)

pytestmark = pytest.mark.zk


def _last(ctrl, server_id: int):
    return ctrl.recorder.leases[server_id][-1]


def _three_replica_table(ctrl):
    """Three servers and a one-bucket table on all of them: the table and its bucket's state."""
    register(ctrl, 1, 2, 3)
    table = create(ctrl, "t", 1, rf=3)
    return table, states(ctrl, table)[0]


def test_moving_a_live_leaders_leadership_ends_its_lease_first_and_its_successor_waits_until_it_let_go(make_ctrl):
    ctrl = make_ctrl()
    table, old = _three_replica_table(ctrl)
    version = ctrl.zk.exists(zkpaths.tablet_demotions(old.leader)).version
    session = ctrl.zk.exists(zkpaths.tablet_server(old.leader)).ephemeralOwner
    assert (_last(ctrl, old.leader).session_id, _last(ctrl, old.leader).demotions) == (session, version)

    target = next(r for r in old.replicas if r != old.leader)
    call(ctrl, rq.ElectLeader(table.table_id, 0, False, target))
    assert ctrl.zk.exists(zkpaths.tablet_demotions(old.leader)).version == version + 1  # its lease ends
    assert ctrl.zk.exists(zkpaths.tablet_demotions(target)).version == 0  # the others' go on
    told = _last(ctrl, target)
    assert 3000 < told.waits[(table.table_id, 0)] <= 4001  # the old leader may hold its lease that long
    demoted = _last(ctrl, old.leader)
    assert demoted.demotions == version + 1 and (table.table_id, 0) not in demoted.waits

    call(ctrl, rq.PushDelivered(old.leader, demoted.seq - 1))  # an older push: it may not have let go
    assert _last(ctrl, target) is told
    call(ctrl, rq.PushDelivered(old.leader, demoted.seq))  # it took the push that ended its leadership
    assert _last(ctrl, target).waits == {(table.table_id, 0): 0}  # told again: no wait


def test_a_leader_whose_registration_is_gone_leaves_nothing_to_wait_for(make_ctrl):
    ctrl = make_ctrl()
    table, old = _three_replica_table(ctrl)
    version = ctrl.zk.exists(zkpaths.tablet_demotions(old.leader)).version
    ctrl.zk.delete(zkpaths.tablet_server(old.leader))  # its session expired
    call(ctrl, rq.TabletServersChanged())
    new = states(ctrl, table)[0]
    assert new.leader != old.leader
    assert _last(ctrl, new.leader).waits == {(table.table_id, 0): 0}
    assert ctrl.zk.exists(zkpaths.tablet_demotions(old.leader)).version == version  # not live: nothing to end


def test_a_registration_in_a_new_session_is_a_server_that_came_back(make_ctrl, zk_config):
    from kvlease.common.zk import make_client

    ctrl = make_ctrl()
    table, old = _three_replica_table(ctrl)
    other = make_client(zk_config)  # its session expired and it registered again, unseen in between
    try:
        node = ctrl.zk.get(zkpaths.tablet_server(old.leader))[0]
        ctrl.zk.delete(zkpaths.tablet_server(old.leader))
        other.create(zkpaths.tablet_server(old.leader), node, ephemeral=True)
        call(ctrl, rq.TabletServersChanged())
        assert states(ctrl, table)[0].leader != old.leader  # it lost its leadership, as a restarted server does
        assert _last(ctrl, old.leader).session_id == other.client_id[0]  # its pushes name its new session
    finally:
        other.stop()
        other.close()


def test_a_push_that_did_not_arrive_is_sent_again_at_the_next_tick(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    create(ctrl, "t", 2, rf=2)
    pushes = len(ctrl.recorder.leases[2])
    call(ctrl, rq.PushUndelivered(2))  # it ran out of retries
    assert len(ctrl.recorder.leases[2]) == pushes
    ctrl.process([(ls.Expire(), None)])
    assert len(ctrl.recorder.leases[2]) == pushes + 1
    ctrl.process([(ls.Expire(), None)])  # once
    assert len(ctrl.recorder.leases[2]) == pushes + 1
