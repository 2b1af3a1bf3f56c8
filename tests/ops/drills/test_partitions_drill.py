"""``kvlease drill partitions`` once, through the real CLI, for 15 s on a cluster of 2 coordinators and 2 tablet
servers started with ``auto-partition.check-interval=1s`` and a 4 s ZooKeeper session timeout (tier 3); and,
without a cluster, the shape it asks for and what its orphan check says about a planted leftover."""

from __future__ import annotations

import pytest

from kvlease.ops.drills import all as all_drills
from kvlease.ops.drills import partition_checks, partitions, registry
from kvlease.ops.drills.cluster import ClusterShapeError

SETTINGS = {"zookeeper.session-timeout": "4s", "auto-partition.check-interval": "1s"}


@pytest.mark.unit
def test_registered_and_a_cluster_without_a_short_check_interval_is_told_how_to_start_one():
    assert registry.drill_module("partitions") is partitions and "partitions" in registry.drill_names()
    no_config = {"log": "/nonexistent/coordinator.log"}
    doc = {"zookeeper": [{}], "coordinators": [no_config] * 2, "tablets": [{}, {}], "remote": "file:///tmp/r"}
    with pytest.raises(ClusterShapeError, match="--set auto-partition.check-interval=1s"):
        partitions.check_shape(doc)  # no config file: the default 10 min
    assert all_drills._shape_skip("partitions", {**doc, "tablets": [{}]}) == \
        "drill partitions needs --tablets 2 or more (the cluster has 1)"


@pytest.mark.unit
def test_a_leftover_is_named_with_its_path_partition_and_drop_time():
    seen = {57: partition_checks.Seen(57, "20261129200501", 100.0, 101.0, gone=101.5)}
    check = partition_checks.no_orphans({"/d/tablet-1/data/57": 57}, {"/d/remote/kv/3/p58": 58}, seen, 4)
    assert not check.ok and check.checked == 4
    assert check.violations[0] == ("local /d/tablet-1/data/57: partition 20261129200501 (id 57), "
                                   "dropped between 00:01:41.0 and 00:01:41.5")
    assert check.violations[1] == "remote /d/remote/kv/3/p58: partition id 58 (never listed by the drill)"


@pytest.fixture(scope="module")
def cluster(kvlease_tmp):
    from tests.ops.drills.test_drills import _cluster

    yield from _cluster(kvlease_tmp, coordinators=2, tablets=2, config_overrides=dict(SETTINGS))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_partitions_drill_passes_through_two_coordinator_kills(cluster):
    from tests.ops.drills.test_drills import assert_checked, drill

    report = drill(cluster, "partitions", "--seconds", "15")
    assert report["drill"] == "partitions"
    assert_checked(report, "no partition within retention lost", "retriable ones", "stay readable while the lease",
                   "dropped within", "no local bucket dir or remote file")
    figures = report["figures"]
    assert figures["kills"] == 2 and figures["rows_acknowledged"] > 0
    assert figures["partitions_dropped"] > 0  # retention dropped some while the drill ran
    assert figures["held_dropped_after_release_s"] is not None
