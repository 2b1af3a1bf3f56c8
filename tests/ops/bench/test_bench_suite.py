"""The benchmark suite without running a benchmark: rows and targets, the table, options, the plot.

``fixtures/bench_all.json`` is the document of a real ``kvlease bench all
--json`` at reduced sizes (``--leases 2000 --seconds 3 --raw-writes 5000
--rows 20000 --lookups 200 --rounds 1``) with, added to it, that of a real ``kvlease bench partitions
--partitions 20 --buckets 2 --expiring 10 --idle-seconds 1 --rounds 2 --json``, so the figures have the
shapes the benchmarks really produce.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvlease.ops.bench import (bootstrap as bench_bootstrap, freshness as bench_freshness, leases as bench_leases,
                               lookups as bench_lookups, plot as bench_plot, scan as bench_scan)
from kvlease.ops.bench import partitions as bench_partitions, rebuild as bench_rebuild, replication as bench_replication
from kvlease.ops.bench import machine as bench_machine, suite as bench_suite, writes as bench_writes
from kvlease.ops.bench.suite import MB, Row
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.unit

RECORDED = json.loads((FIXTURES / "bench_all.json").read_text())
MODULES = {"leases": bench_leases, "writes": bench_writes, "scan": bench_scan, "bootstrap": bench_bootstrap,
           "replication": bench_replication, "rebuild": bench_rebuild, "partitions": bench_partitions,
           "lookups": bench_lookups, "freshness": bench_freshness}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def figures(name: str) -> dict:
    return copy.deepcopy(RECORDED["benchmarks"][name]["figures"])


def doc_of(**rows: list[Row]) -> dict:
    """A suite document with the given rows per benchmark."""
    return {"machine": {"cpus": 2, "cpu_model": "Test CPU 9000", "load_average": [1.5, 1.0, 0.5],
                        "load_average_end": [2.0, 1.2, 0.6], "python": "3.11", "date": "2026-11-23T05:11:03+00:00"},
            "benchmarks": {name: {"options": {}, "figures": {}, "rows": [r.doc() for r in rs]}
                           for name, rs in rows.items()}}


# -- rows: met or not ---------------------------------------------------------------------------------


def test_a_ratio_is_met_at_or_above_its_target():
    assert Row.ratio("r", 40.0, 100.0, "rows/s", 0.4).met  # exactly the target
    assert Row.ratio("r", 50.0, 100.0, "rows/s", 0.4).met
    below = Row.ratio("r", 39.0, 100.0, "rows/s", 0.4)
    assert below.value == pytest.approx(0.39) and not below.met
    assert not Row.ratio("r", 5.0, 0.0, "rows/s", 0.4).met  # no anchor measured: never met


def test_a_limit_is_met_at_or_below_its_target():
    assert Row.limit("failover", 8.0, 6.0, "s", 8.0).met
    assert Row.limit("failover", 6.5, 6.0, "s", 8.0).met
    over = Row.limit("failover", 8.01, 6.0, "s", 8.0)
    assert over.value == 8.01 and over.value_unit == "s" and not over.met


def test_a_row_round_trips_through_its_document():
    row = Row.limit("peak", 50.0, 4.0, "MB", 40.0)
    doc = row.doc()
    assert doc["met"] is False and Row.from_doc(json.loads(json.dumps(doc))) == row


# -- each benchmark's rows from its figures ---------------------------------------------------------------


def test_writes_judges_putkv_against_raw_writebatch_at_0_4():
    f = figures("writes")
    f["upsert_rows_per_s"], f["rocksdb_writebatch_rows_per_s"] = 410_000.0, 1_000_000.0
    (row,) = bench_writes.target_rows(f)
    assert (row.measured, row.anchor, row.target) == (410_000.0, 1_000_000.0, 0.4)
    assert row.value == pytest.approx(0.41) and row.met
    f["upsert_rows_per_s"] = 390_000.0
    assert not bench_writes.target_rows(f)[0].met


def test_writes_reports_each_round_of_both_kinds():
    f = figures("writes")
    f["round_rows_per_s"] = [{"upsert": 1_230_000.0, "rocksdb_writebatch": 2_500_000.0},
                             {"upsert": 1_100_000.0, "rocksdb_writebatch": 2_750_000.0}]
    text = bench_writes.report(f)
    assert "best of 2 alternating rounds" in text and "1.23M / 2.50M, 1.10M / 2.75M" in text


def test_leases_judges_acquires_against_raw_creates_and_failover_against_the_session_timeout():
    f = figures("leases")
    f["acquire"]["per_s"], f["raw_zookeeper"]["create_per_s"] = 600.0, 1000.0
    f["failover"].update(failover_s=8.5, session_timeout_s=6.0, leases_held=10_000)
    acquire, failover, *_ = bench_leases.target_rows(f)  # then leases intact, idle CPU
    assert acquire.value == pytest.approx(0.6) and acquire.target == 0.5 and acquire.met
    assert failover.metric == "failover, 10,000 leases held"
    assert (failover.value, failover.anchor, failover.target, failover.at_most) == (8.5, 6.0, 8.0, True)
    assert not failover.met


def test_scan_judges_decoded_rates_and_server_memory():
    f = figures("scan")
    f["rows_per_s"].update(raw=1_000_000.0, stream_decoded=760_000.0, unary_decoded=640_000.0)
    f["batch_size_bytes"] = 4 * MB
    for name, doc in f["server_memory"].items():
        doc["peak_above_before"] = 41 * MB if name == "unary_records" else 10 * MB
    f["concurrent"]["scanners"] = 8
    f["concurrent"]["memory"]["peak_above_before"] = 96 * MB
    stream, unary, one, eight = bench_scan.target_rows(f)
    assert (stream.value, stream.target, stream.met) == (pytest.approx(0.76), 0.75, True)
    assert (unary.value, unary.target, unary.met) == (pytest.approx(0.64), 0.65, False)
    # one scanner: the worst kind, against 2 x 4 MB + 32 MB
    assert (one.value, one.anchor, one.target, one.met) == (41.0, 4.0, 40.0, False)
    # eight at once: 2 x 8 x 4 MB + 32 MB, exactly met
    assert (eight.value, eight.anchor, eight.target, eight.met) == (96.0, 32.0, 96.0, True)


def test_bootstrap_judges_spark_reading_kvlease_against_parquet():
    f = figures("bootstrap")
    f["kvlease_rows_per_s"], f["parquet_rows_per_s"] = 400_000.0, 1_000_000.0
    (row,) = bench_bootstrap.target_rows(f)
    assert row.value == pytest.approx(0.4) and row.met


def test_rebuild_judges_each_remote_and_load_against_its_download_at_0_5():
    f = figures("rebuild")
    f.update(rows=1_000_000, tail_rows=100_000, load_rows_per_s=10_000)
    case = f["runs"][0]["cases"][0]
    case.update(download_rows_per_s=2_000_000.0, rebuild_rows_per_s=1_000_000.0)
    rows = bench_rebuild.target_rows(f)
    assert [r.metric for r in rows] == [
        "rebuild / durable download, file://, quiet, 1,000,000 rows + 100,000 tail",
        "rebuild / durable download, file://, a writer at 10,000 rows/s, 1,000,000 rows + 100,000 tail",
        "rebuild / durable download, s3://, quiet, 1,000,000 rows + 100,000 tail",
        "rebuild / durable download, s3://, a writer at 10,000 rows/s, 1,000,000 rows + 100,000 tail"]
    assert (rows[0].measured, rows[0].anchor, rows[0].unit, rows[0].target) == (1_000_000.0, 2_000_000.0, "rows/s", 0.5)
    assert rows[0].value == pytest.approx(0.5) and rows[0].met
    assert all(r.target == 0.5 for r in rows)
    case["rebuild_rows_per_s"] = 990_000.0
    assert not bench_rebuild.target_rows(f)[0].met


def test_rebuild_reports_each_round_and_where_the_best_rebuild_spent_its_time():
    f = figures("rebuild")
    case = f["runs"][0]["cases"][0]
    case["download_s"] = [0.36, 0.38]
    case["rebuild"] = [{"installed_s": 0.32, "applied_s": 0.79, "in_isr_s": 0.80, "total_s": 0.80, "log_end": 24_000},
                       {"installed_s": 0.34, "applied_s": 0.68, "in_isr_s": 0.86, "total_s": 0.86, "log_end": 24_000}]
    text = bench_rebuild.report(f)
    assert "(0.36 s, 0.38 s)" in text and "(0.80 s, 0.86 s)" in text
    assert "snapshot installed 0.32 s, tail applied 0.79 s (to offset 24,000), in the ISR 0.80 s" in text
    assert "file://, quiet" in text and "s3://, a writer at" in text


def test_every_benchmark_of_the_suite_is_checked_against_the_recorded_document():
    assert set(MODULES) == set(bench_suite.MODULES) == set(RECORDED["benchmarks"])


@pytest.mark.parametrize("name", list(MODULES))
def test_every_recorded_benchmark_reports_and_rows_as_recorded(name):
    f = figures(name)
    assert MODULES[name].report(f)
    assert [row.doc() for row in MODULES[name].target_rows(f)] == RECORDED["benchmarks"][name]["rows"]


# -- the table --------------------------------------------------------------------------------------------


def test_the_table_has_a_line_per_row_with_the_verdict():
    doc = doc_of(writes=[Row.ratio("PutKv / WriteBatch", 300_000.0, 1_000_000.0, "rows/s", 0.4)],
                 leases=[Row.limit("failover", 6.5, 6.0, "s", 8.0)])
    header, writes, leases = bench_suite.table_lines(doc)
    assert header.split() == ["benchmark", "metric", "measured", "anchor", "ratio", "target", "met"]
    assert writes.split() == ["writes", "PutKv", "/", "WriteBatch", "300,000", "rows/s", "1,000,000", "rows/s",
                              "0.3", ">=", "0.4", "NO"]
    assert leases.split() == ["leases", "failover", "6.5", "s", "6", "s", "6.5", "s", "<=", "8", "s", "yes"]
    ratio = header.index("ratio")  # aligned columns
    assert writes[ratio:].startswith("0.3 ") and leases[ratio:].startswith("6.5 s ")


def test_a_failed_benchmark_is_a_line_and_its_error_below_the_table():
    doc = doc_of(writes=[Row.ratio("w", 1.0, 2.0, "rows/s", 0.4)])
    doc["benchmarks"]["scan"] = {"options": {"rows": 5}, "error": "ClusterError: ZooKeeper did not start"}
    lines = bench_suite.table_lines(doc)
    assert lines[2].split()[0] == "scan" and lines[2].split()[-1] == "NO"
    assert lines[-1] == "scan: error: ClusterError: ZooKeeper did not start"


# -- options ------------------------------------------------------------------------------------------


def parse(name: str, *argv: str) -> dict:
    return vars(bench_suite.parser(name).parse_args(list(argv)))


def test_options_not_given_keep_the_benchmarks_defaults():
    assert parse("writes") == {}
    assert bench_suite.options_for(bench_writes, {}) == {"rows": 1_000_000, "batch": 10_000, "threads": 4,
                                                         "lookups": 2000, "rounds": 3, "engine": "none",
                                                         "partial": False, "schema": "narrow"}
    assert bench_suite.options_for(bench_leases, parse("leases", "--leases", "100_000")) == {
        "leases": 100_000, "seconds": 8.0, "threads": 64, "raw_writes": 20_000, "secure": False, "idle_seconds": 5.0}


def test_a_switch_option_takes_no_value():
    assert bench_suite.options_for(bench_leases, parse("leases", "--secure"))["secure"] is True
    with pytest.raises(bench_suite.UsageError):
        parse("leases", "--secure", "yes")


def test_an_option_of_all_goes_to_every_benchmark_that_has_it():
    given = parse("all", "--rows", "20000", "--threads", "2", "--leases", "2500", "--json")
    assert given.pop("json") is True
    options = {name: bench_suite.options_for(MODULES[name], given) for name in MODULES}
    assert options["writes"]["rows"] == options["scan"]["rows"] == options["bootstrap"]["rows"] == 20_000
    assert options["writes"]["threads"] == options["leases"]["threads"] == 2
    assert options["leases"]["leases"] == 2500 and "rows" not in options["leases"]
    assert options["scan"] == {"rows": 20_000, "rounds": 3, "secure": False, "schema": "narrow"}


def test_schema_wide_goes_to_writes_and_scan_and_a_bad_one_is_a_usage_error():
    given = parse("all", "--schema", "wide")
    assert bench_suite.options_for(bench_writes, given)["schema"] == "wide"
    assert bench_suite.options_for(MODULES["scan"], given)["schema"] == "wide"
    with pytest.raises(bench_suite.UsageError, match="unknown schema 'huge': one of narrow, wide"):
        parse("writes", "--schema", "huge")


def test_every_option_is_a_keyword_of_its_run():
    import inspect

    for name, module in MODULES.items():
        keywords = inspect.signature(module.run).parameters
        assert {o.dest for o in module.OPTIONS} <= set(keywords), name
        assert "progress" in keywords, name


@pytest.mark.parametrize("name,argv,message", [
    ("nosuch", (), "unknown benchmark 'nosuch' (available: leases, writes, scan, bootstrap, replication, rebuild, partitions, lookups, freshness, all)"),
    ("codec", (), "unknown benchmark 'codec'"),  # the internal micro-benchmark is not in the suite
    ("writes", ("--rows", "ten"), "argument --rows: 'ten' is not a whole number"),
    ("writes", ("--rows", "-5"), "argument --rows: '-5' is not positive"),
    ("writes", ("--rows",), "argument --rows: expected one argument"),
    ("scan", ("--leases", "5"), "unrecognized arguments: --leases 5"),
    ("leases", ("--seconds", "nan"), "argument --seconds: 'nan' is not a positive number"),
    ("all", ("--plot", "out.jpg"), "argument --plot: 'out.jpg' is not a .png file name"),
    ("all", ("--plot", "/nonexistent-dir/out.png"), "argument --plot: directory '/nonexistent-dir' does not exist"),
    ("writes", ("--plot", "/proc/x.png"), "argument --plot: cannot write '/proc/x.png': "),
])
def test_bad_names_and_options_are_one_usage_error(name, argv, message):
    with pytest.raises(bench_suite.UsageError) as caught:
        bench_suite.parser(name).parse_args(list(argv))
    assert message in caught.value.message and "\n" not in caught.value.message


def test_plot_path_must_not_be_a_directory(tmp_path):
    (tmp_path / "d.png").mkdir()
    with pytest.raises(bench_suite.UsageError, match="is a directory"):
        bench_suite.parser("writes").parse_args(["--plot", str(tmp_path / "d.png")])
    assert parse("writes", "--plot", str(tmp_path / "x.PNG")) == {"plot": str(tmp_path / "x.PNG")}


# -- the machine --------------------------------------------------------------------------------------


def test_cpu_model_comes_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\n")
    assert bench_machine.cpu_model(str(cpuinfo)) == "AMD EPYC 7B13"
    assert bench_machine.cpu_model(str(tmp_path / "missing"))  # a fallback, never empty


def test_machine_names_cpus_load_and_date():
    m = bench_machine.machine()
    assert m["cpus"] >= 1 and m["cpu_model"] and len(m["load_average"]) == 3
    assert m["date"][:4].isdigit() and "T" in m["date"]


# -- the plot -------------------------------------------------------------------------------------------


def test_bars_are_coloured_by_the_verdict_with_a_target_line_each():
    doc = doc_of(writes=[Row.ratio("upsert", 30.0, 100.0, "rows/s", 0.4)],
                 scan=[Row.ratio("stream", 80.0, 100.0, "rows/s", 0.75), Row.limit("peak", 50.0, 4.0, "MB", 40.0)],
                 leases=[Row.limit("failover", 6.5, 6.0, "s", 8.0)])
    fig = bench_plot.draw(doc)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert set(panels) == {"ratio to the anchor", "seconds", "MB"}

    def bars(ax):
        from matplotlib.colors import to_hex

        return [(round(p.get_height(), 6), to_hex(p.get_facecolor())) for p in ax.patches]

    assert bars(panels["ratio to the anchor"]) == [(0.3, bench_plot.NOT_MET), (0.8, bench_plot.MET)]
    assert bars(panels["MB"]) == [(50.0, bench_plot.NOT_MET)]
    assert bars(panels["seconds"]) == [(6.5, bench_plot.MET)]
    (targets,) = panels["ratio to the anchor"].collections
    assert [segment[0][1] for segment in targets.get_segments()] == [0.4, 0.75]
    labels = [t.get_text() for t in panels["ratio to the anchor"].get_xticklabels()]
    assert labels == ["writes: upsert\ntarget >= 0.4", "scan: stream\ntarget >= 0.75"]
    assert [t.get_text() for t in panels["seconds"].get_xticklabels()] == ["leases: failover\ntarget <= 8 s"]
    title = fig.get_suptitle()
    assert "2 CPUs, Test CPU 9000" in title and "1.50 1.00 0.50" in title and "2026-11-23" in title


def test_a_panel_of_zeros_gets_a_readable_scale():
    fig = bench_plot.draw(doc_of(leases=[Row.limit("lost", 0.0, 30_000.0, "leases", 0.0)]))
    (ax,) = fig.axes
    assert ax.get_ylim() == (0.0, 1.2)  # not 0..1.2e-9, which matplotlib labels "1e-9"


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "bench.png"
    bench_plot.plot(RECORDED, str(path))
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def test_plot_of_a_failed_benchmark_says_so(tmp_path):
    doc = doc_of()
    doc["benchmarks"]["bootstrap"] = {"options": {}, "error": "RuntimeError: no Java"}
    assert "(failed: bootstrap)" in bench_plot.title(doc)
    bench_plot.plot(doc, str(tmp_path / "failed.png"))
    assert (tmp_path / "failed.png").read_bytes().startswith(PNG_SIGNATURE)


def test_the_plot_path_is_checked_by_writing_it_and_leaves_nothing_behind(tmp_path):
    new, old = tmp_path / "new.png", tmp_path / "old.png"
    old.write_bytes(b"an earlier plot")
    assert bench_suite.plot_path(str(new)) == str(new) and not new.exists()
    assert bench_suite.plot_path(str(old)) == str(old) and old.read_bytes() == b"an earlier plot"
