"""``kvlease drill tablet-failover`` on a real 3-tablet-server cluster (RF 3, min.insync-replicas 2), with a
4 s ZooKeeper session timeout so that its two rounds (a kill -9 and a SIGSTOP past the timeout) stay short;
its Spark stream runs on the tests' shared SparkSession."""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout

import pytest

from kvlease.ops.drills import registry
from kvlease.ops.drills import tablet_failover
from tests.support.cluster_logs import cluster_logs

FAST = {"zookeeper.session-timeout": "4s", "replica.fetch.wait-max": "200ms"}


@pytest.mark.unit
def test_the_drill_is_registered_and_needs_three_tablet_servers():
    assert registry.drill_module("tablet-failover") is tablet_failover
    assert "tablet-failover" in registry.drill_names()
    with pytest.raises(Exception, match="needs --tablets 3 or more"):
        tablet_failover.check_shape({"zookeeper": [{}], "coordinators": [{}], "tablets": [{}, {}]})


@pytest.fixture
def three_tablets(kvlease_tmp):
    from tests.ops.drills.test_drills import _cluster

    yield from _cluster(kvlease_tmp, coordinators=1, tablets=3, config_overrides=FAST)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tablet_failover(spark, three_tablets):
    from tests.ops.drills.test_drills import assert_checked

    out, started = io.StringIO(), time.time()
    with redirect_stdout(out):
        code = tablet_failover.main(str(three_tablets), True, rounds=2, spark=spark)
    report = json.loads(out.getvalue())
    if code != 0:
        print(cluster_logs(three_tablets, started))  # shown with the failure
    assert code == 0, json.dumps(report, indent=1)
    assert_checked(report, "back in the ISR", "replica's changelog exactly once", "table of every replica",
                   "committed changelog", "identical below the high watermark", "serve within 6s", "right data",
                   "typed error or resume", "ran through every fault", "after the bootstrap",
                   "(bucket, offset) order equal the table")
    figures = report["figures"]
    assert [f.split(": ")[1].split(" tablet")[0] for f in figures["faults"]] == ["kill -9", "SIGSTOP"]
    assert all(0 < s <= 6 for s in figures["served_again_s"]), figures
    assert figures["acknowledged_writes"] > 0 and figures["replicas"] == ["tablet 1", "tablet 2", "tablet 3"]
    assert figures["stream_bootstrap_s"] is not None and figures["stream_micro_batches"] > 3  # tailed the faults


@pytest.mark.unit
def test_all_skips_it_on_a_cluster_of_fewer_tablet_servers():
    from kvlease.ops.drills import all as all_drills

    doc = {"zookeeper": [{}], "coordinators": [{}], "tablets": [{}]}
    assert all_drills._shape_skip("tablet-failover", doc) == "drill tablet-failover needs --tablets 3 or more (the " \
                                                             "cluster has 1)"
    assert all_drills._shape_skip("tablet-failover", {**doc, "tablets": [{}, {}, {}]}) is None


def _frame(base: int, keys: list[bytes], epoch: int = 1) -> bytes:
    from kvlease.common.logentry import encode_payload, frame_header, record_batch

    payload = encode_payload(record_batch([0] * len(keys), keys, [b"v"] * len(keys))).to_pybytes()
    return frame_header(base, len(keys), payload, 1_700_000_000_000, leader_epoch=epoch) + payload


@pytest.mark.unit
def test_the_replica_log_reader_keeps_whole_frames_and_leaves_a_torn_tail_out():
    from kvlease.ops.drills.replica_logs import fingerprints, frames_of

    first, second, third = _frame(0, [b"a", b"b"]), _frame(2, [b"c"]), _frame(3, [b"d"], epoch=2)
    frames = frames_of(first + second + third[:len(third) - 3])
    assert [(f.entry.base_offset, f.entry.next_offset) for f in frames] == [(0, 2), (2, 3)]
    assert [f.data for f in frames] == [first, second]
    assert fingerprints(frames, below=2) == [(0, first)]  # an entry reaching past the HW is left out
    assert frames_of(first + b"\0" * 10) == frames_of(first)  # zeros after the last frame: an unwritten tail
