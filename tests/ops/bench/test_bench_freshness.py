"""``kvlease bench freshness``: its rows and report from figures, the measuring pieces on their own, and a tiny
run for real (its own ZooKeeper, coordinator and three tablet server processes; no Spark; about 20 s)."""

from __future__ import annotations


import numpy as np
import pytest

from kvlease.ops.bench import freshness as bench_freshness
from kvlease.ops.bench import suite as bench_suite
from kvlease.ops.bench.freshness_probe import Seen, StampedWriter, freshness

LINE = {"keys": 900, "missing": 0, "seen_before_ack": 90, "p50_ms": 2.0, "p99_ms": 30.0, "max_ms": 40.0,
        "mean_ms": 3.0, "rate": 1000, "achieved_rate": 998.0, "writes": 1000, "fetches_per_s": 90.0}
FIGURES = {"seconds": 1.0, "wait_ms": 500, "low_rate": 1000, "high_rate": 10000,
           "feed": {"rf1_1000": LINE, "rf1_10000": {**LINE, "rate": 10000, "p99_ms": 120.0},
                    "rf3_1000": {**LINE, "p99_ms": 60.0}, "rf3_10000": {**LINE, "rate": 10000}},
           "targets_ms": {"low_rate_p99": 50.0, "high_rate_p99": 100.0, "spark_p99": 1000.0}}


@pytest.mark.unit
def test_every_line_is_a_p50_and_a_p99_row_judged_against_its_target():
    rows = bench_freshness.target_rows(FIGURES)
    assert [(r.metric, r.measured, r.target, r.met) for r in rows] == [
        ("feed p50, RF 1, 1,000 writes/s", 2.0, 50.0, True), ("feed p99, RF 1, 1,000 writes/s", 30.0, 50.0, True),
        ("feed p50, RF 1, 10,000 writes/s", 2.0, 100.0, True),
        ("feed p99, RF 1, 10,000 writes/s", 120.0, 100.0, False),
        ("feed p50, RF 3, 1,000 writes/s", 2.0, 50.0, True), ("feed p99, RF 3, 1,000 writes/s", 60.0, 50.0, False),
        ("feed p50, RF 3, 10,000 writes/s", 2.0, 100.0, True),
        ("feed p99, RF 3, 10,000 writes/s", 30.0, 100.0, True)]
    assert all(r.at_most and r.unit == "ms" for r in rows)
    assert "not measured (--no-spark)" in bench_freshness.report(FIGURES)
    spark = {**LINE, "rate": 100, "p50_ms": 300.0, "p99_ms": 700.0, "batches": 20, "rows_per_batch": 50.0,
             "batch_steps_ms": {"addBatch": 200.0, "triggerExecution": 300.0}}
    with_spark = {**FIGURES, "spark": spark}
    assert [(r.metric, r.measured, r.met) for r in bench_freshness.target_rows(with_spark)[-2:]] == [
        ("Spark micro-batch p50, 100 writes/s", 300.0, True), ("Spark micro-batch p99, 100 writes/s", 700.0, True)]
    text = bench_freshness.report(with_spark)
    assert "Spark micro-batch, 100 writes/s" in text and "addBatch 200" in text and "MISSED" in text
    spark_only = {**with_spark, "feed": {}}  # --no-feed
    assert [r.metric for r in bench_freshness.target_rows(spark_only)] == [
        "Spark micro-batch p50, 100 writes/s", "Spark micro-batch p99, 100 writes/s"]
    assert "feed, RF" not in bench_freshness.report(spark_only)


@pytest.mark.unit
def test_freshness_is_from_the_acknowledgement_and_a_key_seen_before_it_counts_zero():
    acked = np.array([1.0, 1.0, 2.0, 3.0, 4.0])
    seen = np.array([1.0, 1.010, 1.999, 3.050, np.nan])  # key 2 seen before its ack; key 4 never
    f = freshness(acked, seen, warmup=1)
    assert (f["keys"], f["missing"], f["seen_before_ack"]) == (3, 1, 1)
    assert f["max_ms"] == pytest.approx(50.0) and f["p50_ms"] == pytest.approx(10.0)
    s = Seen(3)
    s.mark([0, 2, 7, 2], 5.0)
    assert not s.wait_all(0) and s.other == 1 and s.times[2] == 5.0
    s.mark([1], 6.0)
    assert s.wait_all(0) and s.times.tolist() == [5.0, 6.0, 5.0]


@pytest.mark.unit
def test_the_writer_keeps_its_rate_and_stamps_every_key():
    class Client:
        def __init__(self):
            self.keys = []

        def upsert(self, batch):
            self.keys += batch.column("k").to_pylist()

    client = Client()
    writer = StampedWriter(client, rate=2_000, seconds=0.25)
    writer.run()
    assert sorted(client.keys) == list(range(500)) and writer.per_batch == 20
    assert not np.isnan(writer.acked).any()
    assert 1_000 < writer.achieved_rate < 2_500


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tiny_run_measures_every_line_and_leaves_nothing(scratch):
    seen: list[str] = []
    f = bench_freshness.run(seconds=1.0, low_rate=200, high_rate=1_000, wait_ms=500, spark_rate=100,
                            spark_seconds=1.0, no_spark=True, progress=seen.append)
    assert set(f["feed"]) == {"rf1_200", "rf1_1000", "rf3_200", "rf3_1000"} and "spark" not in f
    for line in f["feed"].values():
        assert line["missing"] == 0 and line["keys"] >= line["writes"] // 2
        assert 0 <= line["p50_ms"] <= line["p99_ms"] <= line["max_ms"] < 5_000
        assert line["fetches_per_s"] < 2_000  # long polls, not a spin
    assert len(bench_freshness.target_rows(f)) == 8
    assert "feed, RF 3, 1,000 writes/s" in bench_freshness.report(f)
    assert any("at RF 3" in line for line in seen)
    assert list(scratch.iterdir()) == []  # its cluster is gone


@pytest.mark.unit
def test_rates_out_of_order_are_refused_before_anything_starts():
    with pytest.raises(bench_suite.UsageError, match="--low-rate 1,000 must be below --high-rate 1,000"):
        bench_freshness.run(seconds=1.0, low_rate=1_000, high_rate=1_000, wait_ms=500, spark_rate=100,
                            spark_seconds=1.0, no_spark=True)


@pytest.mark.unit
def test_freshness_is_in_the_suite_after_lookups_with_its_spark_and_feed_switches():
    assert bench_suite.MODULES["freshness"] == "kvlease.ops.bench.freshness"
    assert list(bench_suite.SUITE).index("freshness") == list(bench_suite.SUITE).index("lookups") + 1
    assert {o.flag: o.type for o in bench_freshness.OPTIONS}["--no-spark"] is bool
    assert {o.flag: o.type for o in bench_freshness.OPTIONS}["--no-feed"] is bool


@pytest.mark.unit
def test_the_low_latency_settings_name_classes_and_a_setting_that_pyspark_ships():
    """A misspelt class would fail the session's first checkpoint write, a misspelt setting change nothing."""
    import zipfile
    from pathlib import Path

    import pyspark

    from kvlease.ops.bench.freshness_spark import LOW_LATENCY_CONF

    jars = Path(pyspark.__file__).parent / "jars"
    names, python_settings = set(), b""
    for jar in [*jars.glob("spark-sql_*.jar"), *jars.glob("hadoop-client-api-*.jar"), *jars.glob("spark-core_*.jar")]:
        with zipfile.ZipFile(jar) as z:
            names |= set(z.namelist())
            python_settings += b"".join(z.read(n) for n in z.namelist()
                                        if n.startswith("org/apache/spark/internal/config/Python"))
    conf = dict(LOW_LATENCY_CONF)
    assert conf.pop("spark.python.unix.domain.socket.enabled") == "true"
    assert b"spark.python.unix.domain.socket.enabled" in python_settings
    assert {name.replace(".", "/") + ".class" for name in conf.values()} <= names
