"""Bucket leader assignment: planning alone, then the controller on a real ZooKeeper."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from kvlease.common import zkpaths
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column, TableSpec
from kvlease.common.zk import loads, make_client
from kvlease.coordinator import requests as rq
from kvlease.coordinator.placement_plan import plan_new
from kvlease.coordinator.election_plan import servers_joined
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment
from kvlease.coordinator.controller import Controller
from kvlease.coordinator.fencing import FencedWriter, bump_epoch


@pytest.mark.unit
def test_new_tables_spread_over_the_least_loaded_servers():
    a = Assignments()
    a.set(1, plan_new(a, 3, [1, 2]))
    assert sorted(x.leader for x in a.table(1).values()) == [1, 1, 2]
    plan = plan_new(a, 3, [1, 2, 3])
    assert sorted(x.leader for x in plan.values()) == [2, 3, 3]
    load = a.load_per_server()
    for x in plan.values():
        load[x.leader] += 1
    assert max(load.values()) - min(load.values()) <= 1
    assert plan_new(a, 2, []) == {0: BucketAssignment(UNASSIGNED, 0), 1: BucketAssignment(UNASSIGNED, 0)}


@pytest.mark.unit
def test_rejoining_server_gets_new_epochs_and_unassigned_buckets_get_leaders():
    a = Assignments()
    a.set(1, {0: BucketAssignment(1, 1), 1: BucketAssignment(2, 1)})
    a.set(2, {0: BucketAssignment(UNASSIGNED, 0)})
    changes = servers_joined(a, {1}, {1, 2}, {})
    assert changes[1][0] == BucketAssignment(1, 2)
    assert changes[1][1] == BucketAssignment(2, 1)  # untouched
    assert changes[2][0].leader in (1, 2) and changes[2][0].leader_epoch == 1
    assert servers_joined(a, set(), set(), {}) == {}


class Recorder:
    def __init__(self):
        self.pushes = []

    def __call__(self, server_id, address, held, dropped, removed=(), dir_id="", lease=None):
        self.leases = getattr(self, "leases", {})
        self.leases.setdefault(server_id, []).append(lease)
        self.removed = getattr(self, "removed", {})
        self.removed.setdefault(server_id, set()).update((t.table_id, b) for t, b, _a, _addr in removed)
        self.pushes.append((server_id, address, sorted((t.table_id, b, a.leader_epoch) for t, b, a, _addr in held),
                            sorted(dropped)))
        self.held = getattr(self, "held", {})
        self.held[server_id] = {(t.table_id, b): (a, addr) for t, b, a, addr in held}


def call(controller, request):
    future: Future = Future()
    assert not controller.process([(request, future)])
    return future.result(timeout=0)


@pytest.fixture
def ctrl(zk_config):
    zk = make_client(zk_config)
    recorder = Recorder()
    controller = Controller(zk, open_storage(zk_config["remote.data.dir"], zk_config), num_retained=2,
                            max_lease_ms=3_600_000, grace_ms=1000, clock_ms=lambda: 1, notify=recorder)
    controller.reinitialize(FencedWriter(zk, bump_epoch(zk)[1]))
    controller.recorder = recorder
    yield controller
    controller.close()
    zk.stop()
    zk.close()


def register(ctrl, server_id, address):
    ctrl.zk.create(zkpaths.tablet_server(server_id), f'{{"address": "{address}"}}'.encode(), ephemeral=True,
                   makepath=True)
    call(ctrl, rq.TabletServersChanged())


def create(ctrl, name, buckets):
    spec = TableSpec("db", name, (Column("id", "BIGINT"),), ("id",), buckets)
    return call(ctrl, rq.CreateTable(spec))


@pytest.mark.zk
def test_assignment_lifecycle(ctrl):
    early = create(ctrl, "early", 2)  # no tablet server yet
    _table, rows = call(ctrl, rq.GetTableAssignment(early.table_id))
    assert [r[2].leader for r in rows] == [UNASSIGNED, UNASSIGNED]

    register(ctrl, 1, "127.0.0.1:1001")
    register(ctrl, 2, "127.0.0.1:1002")
    _table, rows = call(ctrl, rq.GetTableAssignment(early.table_id))
    assert {r[2].leader for r in rows} <= {1, 2} and all(r[2].leader_epoch == 1 for r in rows)

    t = create(ctrl, "t", 4)
    _table, rows = call(ctrl, rq.GetTableAssignment(t.table_id))
    leaders = [r[2].leader for r in rows]
    total = ctrl.assignments.load_per_server()
    assert total[1] == total[2] == 3  # early's 2 buckets went to server 1 (alone then): t evens it out
    node = loads(ctrl.zk.get(zkpaths.table_assignment(t.table_id))[0])
    assert {int(b): v["leader"] for b, v in node["buckets"].items()} == dict(enumerate(leaders))
    last = {p[0]: p for p in ctrl.recorder.pushes}
    assert {(tid, b) for tid, b, _e in last[1][2]} | {(tid, b) for tid, b, _e in last[2][2]} == (
        {(early.table_id, b) for b in range(2)} | {(t.table_id, b) for b in range(4)})

    # server 2 goes away: its buckets keep their leader, with no address (LEADER_NOT_AVAILABLE)
    ctrl.zk.delete(zkpaths.tablet_server(2))
    call(ctrl, rq.TabletServersChanged())
    _table, rows = call(ctrl, rq.GetTableAssignment(t.table_id))
    assert [r[2].leader for r in rows] == leaders
    assert all((r[3] == "") == (r[2].leader == 2) for r in rows)

    # it returns: same buckets, new leader epochs, and it is told
    register(ctrl, 2, "127.0.0.1:1002")
    _table, rows = call(ctrl, rq.GetTableAssignment(t.table_id))
    assert all(r[2].leader_epoch == (2 if r[2].leader == 2 else 1) for r in rows)
    assert ctrl.recorder.pushes[-1][0] == 2

    # a failover keeps the assignment
    other = Controller(ctrl.zk, ctrl.storage, num_retained=2, max_lease_ms=1000, grace_ms=1000, clock_ms=lambda: 1)
    other.reinitialize(FencedWriter(ctrl.zk, bump_epoch(ctrl.zk)[1]))
    assert other.assignments.by_table == ctrl.assignments.by_table
    other.close()


@pytest.mark.zk
def test_drop_table_tells_its_leaders(zk_config):
    zk = make_client(zk_config)
    recorder = Recorder()
    controller = Controller(zk, open_storage(zk_config["remote.data.dir"], zk_config), num_retained=2,
                            max_lease_ms=3_600_000, grace_ms=1000, clock_ms=lambda: 1, notify=recorder)
    try:
        controller.reinitialize(FencedWriter(zk, bump_epoch(zk)[1]))
        controller.recorder = recorder
        register(controller, 7, "127.0.0.1:1007")
        t = create(controller, "t", 2)
        call(controller, rq.DropTable("db", "t"))
        assert recorder.pushes[-1] == (7, "127.0.0.1:1007", [], [t.table_id])
        assert not zk.exists(zkpaths.table(t.table_id))
    finally:
        controller.close()
        zk.stop()
        zk.close()
