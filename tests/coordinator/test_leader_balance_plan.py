"""Preferred leaders in the coordinator's planning (pure, no ZooKeeper): placement spreads the first replicas
counting every bucket's preferred leader, not who leads now (coordinator/placement_plan.py, issue 39); the elections
that give leadership back, their imbalance threshold and who may be elected; and the leader part of
``cluster rebalance``, which reorders replica lists until preferred leaders spread (coordinator/leader_balance_plan.py,
coordinator/rebalance_plan.py)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from kvlease.common.data_loss import RESTORE, UNCLEAN, UNKNOWN, DataLoss
from kvlease.coordinator import election_plan
from kvlease.coordinator import leader_balance_plan as lb
from kvlease.coordinator import rebalance_plan as rb
from kvlease.coordinator.assignment import Assignments, BucketAssignment
from kvlease.coordinator.placement_plan import plan_new

pytestmark = pytest.mark.unit

SERVERS = [1, 2, 3]


def state(replicas, leader=None, isr=None, reassign=None) -> BucketAssignment:
    replicas = tuple(replicas)
    return BucketAssignment(replicas[0] if leader is None else leader, 3, replicas,
                            replicas if isr is None else tuple(isr), 5, reassign)


def tables(*plans: dict) -> Assignments:
    a = Assignments()
    for table_id, plan in enumerate(plans, start=1):
        a.set(table_id, dict(enumerate(plan)) if isinstance(plan, list) else plan)
    return a


def preferred(plan: dict) -> Counter:
    return Counter(x.replicas[0] for x in plan.values())


def spread(counts: Counter, servers=SERVERS) -> int:
    return max(counts[s] for s in servers) - min(counts[s] for s in servers)


def fail_over(a: Assignments, server: int) -> None:
    """``server`` was killed (its leaderships go to the next in-sync replica) and came back in sync: it leads
    nothing it did not lead before, as after a kill -9 and a restart without a preferred-leader election."""
    changes, _unclean = election_plan.servers_changed(a, {server}, set(), set(SERVERS) - {server}, {})
    for table_id, plan in changes.items():
        a.set(table_id, {b: replace(x, isr=x.replicas) for b, x in plan.items()})


# -- placement -----------------------------------------------------------------------------------------------

def test_a_restarted_server_that_leads_nothing_gets_no_more_than_its_share_of_new_preferred_leaders():
    a = tables(plan_new(Assignments(), 6, SERVERS, replication_factor=3))
    fail_over(a, 1)
    assert a.leaders_per_server()[1] == 0 and a.preferred_per_server()[1] == 2  # leads none, still preferred
    plan = plan_new(a, 6, SERVERS, replication_factor=3)
    assert preferred(plan) == Counter({1: 2, 2: 2, 3: 2})  # counting current leaders gave server 1 four of six
    assert all(x.leader == x.replicas[0] and len(set(x.replicas)) == 3 for x in plan.values())


def test_preferred_leaders_stay_spread_over_rounds_of_failovers():
    a = Assignments()
    for round_, victim in enumerate([1, 2, 1, 3, 1], start=1):
        a.set(round_, plan_new(a, 6, SERVERS, replication_factor=3))
        assert spread(preferred(a.table(round_))) == 0, preferred(a.table(round_))
        fail_over(a, victim)
    mean = sum(a.preferred_per_server().values()) / len(SERVERS)
    assert all(abs(n - mean) <= 1 for n in a.preferred_per_server().values()), a.preferred_per_server()


def test_a_new_table_spreads_within_one_and_its_extra_leaders_go_to_the_least_preferred_servers():
    skewed = tables([state([2, 1, 3]), state([2, 3, 1]), state([2, 1, 3]), state([3, 1, 2]), state([3, 2, 1]),
                     state([3, 2, 1])])  # preferred 0 / 3 / 3
    plan = plan_new(skewed, 4, SERVERS, replication_factor=3)
    assert preferred(plan) == Counter({1: 2, 2: 1, 3: 1})  # within one per table, the extra one to server 1
    plan = plan_new(skewed, 3, SERVERS, replication_factor=3)
    assert preferred(plan) == Counter({1: 1, 2: 1, 3: 1})


# -- who may be elected, and when -----------------------------------------------------------------------------

def test_only_a_live_in_sync_replica_that_owes_nothing_is_elected():
    led_by_2 = state([1, 2, 3], leader=2)
    assert lb.preferred_leader(led_by_2, {1, 2, 3}) == replace(led_by_2, leader=1, leader_epoch=4, bucket_epoch=6)
    restore_owed = DataLoss(RESTORE, 3, 0, owed_by=(1,))
    takeover = DataLoss(UNCLEAN, 3, UNKNOWN, leader=2)
    for a, live, excluded in [
        (state([1, 2, 3]), {1, 2, 3}, ()),  # it leads already
        (state([1, 2, 3], leader=2, isr=[2, 3]), {1, 2, 3}, ()),  # not in the ISR
        (led_by_2, {2, 3}, ()),  # not live
        (led_by_2, {1, 2, 3}, {1}),  # decommissioned
        (state([1, 2, 3], leader=2, reassign=(1, 2, 4)), {1, 2, 3}, ()),  # being moved
        (replace(state([1, 2, 3], leader=2, isr=[2, 3]), lost=(1,)), {1, 2, 3}, ()),  # reported its data lost
        (replace(led_by_2, losses=(restore_owed,)), {1, 2, 3}, ()),  # owes the latest restore
        (replace(led_by_2, losses=(takeover,)), {1, 2, 3}, ()),  # the unclean leader has not reported its end
        (BucketAssignment(1, 3), {1}, ()),  # one replica
    ]:
        assert lb.preferred_leader(a, live, excluded) is None, a


def test_the_imbalance_threshold_elects_only_the_servers_over_it():
    led = [state([1, 2, 3]) for _ in range(8)] + [state([1, 2, 3], leader=2)]  # 1 of 9: 11% not led by 1
    led += [state([2, 1, 3], leader=1)] + [state([2, 1, 3]) for _ in range(9)]  # 1 of 10: 10% not led by 2
    a = tables(led)
    assert a.preferred_per_server() == Counter({1: 9, 2: 10})
    assert lb.imbalance(a)[1].percent == pytest.approx(100 / 9) and lb.imbalance(a)[2].percent == 10.0
    assert sorted(lb.elections(a, SERVERS, threshold_pct=10)) == [(1, 8)]  # 10% does not exceed 10
    assert sorted(lb.elections(a, SERVERS, threshold_pct=12)) == []
    assert sorted(lb.elections(a, SERVERS)) == [(1, 8), (1, 9)]  # no threshold: every bucket
    assert lb.elections(a, SERVERS, threshold_pct=0, excluded={1}) == {(1, 9): lb.led_by(a.table(1)[9], 2)}


@pytest.mark.parametrize("seed", range(5))
def test_the_imbalance_kept_as_buckets_change_is_what_a_walk_of_every_bucket_counts(seed):
    rng = random.Random(seed)
    assignments = Assignments()

    def walked() -> dict[int, lb.Imbalance]:
        first, not_led = Counter(), Counter()
        for _t, _b, a in assignments.all():
            if a.replication_factor > 1 and a.reassign is None:
                first[a.replicas[0]] += 1
                not_led[a.replicas[0]] += a.leader != a.replicas[0]
        return {s: lb.Imbalance(n, not_led[s]) for s, n in sorted(first.items())}

    for _ in range(60):
        table_id = rng.randint(1, 6)
        if rng.random() < 0.2:
            assignments.remove(table_id)
        else:
            plan = {}
            for bucket in range(rng.randint(1, 4)):
                replicas = rng.sample(SERVERS, rng.randint(1, 3))
                reassign = tuple(rng.sample(SERVERS, 2)) if rng.random() < 0.2 else None
                plan[bucket] = state(replicas, leader=rng.choice(replicas + [-1]), reassign=reassign)
            assignments.set(table_id, plan)
        assert lb.imbalance(assignments) == walked()
    assignments.by_table = dict(assignments.by_table)  # counted again from scratch: the same
    assert lb.imbalance(assignments) == walked()


def test_a_preferred_replica_back_in_the_isr_is_seen_but_not_a_moves_new_replica():
    out = state([1, 2, 3], leader=2, isr=[2, 3])
    back = replace(out, isr=(1, 2, 3), bucket_epoch=6)
    assert lb.rejoined(out, back)
    assert not lb.rejoined(back, replace(back, bucket_epoch=7))  # in the ISR before
    assert not lb.rejoined(out, replace(back, leader=1))  # it leads
    moving = replace(out, reassign=(1, 2, 3))
    assert not lb.rejoined(moving, replace(back, reassign=(1, 2, 3)))
    assert not lb.rejoined(moving, back)  # a move's completion: the move chose its leader


# -- cluster rebalance: the leaders ---------------------------------------------------------------------------

def skewed_by_old_placement() -> Assignments:
    """What placement counting current leaders left: preferred leaders 12 / 7 / 5 over four tables, all led by
    their preferred replica and in sync."""
    rng = random.Random(39)
    firsts = [1] * 12 + [2] * 7 + [3] * 5
    rng.shuffle(firsts)
    buckets = [state((f, *(s for s in SERVERS if s != f))) for f in firsts]
    return tables(*(buckets[i:i + 6] for i in range(0, 24, 6)))


def apply(a: Assignments, changed: dict) -> Assignments:
    out = Assignments()
    for table_id, plan in a.by_table.items():
        out.set(table_id, {b: changed.get((table_id, b), x) for b, x in plan.items()})
    return out


def test_rebalance_of_the_leaders_spreads_preferred_leaders_per_table_and_over_the_cluster():
    a = skewed_by_old_placement()
    plan = rb.rebalance(a, set(SERVERS), {}, leaders_only=True)
    assert plan.moves == []
    after = apply(a, plan.leaders)
    assert spread(after.preferred_per_server()) <= 1 and spread(after.leaders_per_server()) <= 1
    for table_id in after.by_table:
        assert spread(preferred(after.table(table_id))) <= 1, preferred(after.table(table_id))
    for (t, b), new in plan.leaders.items():
        old = a.table(t)[b]
        assert set(new.replicas) == set(old.replicas) and new.leader == new.replicas[0] and new.isr == new.replicas
        assert new.bucket_epoch == old.bucket_epoch + 1
        assert new.leader_epoch == old.leader_epoch + (new.leader != old.leader)
    assert rb.rebalance(after, set(SERVERS), {}, leaders_only=True).leaders == {}  # resent: nothing more


def test_rebalance_reorders_only_onto_in_sync_replicas_and_leaves_a_stopped_preferred_leader_its_place():
    a = tables([state([1, 2, 3]) for _ in range(4)] + [state([2, 1, 3], leader=1, isr=[1, 3])])
    plan = rb.rebalance(a, set(SERVERS), {}, leaders_only=True)
    firsts = preferred(apply(a, plan.leaders).table(1))
    assert spread(firsts) == 1 and (1, 4) not in plan.leaders  # 2 is not in bucket 4's ISR: no election there
    assert all(new.replicas[0] == 3 or new.replicas[0] == 2 and 2 in new.isr for new in plan.leaders.values())
    down = tables([state([1, 2, 3], leader=2, isr=[2, 3]) for _ in range(3)])
    assert rb.rebalance(down, {2, 3}, {}, leaders_only=True).leaders == {}  # 1 is down: it returns, keeps its place


def test_rebalance_leaves_moved_buckets_to_their_move_and_leaders_only_moves_no_replica():
    a = tables([state([1, 2]) for _ in range(4)])  # server 3 holds nothing
    full = rb.rebalance(a, set(SERVERS), {})
    assert full.moves and not set(full.leaders) & {(t, b) for t, b, _target in full.moves}
    assert rb.rebalance(a, set(SERVERS), {}, leaders_only=True).moves == []


@pytest.mark.parametrize("seed", range(20))
def test_rebalance_of_random_clusters_never_widens_a_tables_spread_and_elects_only_in_sync_replicas(seed):
    rng = random.Random(seed)
    servers = list(range(1, rng.randint(3, 6) + 1))
    a = Assignments()
    for table_id in range(1, rng.randint(1, 5) + 1):
        plan = {}
        for bucket in range(rng.randint(1, 9)):
            replicas = tuple(rng.sample(servers, rng.randint(2, 3)))
            isr = tuple(r for r in replicas if r == replicas[1] or rng.random() < 0.8)
            plan[bucket] = state(replicas, leader=replicas[1] if replicas[0] not in isr else
                                 rng.choice(isr), isr=isr)
        a.set(table_id, plan)
    live = set(servers) - {rng.choice(servers)} if rng.random() < 0.3 else set(servers)
    changed = rb.rebalance(a, live, {}, leaders_only=True).leaders
    after = apply(a, changed)
    for table_id in a.by_table:
        before_counts, after_counts = preferred(a.table(table_id)), preferred(after.table(table_id))
        assert spread(after_counts, live) <= max(1, spread(before_counts, live))
    assert spread(after.preferred_per_server(), live) <= max(1, spread(a.preferred_per_server(), live))
    for (t, b), new in changed.items():
        old = a.table(t)[b]
        assert set(new.replicas) == set(old.replicas) and new.leader == new.replicas[0]
        assert new.leader in new.isr and new.leader in live
