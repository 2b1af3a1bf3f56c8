"""The health counts :class:`Assignments` keeps (what the offline / under-replicated bucket metrics publish
after every change) are always the lengths of the lists its full walk, :meth:`Assignments.health`, gives."""

from __future__ import annotations

import random

import pytest

from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment

pytestmark = pytest.mark.unit

SERVERS = (1, 2, 3, 4)


def random_state(rng: random.Random) -> BucketAssignment:
    replicas = tuple(rng.sample(SERVERS, rng.randint(1, 3)))
    isr = tuple(r for r in replicas if rng.random() < 0.7)
    leader = isr[0] if isr and rng.random() < 0.9 else UNASSIGNED
    if leader == UNASSIGNED and rng.random() < 0.2:
        return BucketAssignment(UNASSIGNED, 0)  # never assigned: no replicas
    return BucketAssignment(leader, 1, replicas, isr, 1)


def check(assignments: Assignments, live: set[int]) -> None:
    assignments.validate()
    offline, under = assignments.health(live)
    assert assignments.health_counts(live) == (len(offline), len(under))


@pytest.mark.parametrize("seed", range(5))
def test_kept_counts_follow_sets_removes_and_live_servers(seed):
    rng = random.Random(seed)
    assignments = Assignments()
    for _ in range(300):
        table_id = rng.randint(1, 12)
        if rng.random() < 0.15:
            assignments.remove(table_id)
        else:
            plan = dict(assignments.table(table_id)) or {b: random_state(rng) for b in range(rng.randint(1, 4))}
            plan[rng.choice(sorted(plan))] = random_state(rng)  # one bucket changes, as an ISR change does
            assignments.set(table_id, plan)
        check(assignments, set(rng.sample(SERVERS, rng.randint(0, len(SERVERS)))))


def test_a_new_dict_of_plans_is_counted_again():
    assignments = Assignments()
    assignments.set(1, {0: BucketAssignment(1, 1, (1, 2), (1,), 1)})
    overlay = Assignments()
    overlay.by_table = {**assignments.by_table, 2: {0: BucketAssignment(UNASSIGNED, 3, (2, 3), (2,), 4)}}
    assert overlay.health_counts({1, 2, 3}) == (1, 1)
    assert assignments.health_counts({1, 2, 3}) == (0, 1)
    assert assignments.health_counts({2, 3}) == (1, 0)  # its leader is gone: offline, not under-replicated
    check(overlay, {1, 2, 3})
