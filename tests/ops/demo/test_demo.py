"""``kvlease demo``'s code path on a small table, on the tests' shared SparkSession: it passes through both
failovers (the active coordinator, a bucket leader's tablet server), leaves no process or directory behind, and
its checkers catch a change row taken out of its Parquet output."""

from __future__ import annotations

import dataclasses
import os
import threading
import shutil
import tempfile
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvlease.common import errors
from kvlease.ops import local_cluster
from kvlease.ops import demo, streaming
from kvlease.ops.demo import partitioned
from kvlease.ops.streaming import feed_check, stream_failover, stream_query
from kvlease.ops.streaming.change_writer import KEY, VALUES
from kvlease.ops.streaming.leader_kill import LeaderKill
from kvlease.ops.check import Check

#: A quick run: small table on RF 2, short writer, the tests' ZooKeeper session timeout (failovers ~4 s); the
#: tablet server leading bucket 0 is killed after round 7, while the query tails rounds 7-10.
SMALL = dataclasses.replace(demo.DEMO_PLAN, rows=2_000, rounds=10, round_interval_s=0.2, snapshot_every=3,
                            kill_after_round=3, tail_rounds=4, kill_tablet_after_round=7, lease_duration="15s")
FAST = {"zookeeper.session-timeout": "4s"}


def test_the_demo_passes_cleans_up_and_its_checks_catch_a_lost_change_row(spark, monkeypatch, tmp_path):
    seen = {}
    run = stream_failover.run

    def spy(cluster_dir, spark_, work, plan, **kwargs):  # what the demo removes at its end, kept for the test
        outcome = run(cluster_dir, spark_, work, plan, **kwargs)
        offsets = Path(work) / "checkpoint" / "offsets"
        last = max(int(name) for name in os.listdir(offsets) if name.isdigit())
        seen.update(work=Path(work), cluster=local_cluster.load(cluster_dir), output=stream_query.read_output(
            Path(work) / "output"), boot=stream_query.checkpoint_offsets(offsets.parent, 0),
            final=stream_query.checkpoint_offsets(offsets.parent, last))
        return outcome

    monkeypatch.setattr(streaming, "run_failover", spy)
    lines = []
    doc = demo.run_demo(spark=spark, plan=SMALL, config_overrides=FAST, progress=lines.append)

    assert doc["ok"] and doc["result"] == "PASS", demo.render(doc)
    assert doc["rows_loaded"] == 2_000 and doc["changes_written"] >= 2_000 and doc["change_rows"] > 0
    assert doc["snapshots_leased"] == doc["snapshots_released"] == 4
    assert doc["failover"]["killed_coordinator"] != doc["failover"]["active_coordinator"]
    assert 0 < doc["failover"]["seconds"] < 30
    text = demo.render(doc)
    assert text.startswith("kvlease demo: PASS") and "[FAIL]" not in text
    assert any("killed the active coordinator" in line for line in lines)
    partitioned = doc["partitioned"]  # the partitioned table: a partition per day written, one read back
    assert [p["name"] for p in partitioned["partitions"]] == ["20261127", "20261128", "20261129"]
    assert partitioned["rows_read"] == 1_000 and "partitioned table demo.orders_by_day" in text, text
    _assert_tablet_failover(doc, text, seen["cluster"])
    # everything stopped, the temp dir gone, Spark (the caller's) still usable
    assert not seen["work"].exists() and doc["directory"] is None
    procs = [p for role in ("zookeeper", "coordinators", "tablets") for p in seen["cluster"][role]]
    assert not [p["pid"] for p in procs if local_cluster.pid_alive(p["pid"], p.get("proc_start"))]
    assert spark.range(3).count() == 3

    # the planted failure: the after-image of a key's last change taken out of the Parquet output
    output = seen["output"]
    boot = {b: o for b, (_, o) in seen["boot"].items()}
    final = {b: o for b, (_, o) in seen["final"].items()}
    state = feed_check.apply_changes(output, KEY, VALUES)
    table = pa.Table.from_pylist([dict(zip(KEY + VALUES, k + v)) for k, v in state.items()],
                                 schema=output.select(list(KEY + VALUES)).schema)
    assert feed_check.check_tail(output, boot, final).ok and feed_check.check_state(output, table, KEY, VALUES).ok
    last = {}  # id -> index of its last change row
    for i, row in enumerate(output.select(["id", "_log_offset"]).to_pylist()):
        if row["id"] not in last or row["_log_offset"] > output["_log_offset"][last[row["id"]]].as_py():
            last[row["id"]] = i
    victim = next(i for i in last.values() if output["_change_type"][i].as_py() == "update_postimage")
    planted_dir = tmp_path / "planted"
    planted_dir.mkdir()
    pq.write_table(output.take([i for i in range(output.num_rows) if i != victim]), planted_dir / "part.parquet")
    planted = stream_query.read_output(planted_dir)
    tail = feed_check.check_tail(planted, boot, final)
    assert not tail.ok and "missing" in tail.violations[0]
    victim_id = output["id"][victim].as_py()
    assert feed_check.check_state(planted, table, KEY, VALUES).violations[0].startswith(f"id={victim_id}: ")


def _assert_tablet_failover(doc, text, cluster):
    """The leader of bucket 0 was killed mid-stream, its buckets led by the other server, then it came back."""
    t = doc["tablet_failover"]
    assert doc["replication_factor"] == 2 and 0 in t["buckets"] and 0 < t["seconds"] < 30, t
    assert set(t["new_leaders"]) == {str(b) for b in t["buckets"]} and t["killed_tablet"] not in t["new_leaders"].values()
    assert t["restarted"] and t["in_sync_after_restart_s"] is not None
    assert f"tablet server {t['killed_tablet']} (leader of bucket(s)" in text and "started again" in text
    killed = next(p for p in cluster["tablets"] if str(p["id"]) == str(t["killed_tablet"]))
    assert killed["pid"] != t["killed_pid"]  # the cluster.json after the run: the restarted server
    assert {c["name"] for c in doc["checks"]} >= {
        "the changelog holds every acknowledged write once (a retried write is not applied twice)",
        "the killed tablet server's buckets were served again by another replica",
        "the killed tablet server was started again and every bucket's ISR is full again"}


@pytest.mark.unit
def test_a_tablet_failover_that_did_not_happen_or_failed_fails_its_checks():
    abort = threading.Event()
    abort.set()  # its thread returns at once: nothing is killed
    kill = LeaderKill("/nonexistent", None, 1, 0, 1.0, lambda text: None, abort)
    kill.join(1)
    assert [list(c.violations) for c in kill.checks()] == [["the writer stopped before the round that triggers the kill"]] * 2
    kill.trigger()
    kill.join(1)
    kill.error = "bucket(s) [0, 2] were not served again within 1s of killing tablet server 1"
    assert [c.ok for c in kill.checks()] == [False, False]
    kill.result.update(killed=1, buckets=[0, 2], seconds=4.2)
    assert [c.ok for c in kill.checks()] == [True, False]
    kill.result.update(restarted=True, in_sync_s=1.0)
    kill.error = None
    assert [c.ok for c in kill.checks()] == [True, True]


@pytest.mark.unit
def test_a_tablet_failover_needs_a_replicated_table_and_a_tailed_round(monkeypatch, tmp_path):
    monkeypatch.setattr(local_cluster, "bootstrap", lambda cluster_dir: ["127.0.0.1:1"])
    for plan in (dataclasses.replace(SMALL, replication_factor=1), dataclasses.replace(SMALL, kill_tablet_after_round=5)):
        with pytest.raises(errors.InvalidRequestError, match="a tablet failover needs replication factor 2"):
            stream_failover.run("/nonexistent", None, tmp_path, plan)


@pytest.mark.unit
def test_a_directory_in_use_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "something").write_text("x")
    with pytest.raises(Exception, match="not an empty directory"):
        demo.run_demo(str(tmp_path))
    with pytest.raises(Exception, match="--rows must be at least"):
        demo.run_demo(str(tmp_path / "new"), rows=10)
    assert not (tmp_path / "new").exists()


# -- what the demo leaves behind, without processes (the cluster start and the scenario faked) --------------


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    """run_demo with a temp dir under tmp_path, no cluster, a scenario that does ``fake_run.what`` and no
    partitioned table."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(local_cluster, "start", lambda *args, **kwargs: None)
    state = types.SimpleNamespace(what=None)

    def scenario(cluster_dir, spark, work, plan, **kwargs):
        if isinstance(state.what, BaseException):
            raise state.what
        outcome = stream_failover.Outcome(plan, "demo-1", checks=[Check.of("c", state.what)])
        outcome.figures.update(rows_loaded=1, changes_written=1, table_rows=1, bootstrap_rows=1, change_rows=1,
                               micro_batches=1, snapshots_leased=4, snapshots_released=4, lease_renewals_seen=0)
        return outcome

    monkeypatch.setattr(streaming, "run_failover", scenario)
    monkeypatch.setattr(partitioned, "show_partitioned", lambda cluster_dir, progress: ({}, Check.of("p", [])))
    return state


def _work_dirs(tmp_path):
    return [p for p in tmp_path.iterdir() if p.name.startswith("kvlease-demo-")]


@pytest.mark.unit
def test_a_passing_run_removes_its_temp_dir(fake_run, tmp_path):
    fake_run.what = []
    assert demo.run_demo(spark=object())["ok"] and _work_dirs(tmp_path) == []


@pytest.mark.unit
def test_a_failing_run_keeps_its_temp_dir_and_says_so(fake_run, tmp_path):
    fake_run.what = ["id=1: differs"]
    lines = []
    doc = demo.run_demo(spark=object(), progress=lines.append)
    assert not doc["ok"] and doc["result"] == "FAIL" and "      - id=1: differs" in demo.render(doc)
    (kept,) = _work_dirs(tmp_path)
    assert doc["directory"] == str(kept) and lines[-1] == (f"kept {kept} (the servers' and Spark's logs, the "
                                                           "Parquet output); remove it when done")


@pytest.mark.unit
def test_an_error_keeps_the_temp_dir_and_ctrl_c_removes_it(fake_run, tmp_path):
    fake_run.what = errors.KvLeaseError("the streaming query failed: RuntimeError: boom")
    with pytest.raises(errors.KvLeaseError, match="boom"):
        demo.run_demo(spark=object())
    (kept,) = _work_dirs(tmp_path)
    shutil.rmtree(kept)
    fake_run.what = KeyboardInterrupt()
    with pytest.raises(demo.Interrupted) as info:
        demo.run_demo(spark=object())
    assert info.value.message.startswith("stopped every process it started; removed ")
    assert _work_dirs(tmp_path) == []
