"""The chaos drill's fault plan (ops/drills/chaos_plan.py): a pure function of seed and shape."""

from __future__ import annotations

import pytest

from ops.drills import chaos_plan as cp
from tests.ops.drills.test_drills import CHAOS_ROUNDS, CHAOS_SEEDS

pytestmark = pytest.mark.unit

ENSEMBLE = {"zookeeper": [{}] * 3, "coordinators": [{}] * 2, "tablets": [{}] * 2, "remote": "file:///r"}
SMALL = {"zookeeper": [{}], "coordinators": [{}] * 2, "tablets": [{}], "remote": "s3://bucket/prefix"}


def test_the_same_seed_and_shape_give_the_same_plan_and_other_seeds_other_plans():
    plans = {seed: cp.plan(seed, 8, ENSEMBLE, 6.0) for seed in range(20)}
    assert all(cp.plan(seed, 8, ENSEMBLE, 6.0) == plan for seed, plan in plans.items())
    assert len({tuple(plan) for plan in plans.values()}) == 20


def test_a_plan_uses_only_the_kinds_the_shape_allows_and_over_many_seeds_all_of_them():
    assert cp.allowed_kinds(ENSEMBLE) == list(cp.KINDS)
    assert cp.allowed_kinds(SMALL) == [cp.ZK_RESTART, cp.COORDINATOR_KILL, cp.COORDINATOR_PAUSE, cp.TABLET_RESTART,
                                       cp.TABLET_PAUSE]
    assert cp.allowed_kinds({"zookeeper": [{}]}) == [cp.ZK_RESTART]
    assert cp.allowed_kinds({"zookeeper": [{}], "tablets": [{}]}) == [cp.ZK_RESTART, cp.TABLET_RESTART, cp.TABLET_PAUSE]
    for shape in (ENSEMBLE, SMALL):
        seen = {f.kind for seed in range(50) for f in cp.plan(seed, 6, shape, 6.0)}
        assert seen == set(cp.allowed_kinds(shape))


def test_targets_exist_and_durations_stay_in_their_bounds():
    for seed in range(100):
        for fault in cp.plan(seed, 10, ENSEMBLE, 6.0):
            assert 0 <= fault.gap_s <= cp.MAX_GAP_S
            if fault.kind == cp.ZK_RESTART:
                assert 0 <= fault.target < 3 and 0 <= fault.hold_s <= 3
            elif fault.kind == cp.TABLET_RESTART:
                assert 0 <= fault.target < 2
            elif fault.kind in (cp.COORDINATOR_PAUSE, cp.TABLET_PAUSE):
                assert 0.5 <= fault.hold_s <= 8.0  # up to the session timeout + 2 s
            elif fault.kind == cp.REMOTE_OUTAGE:
                assert 1.0 <= fault.hold_s <= 3.0
            if fault.kind == cp.TABLET_PAUSE:
                assert 0 <= fault.target < cp.ROW_BUCKETS  # the bucket whose leader it pauses
    for kind in (cp.COORDINATOR_PAUSE, cp.TABLET_PAUSE):
        pauses = [f.hold_s for seed in range(200) for f in cp.plan(seed, 10, ENSEMBLE, 6.0) if f.kind == kind]
        assert max(pauses) > 6.0 and min(pauses) < 6.0  # some outlive the session, some do not
    buckets = {f.target for seed in range(200) for f in cp.plan(seed, 10, ENSEMBLE, 6.0) if f.kind == cp.TABLET_PAUSE}
    assert buckets == set(range(cp.ROW_BUCKETS))


def test_each_fault_says_what_it_does():
    assert cp.Fault(cp.COORDINATOR_PAUSE, 0, 7.25, 0.5).describe() == \
        "after 0.5s: SIGSTOP the active coordinator for 7.2s"
    assert cp.Fault(cp.ZK_RESTART, 1, 2.0, 0.0).describe() == \
        "after 0.0s: kill -9 ZooKeeper node #2, back after 2.0s"
    assert cp.Fault(cp.TABLET_PAUSE, 3, 5.5, 1.25).describe() == \
        "after 1.2s: SIGSTOP the leader of bucket 3 for 5.5s"


def test_every_kind_is_drawn_described_and_carried_out():
    """The seam a new kind goes through: a draw, a sentence and a handler for each (chaos_faults.HANDLERS)."""
    from ops.drills.chaos_faults import HANDLERS

    assert set(cp.DRAWS) == set(cp.SAYS) == set(HANDLERS) == set(cp.KINDS)


def test_the_chaos_tests_seeds_make_every_kind_of_fault_between_them_but_a_remote_outage():
    """test_drills' two chaos runs (their clusters' shapes, a 4 s session timeout): a tablet server's and the
    active coordinator's kill -9 on two tablet servers, and a pause of a bucket's leader there that outlives its
    session (the bucket has two replicas: the other one takes over while it is paused), the ZooKeeper leader's
    kill -9 on the ensemble, every kind but a remote outage in all (see test_drills: the stream does not
    survive one during its bootstrap)."""
    one_zookeeper = {"zookeeper": [{}], "coordinators": [{}] * 2, "tablets": [{}] * 2, "remote": "file:///r"}
    ensemble = {"zookeeper": [{}] * 3, "coordinators": [{}] * 2, "tablets": [{}], "remote": "file:///r"}
    kinds = {name: {f.kind for f in cp.plan(CHAOS_SEEDS[name], CHAOS_ROUNDS, shape, 4.0)}
             for name, shape in (("one zookeeper", one_zookeeper), ("ensemble", ensemble))}
    assert {cp.TABLET_RESTART, cp.COORDINATOR_KILL} <= kinds["one zookeeper"]
    assert any(f.kind == cp.TABLET_PAUSE and f.hold_s > 4.0 + 1.0
               for f in cp.plan(CHAOS_SEEDS["one zookeeper"], CHAOS_ROUNDS, one_zookeeper, 4.0))
    assert cp.ZK_LEADER_LOSS in kinds["ensemble"]
    assert kinds["one zookeeper"] | kinds["ensemble"] == set(cp.KINDS) - {cp.REMOTE_OUTAGE}
