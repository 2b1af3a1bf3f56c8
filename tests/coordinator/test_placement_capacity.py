"""Bucket placement within each tablet server's capacity (``max_buckets`` in its ZooKeeper node):
planning alone, then the controller on a real ZooKeeper refusing a create that cannot be placed."""

from __future__ import annotations

import pytest

from kvlease.common import errors, zkpaths
from kvlease.coordinator import requests as rq
from kvlease.coordinator.placement_plan import plan_new
from kvlease.coordinator.election_plan import servers_joined
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment
from tests.coordinator.test_assignment import call, create, ctrl  # noqa: F401 - the ctrl fixture


@pytest.mark.unit
def test_new_buckets_go_only_to_servers_with_room():
    a = Assignments()
    a.set(1, {b: BucketAssignment(1, 1) for b in range(3)})  # server 1: 3 of its 4
    plan = plan_new(a, 4, [1, 2], {1: 4, 2: 3})
    assert sorted(x.leader for x in plan.values()) == [1, 2, 2, 2]
    assert a.room([1, 2], {1: 4, 2: 3}) == {1: 1, 2: 3}
    assert a.room([1, 2], {1: 4}) == {1: 1, 2: None}  # no capacity registered: no limit
    plan = plan_new(a, 5, [1, 2], {1: 3})  # server 1 full: all on server 2
    assert {x.leader for x in plan.values()} == {2}


@pytest.mark.unit
def test_unassigned_buckets_wait_for_a_server_with_room():
    a = Assignments()
    a.set(1, {0: BucketAssignment(1, 1)})
    a.set(2, {0: BucketAssignment(UNASSIGNED, 0), 1: BucketAssignment(UNASSIGNED, 0)})
    changes = servers_joined(a, set(), {1}, {1: 2})
    assert sorted(x.leader for x in changes[2].values()) == [UNASSIGNED, 1]


def register(ctrl, server_id: int, max_buckets: int) -> None:
    data = f'{{"address": "127.0.0.1:{1000 + server_id}", "incarnation": "x", "max_buckets": {max_buckets}}}'
    ctrl.zk.create(zkpaths.tablet_server(server_id), data.encode(), ephemeral=True, makepath=True)
    call(ctrl, rq.TabletServersChanged())


@pytest.mark.zk
def test_a_create_that_does_not_fit_is_refused_naming_the_full_servers(ctrl):  # noqa: F811
    register(ctrl, 1, 3)
    register(ctrl, 2, 2)
    create(ctrl, "a", 4)
    with pytest.raises(errors.InvalidRequestError) as info:
        create(ctrl, "b", 2)  # 1 bucket free
    message = str(info.value)
    assert "db.b" in message and "2 bucket(s)" in message and "1 free" in message
    assert "tablet server 1 leads 3 of 3" in message or "tablet server 2 leads 2 of 2" in message
    assert "tablet.buckets.max" in message
    assert ("db", "b") not in ctrl.catalog.by_name  # nothing was written
    t = create(ctrl, "c", 1)  # what fits is placed
    _table, rows = call(ctrl, rq.GetTableAssignment(t.table_id))
    assert rows[0][2].leader in (1, 2)
    assert sum(ctrl.assignments.load_per_server().values()) == 5


@pytest.mark.zk
def test_a_server_with_more_buckets_than_one_zookeeper_write_holds_gets_them_all_back(ctrl, monkeypatch):  # noqa: F811
    """Its rejoin bumps every bucket's leader epoch: more than one multi-op can carry (10,000 one-bucket
    tables on a server were 1.5 MB, over ZooKeeper's 1 MB; here the limit is lowered instead)."""
    from kvlease.coordinator import fencing

    monkeypatch.setattr(fencing, "ZK_MAX_WRITE_BYTES", 20_000)
    register(ctrl, 1, 1000)
    tables = [create(ctrl, f"t{i}", 1) for i in range(200)]  # set ops of ~150 bytes each: ~30 KB in all
    ctrl.zk.delete(zkpaths.tablet_server(1))
    call(ctrl, rq.TabletServersChanged())
    pushes = len(ctrl.recorder.pushes)
    register(ctrl, 1, 1000)  # back, a new session
    for t in tables:
        _table, rows = call(ctrl, rq.GetTableAssignment(t.table_id))
        assert (rows[0][2].leader, rows[0][2].leader_epoch) == (1, 2)  # the same leader, a new epoch
    server, _address, led, _dropped = ctrl.recorder.pushes[-1]
    assert len(ctrl.recorder.pushes) > pushes and server == 1
    assert {(tid, e) for tid, _b, e in led} == {(t.table_id, 2) for t in tables}
