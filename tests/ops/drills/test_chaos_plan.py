"""The chaos drill's fault plan (ops/drills/chaos_plan.py): a pure function of seed and shape."""

from __future__ import annotations

import pytest

from kvlease.ops.drills import chaos_plan as cp
from tests.ops.drills.test_drills import CHAOS_ROUNDS, CHAOS_SEEDS

pytestmark = pytest.mark.unit

ENSEMBLE = {"zookeeper": [{}] * 3, "coordinators": [{}] * 2, "tablets": [{"id": "1"}, {"id": "2"}],
            "remote": "file:///r", "tablet_disk": {"size_bytes": 64 << 20, "tablets": ["1", "2"]}}  # on small disks
SMALL = {"zookeeper": [{}], "coordinators": [{}] * 2, "tablets": [{}], "remote": "s3://bucket/prefix"}


def test_the_same_seed_and_shape_give_the_same_plan_and_other_seeds_other_plans():
    plans = {seed: cp.plan(seed, 8, ENSEMBLE, 6.0) for seed in range(20)}
    assert all(cp.plan(seed, 8, ENSEMBLE, 6.0) == plan for seed, plan in plans.items())
    assert len({tuple(plan) for plan in plans.values()}) == 20


def test_a_plan_uses_only_the_kinds_the_shape_allows_and_over_many_seeds_all_of_them():
    assert cp.allowed_kinds(ENSEMBLE) == list(cp.KINDS) and cp.left_out(ENSEMBLE) == {}
    assert cp.allowed_kinds(SMALL) == [cp.ZK_RESTART, cp.COORDINATOR_KILL, cp.COORDINATOR_PAUSE, cp.TABLET_RESTART,
                                       cp.TABLET_PAUSE]
    assert cp.left_out(SMALL) == {  # what the report says of the kinds not drawn
        cp.ZK_LEADER_LOSS: "needs a 3-node ZooKeeper ensemble (--zk-nodes 3)",
        cp.REMOTE_OUTAGE: "needs a file:// remote (no --remote)",
        cp.DISK_FULL: "needs tablet servers on small disks of their own (kvlease cluster start --tablet-disk SIZE, "
                      "root only)"}
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
            if fault.kind == cp.DISK_FULL:
                assert 0 <= fault.target < cp.ROW_BUCKETS  # the bucket whose leader's disk it fills
                assert 1.0 <= fault.hold_s <= 3.0 + 4.0  # up to replica.leader.failure-timeout + 4 s
    for kind in (cp.COORDINATOR_PAUSE, cp.TABLET_PAUSE):
        pauses = [f.hold_s for seed in range(200) for f in cp.plan(seed, 10, ENSEMBLE, 6.0) if f.kind == kind]
        assert max(pauses) > 6.0 and min(pauses) < 6.0  # some outlive the session, some do not
    for kind in (cp.TABLET_PAUSE, cp.DISK_FULL):
        buckets = {f.target for seed in range(200) for f in cp.plan(seed, 10, ENSEMBLE, 6.0) if f.kind == kind}
        assert buckets == set(range(cp.ROW_BUCKETS))
    fulls = [f.hold_s for seed in range(200) for f in cp.plan(seed, 10, ENSEMBLE, 6.0) if f.kind == cp.DISK_FULL]
    assert max(fulls) > 3.0 + 1.0 and min(fulls) < 3.0  # the leader steps down in some rounds, not in others
    longer = [f.hold_s for seed in range(200) for f in cp.plan(seed, 10, ENSEMBLE, 6.0, failure_timeout_s=10.0)
              if f.kind == cp.DISK_FULL]
    assert max(longer) > 10.0 + 1.0 and max(longer) <= 14.0  # the cluster's own failure timeout counts


def test_a_full_disk_is_drawn_only_when_every_tablet_server_has_a_small_disk_of_its_own():
    """Never the host's disk: a cluster without --tablet-disk, or one with a tablet server started on the host
    disk, gets no disk-full."""
    on_host = {k: v for k, v in ENSEMBLE.items() if k != "tablet_disk"}
    one_without = {**ENSEMBLE, "tablets": [{"id": "1"}, {"id": "2"}, {"id": "3"}]}
    for shape in (on_host, one_without):
        assert cp.DISK_FULL not in cp.allowed_kinds(shape) and cp.DISK_FULL in cp.left_out(shape)
        assert all(f.kind != cp.DISK_FULL for seed in range(100) for f in cp.plan(seed, 10, shape, 6.0))
    # and a plan without it is the plan the seed gave before disk-full existed: old seeds replay as they did
    assert [f.kind for f in cp.plan(4552, CHAOS_ROUNDS, {**on_host, "zookeeper": [{}], "tablets": [{}] * 2}, 4.0)] == \
        [cp.TABLET_PAUSE, cp.COORDINATOR_PAUSE, cp.COORDINATOR_KILL, cp.TABLET_RESTART]


def test_each_fault_says_what_it_does():
    assert cp.Fault(cp.COORDINATOR_PAUSE, 0, 7.25, 0.5).describe() == \
        "after 0.5s: SIGSTOP the active coordinator for 7.2s"
    assert cp.Fault(cp.ZK_RESTART, 1, 2.0, 0.0).describe() == \
        "after 0.0s: kill -9 ZooKeeper node #2, back after 2.0s"
    assert cp.Fault(cp.TABLET_PAUSE, 3, 5.5, 1.25).describe() == \
        "after 1.2s: SIGSTOP the leader of bucket 3 for 5.5s"
    assert cp.Fault(cp.DISK_FULL, 1, 6.25, 0.0).describe() == \
        "after 0.0s: fill the disk of the leader of bucket 1 for 6.2s"


def test_every_kind_is_drawn_described_and_carried_out():
    """The seam a new kind goes through: a draw, a sentence and a handler for each (chaos_faults.HANDLERS)."""
    from kvlease.ops.drills.chaos_faults import HANDLERS

    assert set(cp.DRAWS) == set(cp.SAYS) == set(HANDLERS) == set(cp.KINDS)


def test_the_chaos_tests_seeds_make_every_kind_of_fault_between_them_but_a_remote_outage():
    """test_drills' two chaos runs (their clusters' shapes, a 4 s session timeout, the default 3 s failure
    timeout): on two tablet servers on small disks (as root), a tablet server's kill -9, a SIGSTOP of the active
    coordinator, a pause of a bucket's leader there that outlives its session (the bucket has two replicas: the
    other one takes over while it is paused) and a full disk of a bucket's leader longer than the failure
    timeout (it steps down); the ZooKeeper leader's and the active coordinator's kill -9 on the ensemble; every
    kind but a remote outage in all (see test_drills: the stream does not survive one during its bootstrap).
    Without root (no small disks) the first run keeps the seed it had before disk-full existed."""
    one_zookeeper = {"zookeeper": [{}], "coordinators": [{}] * 2, "tablets": [{"id": "1"}, {"id": "2"}],
                     "remote": "file:///r"}
    on_disks = {**one_zookeeper, "tablet_disk": {"size_bytes": 64 << 20, "tablets": ["1", "2"]}}
    ensemble = {"zookeeper": [{}] * 3, "coordinators": [{}] * 2, "tablets": [{}], "remote": "file:///r"}
    plans = {name: cp.plan(CHAOS_SEEDS[name], CHAOS_ROUNDS, shape, 4.0)
             for name, shape in (("one zookeeper", one_zookeeper), ("one zookeeper on small disks", on_disks),
                                 ("ensemble", ensemble))}
    kinds = {name: {f.kind for f in plan} for name, plan in plans.items()}
    for name in ("one zookeeper", "one zookeeper on small disks"):
        assert {cp.TABLET_RESTART, cp.COORDINATOR_PAUSE} <= kinds[name]
        assert any(f.kind == cp.TABLET_PAUSE and f.hold_s > 4.0 + 1.0 for f in plans[name])
    assert [f.kind for f in plans["one zookeeper on small disks"]].count(cp.DISK_FULL) == 1
    assert any(f.kind == cp.DISK_FULL and f.hold_s > 3.0 + 2.0 for f in plans["one zookeeper on small disks"])
    assert {cp.ZK_LEADER_LOSS, cp.COORDINATOR_KILL} <= kinds["ensemble"]
    assert kinds["one zookeeper on small disks"] | kinds["ensemble"] == set(cp.KINDS) - {cp.REMOTE_OUTAGE}
    assert kinds["one zookeeper"] | kinds["ensemble"] == set(cp.KINDS) - {cp.REMOTE_OUTAGE, cp.DISK_FULL}
