"""``kvlease demo`` on the command line, without running the demo: help, usage errors, exit codes."""

from __future__ import annotations

import json

import pytest

from kvlease.ops import demo
from kvlease.ops.check import Check
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.unit


def summary(ok: bool) -> dict:
    checks = [Check.of("the change rows applied in (bucket, offset) order equal the table",
                       [] if ok else ["id=7: not in the output; in the table: {v: 'x'}"], 10)]
    return {"ok": ok, "result": "PASS" if ok else "FAIL", "seconds": 42.0, "directory": None, "kept": False,
            "table": "demo.orders", "lease_id": "demo.orders-1", "rows_loaded": 10, "changes_written": 10, "table_rows": 10,
            "bootstrap_rows": 10, "change_rows": 12, "micro_batches": 3, "snapshots_leased": 4,
            "snapshots_released": 4, "lease_renewals_seen": 1, "query_s": 20.0,
            "failover": {"killed_coordinator": "1", "killed_pid": 5, "active_coordinator": "2", "seconds": 6.1},
            "replication_factor": 2, "writer_longest_round_s": 5.3,
            "tablet_failover": {"killed_tablet": 1, "killed_pid": 9, "buckets": [0, 2], "new_leaders": {"0": 2, "2": 2},
                                "seconds": 4.7, "restarted": True, "in_sync_after_restart_s": 3.2},
            "checks": [c.as_dict() for c in checks]}


def test_help_says_what_the_demo_does():
    result = run("demo", "--help")
    assert result.exit_code == 0
    for words in ("2 coordinators", "2 tablet", "file://", "Parquet", "kills the active coordinator",
                  "replication factor 2", "tablet server leading", "both failovers",
                  "applied in offset order", "--keep", "--rows", "--dir", "--json", "Ctrl-C"):
        assert words in result.stdout, words


@pytest.mark.parametrize("args, words", [
    (("--rows", "10"), "'--rows': 10 is not in the range x>=1000"),
    (("--rows", "many"), "'--rows': 'many' is not a valid integer"),
    (("--bogus",), "No such option '--bogus'"),
    (("extra",), "unexpected extra argument"),
])
def test_bad_options_are_one_line_usage_errors(args, words, monkeypatch):
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("the demo must not start"))
    line = assert_one_line_error(run("demo", *args), code=2)
    assert words in line and "kvlease demo --help" in line


def test_a_directory_in_use_is_a_one_line_error(tmp_path):
    (tmp_path / "x").write_text("")
    assert "not an empty directory" in assert_one_line_error(run("demo", "--dir", str(tmp_path)))


@pytest.mark.parametrize("ok", [True, False])
def test_the_summary_and_the_exit_code(ok, monkeypatch):
    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda directory, **kw: calls.append((directory, kw)) or summary(ok))
    text = run("demo", "--rows", "5000")
    assert text.exit_code == (0 if ok else 1)
    assert text.stdout.startswith(f"kvlease demo: {'PASS' if ok else 'FAIL'}")
    assert "4 snapshots leased, 4 released" in text.stdout and "serving after 6.1s" in text.stdout
    assert ("tablet failover (replication factor 2): tablet server 1 (leader of bucket(s) 0, 2) killed with -9 "
            "mid-stream, tablet server 2 serving them after 4.7s; the writer went on (longest round 5.3s); tablet "
            "server 1 started again, every ISR full after 3.2s") in text.stdout
    assert ("id=7: not in the output" in text.stdout) != ok
    assert calls[0][0] is None and calls[0][1]["rows"] == 5000 and calls[0][1]["keep"] is False
    as_json = run("demo", "--json")
    assert as_json.exit_code == (0 if ok else 1) and json.loads(as_json.stdout)["result"] == ("PASS" if ok else "FAIL")


def test_keep_prints_how_to_use_the_cluster(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "run_demo", lambda directory, **kw: {**summary(True), "directory": str(tmp_path),
                                                                   "kept": True})
    result = run("demo", "--keep")
    assert result.exit_code == 0 and f"kvlease cluster stop --dir {tmp_path / 'cluster'}" in result.stdout


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch):
    def interrupted(*args, **kwargs):
        raise demo.Interrupted("stopped every process it started; removed /tmp/kvlease-demo-x")

    monkeypatch.setattr(demo, "run_demo", interrupted)
    result = run("demo")
    assert result.exit_code == 130 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "demo interrupted: stopped every process it started; removed /tmp/kvlease-demo-x"]
