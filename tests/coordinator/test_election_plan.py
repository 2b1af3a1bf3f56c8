"""Replica placement, leader election, AlterIsr and controlled shutdown as pure planning (no ZooKeeper)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from kvlease.common import errors
from kvlease.coordinator import election_plan
from kvlease.coordinator.placement_plan import plan_new
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment
from kvlease.coordinator.placement_plan import place

pytestmark = pytest.mark.unit


def state(leader, replicas, isr, leader_epoch=1, bucket_epoch=1):
    return BucketAssignment(leader, leader_epoch, tuple(replicas), tuple(isr), bucket_epoch)


def assignments(*buckets: BucketAssignment) -> Assignments:
    a = Assignments()
    a.set(1, dict(enumerate(buckets)))
    return a


# -- placement ------------------------------------------------------------------------------------

@pytest.mark.parametrize("buckets, rf, servers", [(6, 3, 3), (12, 2, 4), (7, 3, 5), (1, 1, 3), (30, 3, 7)])
def test_replicas_and_leaders_spread_evenly_on_distinct_servers(buckets, rf, servers):
    plan = place(buckets, rf, list(range(1, servers + 1)), Counter(), Counter(), {})
    for a in plan.values():
        assert len(set(a.replicas)) == rf and a.leader == a.replicas[0] and a.isr == a.replicas
        assert (a.leader_epoch, a.bucket_epoch) == (1, 1)
    replicas = Counter(r for a in plan.values() for r in a.replicas)
    leaders = Counter(a.leader for a in plan.values())
    for counts, total in ((replicas, buckets * rf), (leaders, buckets)):
        per_server = [counts[s] for s in range(1, servers + 1)]
        assert sum(per_server) == total and max(per_server) - min(per_server) <= 1, per_server


def test_placement_evens_out_what_servers_already_hold_and_respects_capacity():
    a = Assignments()
    a.set(1, place(2, 2, [1, 2], Counter(), Counter(), {}))  # servers 1 and 2 hold 2 replicas each
    plan = plan_new(a, 3, [1, 2, 3], {}, replication_factor=2)
    replicas = Counter(r for p in (a.table(1), plan) for x in p.values() for r in x.replicas)
    leaders = Counter(x.leader for p in (a.table(1), plan) for x in p.values())
    assert sorted(replicas.values()) == [3, 3, 4] and sorted(leaders.values()) == [1, 2, 2]
    plan = plan_new(a, 1, [1, 2, 3], {1: 3, 2: 2}, replication_factor=2)  # 2 is full, 1 has room for one
    assert plan[0].replicas == (3, 1)
    with pytest.raises(errors.InvalidRequestError, match="bucket 0 needs 2 tablet servers with room"):
        plan_new(a, 1, [1, 2, 3], {1: 2, 2: 2, 3: 5}, replication_factor=2)


def test_old_nodes_load_with_their_leader_as_replicas_and_isr():
    assert BucketAssignment.from_json({"leader": 3, "leader_epoch": 2, "replicas": [3]}) == state(3, [3], [3], 2, 2)
    assert BucketAssignment.from_json({"leader": -1, "leader_epoch": 0, "replicas": []}) == state(-1, [], [], 0, 0)
    new = state(2, [2, 3, 1], [2, 1], 4, 9)
    assert BucketAssignment.from_json(new.to_json()) == new


# -- election ----------------------------------------------------------------------------------------

def test_a_gone_leader_is_replaced_by_the_first_live_isr_member_in_replica_order():
    a = state(1, [1, 2, 3], [1, 3, 2], 4, 7)
    out = election_plan.server_gone(a, {1}, {2, 3})
    assert out.state == state(2, [1, 2, 3], [2, 3], 5, 8) and not out.unclean
    out = election_plan.server_gone(state(1, [1, 2, 3], [1, 3], 4, 7), {1}, {2, 3})
    assert out.state == state(3, [1, 2, 3], [3], 5, 8)  # 2 is live but not in sync


def test_a_gone_follower_leaves_the_isr_and_a_gone_outsider_changes_nothing():
    assert election_plan.server_gone(state(1, [1, 2, 3], [1, 2, 3]), {2}, {1, 3}).state == state(1, [1, 2, 3], [1, 3], 1, 2)
    assert election_plan.server_gone(state(1, [1, 2, 3], [1, 3]), {2}, {1, 3}) is None
    assert election_plan.server_gone(state(1, [1, 2], [1, 2]), {9}, {1, 2}) is None


def test_no_live_isr_member_makes_the_bucket_offline_keeping_its_isr_and_the_last_in_sync_one_leads_again():
    a = state(1, [1, 2, 3], [1], 4, 7)
    offline = election_plan.server_gone(a, {1}, {2, 3}).state
    assert offline == state(UNASSIGNED, [1, 2, 3], [1], 5, 8)
    assert election_plan.server_gone(offline, {2}, {3}) is None  # offline: its ISR stays for server 1
    assert election_plan.server_joined(offline, {2}, {2, 3}) is None  # not in sync: it may not lead
    back = election_plan.server_joined(offline, {1}, {1, 2, 3}).state
    assert back == state(1, [1, 2, 3], [1], 6, 9)


def test_unclean_election_lets_the_first_live_replica_lead_alone():
    out = election_plan.server_gone(state(1, [1, 2, 3], [1], 4, 7), {1}, {2, 3}, unclean=True)
    assert out.unclean and out.state == state(2, [1, 2, 3], [2], 5, 8)
    offline = state(UNASSIGNED, [1, 2, 3], [1], 5, 8)
    out = election_plan.server_joined(offline, {3}, {3}, unclean=True)
    assert out.unclean and out.state == state(3, [1, 2, 3], [3], 6, 9)


def test_one_replica_buckets_wait_for_their_leader_and_its_return_bumps_the_epoch():
    a = state(1, [1], [1], 3, 3)
    assert election_plan.server_gone(a, {1}, set()) is None
    assert election_plan.server_joined(a, {1}, {1}).state == state(1, [1], [1], 4, 4)


def test_a_server_restarted_unseen_is_gone_then_joined():
    a = assignments(state(1, [1, 2], [1, 2], 4, 7), state(2, [2, 1], [2, 1], 1, 1), state(1, [1], [1], 2, 2))
    changes, unclean = election_plan.servers_changed(a, {1}, {1}, {1, 2}, {})
    new = changes[1]
    assert new[0] == state(2, [1, 2], [2], 5, 8)  # led by 1: 2 leads now; 1 rejoins the ISR when caught up
    assert new[1] == state(2, [2, 1], [2], 1, 2)  # followed by 1: out of the ISR
    assert new[2] == state(1, [1], [1], 3, 3)  # one replica: same leader, new epoch
    assert unclean == []


def test_a_leader_not_live_after_a_failover_is_replaced_even_if_nobody_saw_it_go():
    a = assignments(state(1, [1, 2], [1, 2], 4, 7))
    changes, _ = election_plan.servers_changed(a, set(), {2}, {2}, {})
    assert changes[1][0] == state(2, [1, 2], [2], 5, 8)
    assert election_plan.servers_changed(assignments(state(2, [1, 2], [2], 5, 8)), set(), {2}, {2}, {})[0] == {}


def test_unassigned_one_replica_buckets_go_to_the_least_loaded_server_with_room():
    a = assignments(BucketAssignment(UNASSIGNED, 0), BucketAssignment(UNASSIGNED, 0), state(1, [1], [1]))
    changes, _ = election_plan.servers_changed(a, set(), {2}, {1, 2}, {2: 1})
    assert [changes[1][b].leader for b in range(3)] == [2, 1, 1]


# -- AlterIsr ----------------------------------------------------------------------------------------

def test_alter_isr_by_the_current_leader_changes_the_isr_and_bumps_the_bucket_epoch():
    a = state(1, [1, 2, 3], [1], 4, 7)
    assert election_plan.alter_isr(a, 1, 4, 7, [3, 1], {1, 2, 3}) == state(1, [1, 2, 3], [1, 3], 4, 8)


@pytest.mark.parametrize("server, leader_epoch, bucket_epoch", [(2, 4, 7), (1, 3, 7), (1, 4, 6), (1, 5, 7)])
def test_alter_isr_with_stale_epochs_or_not_by_the_leader_is_fenced_with_the_current_state(server, leader_epoch,
                                                                                            bucket_epoch):
    a = state(1, [1, 2, 3], [1, 2], 4, 7)
    with pytest.raises(errors.FencedLeaderEpochError) as info:
        election_plan.alter_isr(a, server, leader_epoch, bucket_epoch, [1, 2, 3], {1, 2, 3})
    assert info.value.details == {"leader": 1, "leader_epoch": 4, "bucket_epoch": 7, "isr": [1, 2]}


def test_a_resent_alter_isr_finds_its_isr_and_succeeds_without_change():
    a = state(1, [1, 2, 3], [1, 2, 3], 4, 8)  # the first call made it; its answer was lost
    assert election_plan.alter_isr(a, 1, 4, 7, [1, 3, 2], {1, 2, 3}) is a
    with pytest.raises(errors.FencedLeaderEpochError):  # an older leader's retry is no retry
        election_plan.alter_isr(state(2, [1, 2, 3], [1, 2, 3], 5, 9), 1, 4, 7, [1, 2, 3], {1, 2, 3})


@pytest.mark.parametrize("isr, message", [([2], "must hold the leader"), ([1, 4], "only replicas"),
                                          ([1, 1], "at most once"), ([1, 3], "not live")])
def test_alter_isr_refuses_an_isr_that_cannot_be(isr, message):
    with pytest.raises(errors.InvalidRequestError, match=message):
        election_plan.alter_isr(state(1, [1, 2, 3], [1, 2], 4, 7), 1, 4, 7, isr, {1, 2})


def test_an_offline_bucket_takes_no_alter_isr():
    with pytest.raises(errors.FencedLeaderEpochError):
        election_plan.alter_isr(state(UNASSIGNED, [1, 2], [1], 4, 7), UNASSIGNED, 4, 7, [UNASSIGNED], {2})


# -- controlled shutdown --------------------------------------------------------------------------

def test_controlled_shutdown_moves_leaderships_to_live_isr_members_and_is_idempotent():
    a = assignments(state(1, [1, 2, 3], [1, 3], 4, 7), state(2, [2, 1], [2, 1], 1, 1), state(1, [1, 2], [1], 1, 1),
                    state(1, [1], [1], 1, 1))
    changes, remaining = election_plan.controlled_shutdown(a, 1, {1, 2, 3})
    assert changes[1][0] == state(3, [1, 2, 3], [3], 5, 8)
    assert changes[1][1] == state(2, [2, 1], [2], 1, 2)
    assert changes[1][2] == state(1, [1, 2], [1], 1, 1)  # no one in sync to take it
    assert changes[1][3] == state(1, [1], [1], 1, 1)  # one replica: nothing to move, not counted
    assert remaining == 1
    a.set(1, changes[1])
    assert election_plan.controlled_shutdown(a, 1, {1, 2, 3}) == ({}, 1)


# -- a leader that cannot write resigns --------------------------------------------------------------

def test_a_resigning_leader_hands_the_bucket_to_the_first_other_live_isr_member_and_leaves_the_isr():
    a = state(1, [1, 2, 3], [1, 2, 3], 4, 7)
    moved = election_plan.resign_leadership(a, 1, 4, {1, 3})  # 2 is in the ISR but not live
    assert moved == election_plan.Resignation(state(3, [1, 2, 3], [2, 3], 5, 8))
    assert election_plan.resign_leadership(state(2, [1, 2, 3], [1, 2, 3], 4, 7), 2, 4, {1, 2, 3}).state == state(
        1, [1, 2, 3], [1, 3], 5, 8)  # replica order: the preferred replica first


def test_a_resignation_resent_after_its_answer_was_lost_changes_nothing():
    a = state(1, [1, 2], [1, 2], 4, 7)
    after = election_plan.resign_leadership(a, 1, 4, {1, 2}).state
    assert after == state(2, [1, 2], [2], 5, 8)
    assert election_plan.resign_leadership(after, 1, 4, {1, 2}) == election_plan.Resignation(after)
    offline = state(UNASSIGNED, [1, 2], [2], 6, 9)  # the new leader died since: still over for epoch 4
    assert election_plan.resign_leadership(offline, 1, 4, {1}) == election_plan.Resignation(offline)


@pytest.mark.parametrize("a, live, why", [
    (state(1, [1, 2], [1], 4, 7), {1, 2}, r"no other live in-sync replica \(ISR \[1\], replicas \[1, 2\]\)"),
    (state(1, [1, 2, 3], [1, 2], 4, 7), {1, 3}, "no other live in-sync replica"),
    (state(1, [1], [1], 4, 4), {1, 2}, "one replica"),
], ids=["isr-of-the-leader-alone", "in-sync-replica-not-live", "one-replica"])
def test_a_resignation_with_no_one_to_take_the_bucket_is_refused_and_changes_nothing(a, live, why):
    kept = election_plan.resign_leadership(a, 1, 4, live, "bucket 0 of db.t")
    assert kept.state is a and re.search(why, kept.refused) and kept.refused.startswith("bucket 0 of db.t")


@pytest.mark.parametrize("a, server, epoch", [
    (state(1, [1, 2], [1, 2], 4, 7), 1, 3),  # leads at a newer epoch: a stale request
    (state(1, [1, 2], [1, 2], 4, 7), 1, 5),  # an epoch the bucket never had
    (state(1, [1, 2], [1, 2], 4, 7), 2, 4),  # not the leader at that epoch
    (state(2, [1, 2], [1, 2], 4, 7), 1, 5),
])
def test_a_resignation_not_by_the_leader_at_its_epoch_is_fenced_with_the_current_state(a, server, epoch):
    with pytest.raises(errors.FencedLeaderEpochError) as info:
        election_plan.resign_leadership(a, server, epoch, {1, 2})
    assert info.value.details == election_plan.current_state(a)


def test_resignations_of_several_buckets_are_one_set_of_changes_with_an_outcome_each():
    a = Assignments()
    a.set(1, {0: state(1, [1, 2], [1, 2], 4, 7), 1: state(1, [2, 1], [1, 2], 2, 3), 2: state(1, [1, 2], [1], 1, 1)})
    a.set(2, {0: state(2, [2, 1], [2, 1], 1, 1)})
    asked = [(1, 0, 4), (1, 1, 2), (1, 2, 1), (2, 0, 1), (1, 9, 1), (3, 0, 1)]
    changes, outcomes = election_plan.resign_leaderships(a, 1, asked, {1, 2}, {1: "table db.a", 2: "table db.b"})
    assert changes == {1: {0: state(2, [1, 2], [2], 5, 8), 1: state(2, [2, 1], [2], 3, 4),
                           2: state(1, [1, 2], [1], 1, 1)}}  # both moves of table 1 in one table's changes
    assert outcomes[:2] == [election_plan.Resignation(changes[1][0]), election_plan.Resignation(changes[1][1])]
    assert outcomes[2].state == a.table(1)[2] and "no other live in-sync replica" in outcomes[2].refused
    assert isinstance(outcomes[3], errors.FencedLeaderEpochError)  # tablet server 2 leads it
    assert isinstance(outcomes[4], errors.InvalidRequestError) and "db.a has no bucket 9" in outcomes[4].message
    assert isinstance(outcomes[5], errors.TableNotExistError)
    for table_id, plan in changes.items():
        a.set(table_id, plan)
    again = election_plan.resign_leaderships(a, 1, asked[:3], {1, 2}, {1: "table db.a", 2: "table db.b"})  # resent: nothing new
    assert again[0] == {} and again[1][:2] == outcomes[:2]
