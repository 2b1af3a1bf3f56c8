"""The scale parts of ``bench leases`` without running the benchmark: the idle-CPU rule, the
leases-intact comparison, their rows; and seeding leases that a coordinator then serves (real ZooKeeper)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from kvlease.common.model import Lease, TableBucket
from kvlease.ops.bench import leases as bench_leases
from kvlease.ops.bench import scale as bench_scale
from tests.support.paths import FIXTURES

RECORDED = json.loads((FIXTURES / "bench_all.json").read_text())


def leases_figures(**idle) -> dict:
    f = copy.deepcopy(RECORDED["benchmarks"]["leases"]["figures"])
    f["failover"]["leases"] = bench_scale.compare({"a": (1, {})}, {"a": (1, {})})
    base = {"leases": 1_000, "seconds": 5.0, "loop_cpu_ms_per_s": 0.2, "process_cpu_ms_per_s": 3.0}
    held = {**base, "leases": 100_000, **idle}
    limit = bench_scale.idle_limit_ms(base["loop_cpu_ms_per_s"])
    f["idle"] = {"base": base, "held": held, "limit_ms_per_s": limit, "met": held["loop_cpu_ms_per_s"] <= limit}
    return f


@pytest.mark.unit
def test_idle_cpu_is_the_same_within_noise_up_to_1_5_x_plus_1_ms_per_s():
    assert bench_scale.idle_limit_ms(0.2) == pytest.approx(1.3)
    *_, intact, idle = bench_leases.target_rows(leases_figures(loop_cpu_ms_per_s=1.3))
    assert idle.metric == "idle loop CPU, 100,000 vs 1,000 leases"
    assert (idle.value, idle.anchor, idle.target, idle.at_most, idle.met) == (1.3, 0.2, pytest.approx(1.3), True, True)
    *_, idle = bench_leases.target_rows(leases_figures(loop_cpu_ms_per_s=80.0))  # a walk over every lease per tick
    assert not idle.met
    assert "d. idle loop CPU" in bench_leases.report(leases_figures(loop_cpu_ms_per_s=80.0))


@pytest.mark.unit
def test_leases_intact_means_same_ids_deadlines_and_buckets():
    tb = TableBucket(1, 0)
    before = bench_scale.view([Lease("a", 10, {tb: 1}), Lease("b", 20, {tb: 1}), Lease("c", 30, {tb: 1})])
    assert bench_scale.compare(before, dict(before))["intact"]
    after = dict(before)
    del after["a"]
    after["b"] = (21, {tb: 1})  # a deadline moved
    after["d"] = (40, {tb: 1})
    diff = bench_scale.compare(before, after)
    assert (diff["missing"], diff["extra"], diff["changed"], diff["intact"]) == (1, 1, 1, False)
    assert diff["first_differences"] == ["a", "d", "b"]
    f = leases_figures()
    f["failover"]["leases"] = diff
    rows = bench_leases.target_rows(f)
    (lost,) = [r for r in rows if r.metric == "leases lost or changed by the failover"]
    assert (lost.value, lost.target, lost.met) == (3, 0, False)


@pytest.mark.unit
def test_the_mirror_loaded_line_is_waited_for_after_the_offset(tmp_path):
    log = tmp_path / "coordinator.log"
    log.write_text("... lease mirror loaded: 5000 leases ({})\n")
    offset = log.stat().st_size  # an earlier run of the process: does not count
    with pytest.raises(RuntimeError, match="did not load 5000"):
        bench_scale.wait_mirror_loaded(log, offset, 5_000, 0.3)
    with open(log, "a") as fh:
        fh.write("... lease mirror loaded: 5001 leases ({})\n")
    assert bench_scale.wait_mirror_loaded(log, offset, 5_000, 5.0) < 5.0


@pytest.mark.zk
@pytest.mark.timeout(120)
def test_seeded_leases_are_exactly_what_a_coordinator_loads(make_config):
    """``ops.bench.seed`` writes the persisted layout the coordinator's own store writes and reads."""
    from kvlease.common.storage import open_storage
    from kvlease.common.zk import make_client
    from kvlease.ops.bench.seed import CHUNK, seed_leases
    from tests.support.procs import persisted_leases

    config = make_config()
    ids = [f"s-{i}" for i in range(CHUNK + 7)]  # more than one multi-op
    deadline = int(time.time() * 1000) + 3_600_000
    assert seed_leases(config, 3, 4, ids, deadline, snapshot_id=2) == len(ids)
    zk = make_client(config)
    try:
        loaded = persisted_leases(zk, open_storage(config["remote.data.dir"], config))
        with pytest.raises(RuntimeError, match="seeding leases failed"):
            seed_leases(config, 3, 4, ids[:1], deadline)  # ids must be new: nothing is overwritten
    finally:
        zk.stop()
        zk.close()
    assert loaded == {lease_id: Lease(lease_id, deadline, {TableBucket(3, i % 4): 2}) for i, lease_id in enumerate(ids)}


def test_the_raw_phase_measures_both_kazoo_handlers_and_anchors_on_the_faster(zk_client, zk_config):
    from kvlease.common.zk import connect_string

    settings = bench_leases.BenchSettings(raw_writes=300, raw_window=50, session_timeout_ms=6000)
    raw = bench_leases.raw_phase(connect_string(zk_config), settings)
    by = raw["by_handler"]
    assert set(by) == {"stock", "poll"}
    assert all(rates["create"] > 0 and rates["set"] > 0 for rates in by.values())
    best = max(by.values(), key=lambda rates: rates["create"])
    assert (raw["create_per_s"], raw["set_per_s"]) == (best["create"], best["set"])
    for handler in by:  # every write landed, through each client
        assert len(zk_client.get_children(f"/kvlease-bench-raw-{handler}")) == 300
    report = bench_leases.report({**copy.deepcopy(RECORDED["benchmarks"]["leases"]["figures"]), "raw_zookeeper": raw})
    assert f"stock handler {by['stock']['create']:.1f} and PollHandler {by['poll']['create']:.1f}" in report
