"""A real benchmark through the real command line, at small sizes (about 10 s).

``kvlease bench writes --rows 20000 --lookups 200 --json --plot FILE.png``
in a child process (``python -m kvlease.ops.cli``) whose ``TMPDIR`` is a directory of
this test: the benchmark starts its own ZooKeeper, coordinator and tablet
server there and must leave nothing behind (the session's leak guard checks
the processes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlease.ops.bench import machine as bench_machine

from tests.support.fixtures.leaks import kill_group
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = REPO


def test_bench_writes_measures_plots_and_cleans_up(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    png = tmp_path / "writes.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEASE_") or k == "KVLEASE_TEST_SESSION"}
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(scratch))
    proc = subprocess.run([sys.executable, "-m", "kvlease.ops.cli", "bench", "writes", "--rows", "20000", "--lookups", "200",
                           "--rounds", "2", "--json", "--plot", str(png)],
                          capture_output=True, text=True, timeout=200, cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # exactly one JSON document on stdout
    entry = doc["benchmarks"]["writes"]
    assert entry["options"] == {"rows": 20_000, "batch": 10_000, "threads": 4, "lookups": 200, "rounds": 2,
                                "schema": "narrow", "engine": "none", "partial": False}
    figures = entry["figures"]
    assert figures["rows"] == 20_000 and figures["lookup"]["single_count"] == 200
    assert figures["upsert_rows_per_s"] > 0 and figures["rocksdb_writebatch_rows_per_s"] > 0
    rounds = figures["round_rows_per_s"]  # the best of each kind counts
    assert len(rounds) == 2 and all(r["upsert"] > 0 and r["rocksdb_writebatch"] > 0 for r in rounds)
    assert figures["upsert_rows_per_s"] == max(r["upsert"] for r in rounds)
    assert figures["rocksdb_writebatch_rows_per_s"] == max(r["rocksdb_writebatch"] for r in rounds)
    assert 0 < figures["snapshot"]["incremental_bytes"] < figures["snapshot"]["full_bytes"]
    (row,) = entry["rows"]
    assert row["value"] == pytest.approx(figures["upsert_rows_per_s"] / figures["rocksdb_writebatch_rows_per_s"])
    assert row["target"] == 0.4 and row["met"] is (row["value"] >= 0.4)
    assert doc["machine"]["cpus"] == os.cpu_count()
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    assert list(scratch.iterdir()) == []  # the benchmark's temp directory is gone


def test_a_terminated_benchmark_stops_what_it_started_and_removes_its_temp_directory(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEASE_") or k == "KVLEASE_TEST_SESSION"}
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(scratch))
    proc = subprocess.Popen([sys.executable, "-m", "kvlease.ops.cli", "bench", "writes", "--rows", "500000", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT), env=env,
                            start_new_session=True)  # its group: what it started goes with it if this test fails
    try:
        seen = []
        for line in proc.stderr:  # progress: wait until its cluster runs and it is upserting
            seen.append(line)
            if ": upserting" in line:  # "round 1 of 3: upserting ..."
                break
        assert any(": upserting" in line for line in seen), "".join(seen)
        assert list(scratch.iterdir())  # its temp directory, with ZooKeeper and servers running from it
        proc.terminate()
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None or proc.returncode != 143:
            kill_group(proc)
            shutil.rmtree(scratch, ignore_errors=True)
    assert proc.returncode == 143, "".join(seen) + rest
    assert "terminated" in rest and "Traceback" not in rest
    assert list(scratch.iterdir()) == []


def test_wait_idle_returns_once_a_process_is_idle_and_waits_while_it_computes():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
                               stdout=subprocess.PIPE, text=True)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert sleeper.stdout.readline() == "ready\n"  # past the sleeper's start-up
        assert bench_machine.wait_idle(sleeper.pid, step_s=0.2, timeout_s=5.0) < 1.5
        assert bench_machine.wait_idle(spinner.pid, step_s=0.2, timeout_s=1.0) >= 1.0
    finally:
        for proc in (sleeper, spinner):
            proc.kill()
            proc.wait()
        sleeper.stdout.close()


def _on_cpu_0(niceness: int):
    def setup() -> None:
        os.sched_setaffinity(0, {0})
        os.nice(niceness)
    return setup


def test_wait_idle_counts_a_starved_computing_process_as_busy():
    """A spinner that gets ~1.5 % of a core (niceness 19 against a niceness-0 spinner on the same core, as a
    full suite's load once left a benchmark's spinner) still computes whenever it runs: not idle. Its CPU
    seconds alone are under wait_idle's 5 %; it is runnable all along."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_on_cpu_0(0))
    starved = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_on_cpu_0(19))
    try:
        time.sleep(0.3)  # both past their start-up
        cpu0 = bench_machine.cpu_seconds(starved.pid)
        assert bench_machine.wait_idle(starved.pid, step_s=0.3, timeout_s=0.9) >= 0.9
        assert bench_machine.cpu_seconds(starved.pid) - cpu0 < 0.05 * 0.9  # what the CPU time alone would say
        assert bench_machine.runnable(starved.pid)
    finally:
        for proc in (hog, starved):
            proc.kill()
            proc.wait()


def test_demand_seconds_counts_the_wait_for_a_core():
    """Two spinners on one core, both at niceness 0: each runs about half the time and waits the other half;
    its demand (on the core + waiting for it) grows about as fast as the wall clock, its CPU seconds half as fast.
    The sleeper is neither running nor runnable."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_on_cpu_0(0))
                for _ in range(2)]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "ready\n"  # past the sleeper's start-up
        pid = spinners[0].pid
        demand0, t0 = bench_machine.demand_seconds(pid), time.monotonic()
        time.sleep(1.0)
        demand, wall = bench_machine.demand_seconds(pid) - demand0, time.monotonic() - t0
        assert demand > 0.5 * wall, (demand, wall)  # its CPU share alone is at most ~0.5 of the wall clock
        assert not bench_machine.runnable(sleeper.pid)
        assert bench_machine.wait_idle(sleeper.pid, step_s=0.2, timeout_s=2.0) < 1.0
    finally:
        for proc in (*spinners, sleeper):
            proc.kill()
            proc.wait()
        sleeper.stdout.close()


def test_wait_machine_idle_waits_while_a_core_computes_and_says_how_busy_the_machine_was():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        t0 = time.monotonic()
        busy = bench_machine.wait_machine_idle(busy_below=0.5 / os.cpu_count(), step_s=0.2, timeout_s=0.6)
        assert time.monotonic() - t0 >= 0.6  # never idle enough: it waited its whole timeout
        assert 0.8 / os.cpu_count() <= busy <= 1.0  # the spinning core at least
    finally:
        spinner.kill()
        spinner.wait()
