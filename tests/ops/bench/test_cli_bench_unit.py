"""``kvlease bench`` in-process (click's CliRunner): help, bad input, output, ``all``.

The benchmarks' ``run`` is replaced by one returning the figures recorded in
``fixtures/bench_all.json`` (a real reduced ``bench all``, and a tiny ``bench partitions``), so everything
after the measurement is the real code: rows, report, table, JSON, plot. A
real run through the CLI is in ``test_bench_e2e.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlease.ops.bench import (bootstrap as bench_bootstrap, leases as bench_leases, scan as bench_scan,
                               writes as bench_writes)
from kvlease.ops.bench import lookups as bench_lookups, partitions as bench_partitions, rebuild as bench_rebuild
from kvlease.ops.bench import freshness as bench_freshness, replication as bench_replication
from tests.support.cli_runner import assert_one_line_error, run
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.unit

RECORDED = json.loads((FIXTURES / "bench_all.json").read_text())
MODULES = {"leases": bench_leases, "writes": bench_writes, "scan": bench_scan, "bootstrap": bench_bootstrap,
           "replication": bench_replication, "rebuild": bench_rebuild, "partitions": bench_partitions,
           "lookups": bench_lookups, "freshness": bench_freshness}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def runs(monkeypatch) -> list[tuple[str, dict]]:
    """Every benchmark's ``run`` returns its recorded figures; the calls (name, options) are listed."""
    calls: list[tuple[str, dict]] = []

    def recorded(name):
        def run_(*, progress, **options):
            calls.append((name, options))
            progress(f"{name}: measuring")
            return RECORDED["benchmarks"][name]["figures"]
        return run_

    for name, module in MODULES.items():
        monkeypatch.setattr(module, "run", recorded(name))
    return calls


def fail_run(monkeypatch, name: str, exc: Exception) -> None:
    def run_(**options):
        raise exc
    monkeypatch.setattr(MODULES[name], "run", run_)


# -- help -------------------------------------------------------------------------------------------


def test_bench_help_says_what_each_benchmark_does():
    result = run("bench", "--help")
    assert result.exit_code == 0, result.output
    for name, words in [("leases", "raw ZooKeeper creates"), ("writes", "WriteBatch"), ("scan", "peak RSS"),
                        ("bootstrap", "Parquet"), ("all", "combined table")]:
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(name + " "))
        assert words in line


@pytest.mark.parametrize("name,expected", [
    ("writes", ["--rows N", "--batch N", "--threads N", "--lookups N", "rocksdict"]),
    ("leases", ["--leases N", "--seconds S", "--raw-writes N", "failover"]),
    ("scan", ["--rows N", "--rounds N", "KvStreamScanner"]),
    ("bootstrap", ["--rows N", "Parquet"]),
    ("rebuild", ["--rows N", "--tail-percent N", "--remote KIND", "moto", "--load-rows-per-s N"]),
    ("partitions", ["--partitions N", "--buckets N", "--tablets N", "--commit-rate R", "--expiring N", "kill -9"]),
    ("all", ["--leases N", "--rows N", "--rounds N", "writes: rows loaded", "every benchmark that has it"]),
])
def test_bench_name_help_lists_its_options(runs, name, expected):
    result = run("bench", name, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"usage: kvlease bench {name} [-h] [--json] [--plot FILE.png]")
    for text in expected:
        assert text in result.stdout
    assert runs == []


# -- bad input: one line, exit 2, nothing run ------------------------------------------------------------


@pytest.mark.parametrize("args,message", [
    ((), "which benchmark? kvlease bench NAME, NAME one of leases, writes, scan, bootstrap, replication, rebuild, partitions, lookups, freshness, all"),
    (("nosuch",), "unknown benchmark 'nosuch'"),
    (("Bad-Name", "--json"), "unknown benchmark 'Bad-Name'"),
    (("writes", "--rows", "abc"), "kvlease bench writes: argument --rows: 'abc' is not a whole number"),
    (("writes", "--rows", "0"), "argument --rows: '0' is not positive"),
    (("writes", "--rows"), "argument --rows: expected one argument"),
    (("writes", "--nosuch"), "unrecognized arguments: --nosuch"),
    (("leases", "--rounds", "2"), "unrecognized arguments: --rounds 2"),
    (("all", "--rows", "1e6"), "kvlease bench all: argument --rows: '1e6' is not a whole number"),
    (("rebuild", "--remote", "gcs"), "argument --remote: 'gcs' is not one of file, s3 or both"),
    (("rebuild", "--load-rows-per-s", "-5"), "argument --load-rows-per-s: '-5' is not a whole number >= 0"),
    (("writes", "--plot", "figures.jpg"), "argument --plot: 'figures.jpg' is not a .png file name"),
    (("all", "--json", "--plot", "{tmp}/missing/figures.png"), "argument --plot: directory '{tmp}/missing' does not exist"),
])
def test_bad_input_is_one_error_line_before_anything_runs(runs, tmp_path, args, message):
    result = run("bench", *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert message.replace("{tmp}", str(tmp_path)) in assert_one_line_error(result, code=2)
    assert runs == []
    assert list(tmp_path.iterdir()) == []


# -- one benchmark -------------------------------------------------------------------------------------


def test_json_and_plot_of_one_benchmark(runs, tmp_path):
    png = tmp_path / "writes.png"
    result = run("bench", "writes", "--rows", "20000", "--json", "--plot", str(png))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # exactly one document
    assert runs == [("writes", {"rows": 20_000, "batch": 10_000, "threads": 4, "lookups": 2000, "rounds": 3,
                                "engine": "none", "partial": False, "schema": "narrow"})]
    assert set(doc) == {"machine", "benchmarks"} and list(doc["benchmarks"]) == ["writes"]
    entry = doc["benchmarks"]["writes"]
    assert entry["options"]["rows"] == 20_000 and entry["figures"] == RECORDED["benchmarks"]["writes"]["figures"]
    (row,) = entry["rows"]
    assert row["target"] == 0.4 and row["met"] is (row["value"] >= 0.4)
    assert {"cpus", "cpu_model", "load_average", "load_average_end", "date"} <= set(doc["machine"])
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert "writes: measuring" in result.stderr and f"plot written to {png}" in result.stderr


def test_the_global_json_flag_counts_too(runs):
    result = run("--json", "bench", "leases", "--leases", "100000")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["benchmarks"]["leases"]["options"]["leases"] == 100_000


def test_text_output_is_the_report_then_the_table(runs):
    result = run("bench", "scan", "--rounds", "1")
    assert result.exit_code == 0, result.output
    report, table = result.stdout.split("\n\nbenchmark ")
    assert report.startswith("== scan ==\n20,000 rows") and "raw rocksdict iteration" in report
    lines = table.splitlines()
    assert len(lines) == 5 and all(line.startswith("scan ") for line in lines[1:])
    assert lines[1].split()[-1] in ("yes", "NO")


def test_a_failing_benchmark_is_an_error_line_and_exit_1(runs, monkeypatch):
    from kvlease.common.errors import KvLeaseError

    fail_run(monkeypatch, "writes", KvLeaseError("ZooKeeper did not start"))
    result = run("bench", "writes", "--json")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == "error: ZooKeeper did not start"


# -- all ------------------------------------------------------------------------------------------------


def test_all_runs_every_benchmark_in_order_with_its_options_and_one_table(runs):
    result = run("bench", "all", "--rows", "20000", "--leases", "2000")
    assert result.exit_code == 0, result.output
    assert [name for name, _ in runs] == ["leases", "writes", "scan", "bootstrap", "replication", "rebuild", "partitions",
                                          "lookups", "freshness"]
    options = dict(runs)
    assert options["leases"]["leases"] == 2000 and "rows" not in options["leases"]
    assert options["writes"]["rows"] == options["scan"]["rows"] == options["bootstrap"]["rows"] == 20_000
    table = result.stdout.split("\n\nbenchmark ")[-1].splitlines()
    assert [line.split()[0] for line in table[1:]] == ["leases"] * 4 + ["writes"] + ["scan"] * 4 + ["bootstrap"] + ["replication"] * 6 + ["rebuild"] * 4 + ["partitions"] * 5 + ["lookups"] + ["freshness"] * 10
    for name in MODULES:
        assert f"== {name} ==" in result.stdout


def test_all_goes_on_after_a_failure_and_exits_1(runs, monkeypatch, tmp_path):
    fail_run(monkeypatch, "scan", RuntimeError("a full scan returned 3 rows, expected 20000"))
    png = tmp_path / "all.png"
    result = run("bench", "all", "--json", "--plot", str(png))
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert list(doc["benchmarks"]) == ["leases", "writes", "scan", "bootstrap", "replication", "rebuild", "partitions",
                                          "lookups", "freshness"]
    assert doc["benchmarks"]["scan"]["error"] == "RuntimeError: a full scan returned 3 rows, expected 20000"
    assert doc["benchmarks"]["bootstrap"]["rows"] == RECORDED["benchmarks"]["bootstrap"]["rows"]
    assert "error: bench scan failed: RuntimeError" in result.stderr
    assert png.read_bytes().startswith(PNG_SIGNATURE)
