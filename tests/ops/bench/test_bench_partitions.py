"""``bench partitions`` for real at a tiny scale (about 40 s): its own ZooKeeper, two coordinators and three tablet
servers (processes), 20 partitions x 2 buckets x RF 2, 10 partitions dropped by retention; every target row is
computed (not that this tiny run meets the targets), nothing is left behind (the session's leak guard checks the
processes, this test the temp directory). The rows' verdicts are checked on made-up figures."""

from __future__ import annotations

import math

import pytest

from kvlease.ops.bench import partition_phases as phases
from kvlease.ops.bench import partitions as bench_partitions
from kvlease.ops.bench import suite as bench_suite

TINY = {"partitions": 20, "buckets": 2, "tablets": 3, "commit_rate": 20.0, "idle_seconds": 1.0, "rounds": 2,
        "expiring": 10}
METRICS = ["failover, 20 partitions", "leases lost or changed by the failover",
           "idle loop CPU, 20 partitions / one table", "lease acquire --latest, 20 partitions / one",
           "retention dropping 10 partitions at once"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_tiny_run_computes_every_target_row_and_cleans_up(scratch, monkeypatch):
    monkeypatch.setattr(phases, "WRITES_TAIL_S", 0.0)  # 20 partitions' log ends: no tail worth waiting 11 s for
    seen: list[str] = []
    f = bench_partitions.run(**TINY, progress=seen.append)
    assert f["settings"]["partitions"] == 20 and f["bucket_replicas"] == 20 * 2 * 2
    assert f["create"]["partitions"] == 20 and f["create"]["seconds"] > 0
    assert set(f["create"]["cpu_s"]) == {"coordinators", "tablets", "zookeeper", "bench"}
    assert f["initial_commits"]["snapshots"] == 40
    assert f["lease_latest"]["big"]["buckets"] == 40 and f["lease_latest"]["one"]["buckets"] == 2
    assert len(f["lease_latest"]["big"]["rounds_ms"]) == 2
    leases = f["failover"]["leases"]
    assert leases["before"] == 4 and f["failover"]["lease_buckets"] == 2 * 40 + 2 * 2  # the --latest leases
    assert f["retention"]["partitions"] == 10 and f["retention"]["created"]["partitions"] == 10
    assert f["committer"]["commits"] > 0
    rows = bench_partitions.target_rows(f)
    assert [row.metric for row in rows] == METRICS
    for row in rows:
        assert math.isfinite(row.value) and row.value >= 0 and row.at_most
    assert rows[0].target == f["failover"]["session_timeout_s"] + 2 and rows[1].target == 0
    assert (rows[2].target, rows[3].target, rows[4].target) == (2.0, 10.0, 30.0)
    idle = f["idle"]
    assert rows[2].value == pytest.approx(idle["big"]["loop_cpu_ms_per_s"] / idle["one_table"]["loop_cpu_ms_per_s"])
    text = bench_partitions.report(f)
    for words in ("creating the partitions", "idle loop CPU", "lease acquire --latest", "failover", "retention",
                  "snapshots committed meanwhile"):
        assert words in text
    assert any(line.startswith("5. kill -9") for line in seen)
    assert list(scratch.iterdir()) == []  # its cluster is gone


def figures(*, idle=(0.4, 0.5), latest=(10.0, 60.0), failover_s=7.0, lost=0, retention_s=3.0) -> dict:
    """Made-up figures with just what the rows read."""
    return {"settings": {"partitions": 1000},
            "failover": {"failover_s": failover_s, "session_timeout_s": 6.0, "target_s": 8.0,
                         "leases": {"missing": lost, "extra": 0, "changed": 0, "before": 10}},
            "idle": {"one_table": {"loop_cpu_ms_per_s": idle[0]}, "big": {"loop_cpu_ms_per_s": idle[1]}},
            "lease_latest": {"one": {"median_total_ms": latest[0]}, "big": {"median_total_ms": latest[1]}},
            "retention": {"partitions": 100, "gone_s": retention_s, "target_s": 30.0}}


@pytest.mark.unit
@pytest.mark.parametrize("changes,unmet", [
    ({}, []),
    ({"failover_s": 8.5}, [0]),
    ({"lost": 1}, [1]),
    ({"idle": (0.4, 0.81)}, [2]),
    ({"idle": (0.0, 0.0)}, []),  # an anchor of 0 is taken as 0.001 ms/s: no division by zero
    ({"latest": (10.0, 101.0)}, [3]),
    ({"retention_s": 31.0}, [4]),
])
def test_each_row_is_judged_against_its_target(changes, unmet):
    rows = bench_partitions.target_rows(figures(**changes))
    assert [i for i, row in enumerate(rows) if not row.met] == unmet
    assert all(row.at_most for row in rows)
    table = bench_suite.table_lines({"benchmarks": {"partitions": {"rows": [row.doc() for row in rows]}}})
    assert len(table) == 1 + len(rows)
