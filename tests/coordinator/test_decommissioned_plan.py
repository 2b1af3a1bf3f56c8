"""Pure placement with decommissioned servers (coordinator/decommissioned.py): a new table, an unassigned
one-replica bucket, a rebalance and another server's decommission never choose a marked server; a rebalance
moves what is left on one off it. No ZooKeeper, no processes."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.common.tables import Column, TableInfo
from kvlease.coordinator import election_plan
from kvlease.coordinator import rebalance_plan as rb
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.membership import Membership

pytestmark = pytest.mark.unit


def state(replicas, leader=None) -> BucketAssignment:
    replicas = tuple(replicas)
    return BucketAssignment(replicas[0] if leader is None else leader, 3, replicas, replicas, 5)


def table_of(*states_) -> Assignments:
    a = Assignments()
    a.set(1, dict(enumerate(states_)))
    return a


def members(live, decommissioned=(), capacity=None) -> Membership:
    m = Membership(None, TableCatalog())  # type: ignore[arg-type]  # plan_table reads no ZooKeeper
    m.servers = {s: f"127.0.0.1:{1000 + s}" for s in live}
    m.capacity = {s: (capacity or {}).get(s) for s in live}
    m.decommissioned.ids = set(decommissioned)
    return m


def table(buckets: int, replication_factor: int) -> TableInfo:
    return TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), buckets,
                     replication_factor=replication_factor, min_insync_replicas=1)


def test_a_new_table_has_no_replica_on_a_decommissioned_server():
    m = members([1, 2, 3, 4], decommissioned=[3])
    plan, _op = m.plan_table(table(8, 2))
    assert all(3 not in a.replicas for a in plan.values())
    assert {r for a in plan.values() for r in a.replicas} == {1, 2, 4}
    one, _op = members([1, 2], decommissioned=[1]).plan_table(table(4, 1))
    assert {a.leader for a in one.values()} == {2}


def test_a_create_needing_a_decommissioned_server_is_refused_naming_it():
    with pytest.raises(errors.InvalidRequestError) as refused:
        members([1, 2, 3], decommissioned=[2, 3]).plan_table(table(2, 2))
    message = refused.value.message
    assert "replication factor 2 is more than the 1 live tablet server(s) taking new replicas" in message
    assert "[2, 3] are decommissioned" in message and "recommission" in message and "\n" not in message
    with pytest.raises(errors.InvalidRequestError, match=r"\[1\] are decommissioned"):
        members([1], decommissioned=[1]).plan_table(table(1, 1))  # one replica: not left waiting unassigned
    with pytest.raises(errors.InvalidRequestError) as plain:
        members([1]).plan_table(table(1, 2))
    assert "decommissioned" not in plain.value.message  # none marked: the error as before
    assert members([]).plan_table(table(1, 1))[0][0].leader == UNASSIGNED  # none live: it waits, as before


def test_an_unassigned_one_replica_bucket_is_not_placed_on_a_decommissioned_server():
    a = Assignments()
    a.set(1, {0: BucketAssignment(UNASSIGNED, 0), 1: BucketAssignment(UNASSIGNED, 0)})
    changes, _unclean = election_plan.servers_changed(a, set(), {1, 2}, {1, 2}, {}, excluded={1})
    assert [changes[1][b].leader for b in (0, 1)] == [2, 2]
    changes, _unclean = election_plan.servers_changed(a, set(), {1}, {1}, {}, excluded={1})
    assert changes == {}  # only a marked server is live: they wait


def test_another_decommission_does_not_move_replicas_to_a_decommissioned_server():
    a = table_of(state([1, 2]), state([2, 1]), state([1, 4]))
    moves = rb.decommission(a, 1, {1, 2, 3, 4}, {}, excluded={3})
    assert len(moves) == 3 and all(3 not in target and 1 not in target for _t, _b, target in moves)
    with pytest.raises(errors.InvalidRequestError, match=r"live: \[1, 2, 3\], decommissioned: \[3\]"):
        rb.decommission(table_of(state([1, 2])), 1, {1, 2, 3}, {}, excluded={3})


def test_rebalance_moves_replicas_off_a_decommissioned_server_and_never_onto_one():
    a = table_of(state([1, 2]), state([2, 1]), state([1, 3]), state([3, 2]))
    plan = rb.rebalance(a, {1, 2, 3, 4}, {}, excluded={1})
    targets = {b: target for _t, b, target in plan.moves}
    assert sorted(targets) == [0, 1, 2]  # every bucket on 1
    assert all(1 not in target for target in targets.values())
    assert targets[0] == (4, 2) and targets[1][0] == 2  # the replaced server's place in the list is kept
    load = {s: 0 for s in (2, 3, 4)}
    for bucket, replicas in {**{b: s.replicas for b, s in a.table(1).items()}, **targets}.items():
        for r in replicas:
            load[r] += 1
    assert max(load.values()) - min(load.values()) <= 1
    assert plan.leaders == {}
    assert rb.rebalance(table_of(state([1, 2])), {1, 2}, {}, excluded={1}).moves == []  # nowhere to go


def test_rebalance_elects_no_decommissioned_preferred_leader_and_fills_no_marked_server():
    led_by_2 = BucketAssignment(2, 3, (1, 2), (1, 2), 5)  # 1 is preferred, in sync
    plan = rb.rebalance(table_of(led_by_2), {1, 2}, {}, excluded={1})
    assert plan.leaders == {} and plan.moves == []  # 1 cannot go: nowhere else; nor lead again
    assert rb.rebalance(table_of(led_by_2), {1, 2}, {}).leaders  # unmarked: it leads again
    full = table_of(*(state([1, 2]) for _ in range(4)))
    plan = rb.rebalance(full, {1, 2, 3}, {}, excluded={3})
    assert plan.moves == []  # 3 joined but is marked: nothing moves to it
