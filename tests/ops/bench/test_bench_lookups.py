"""``kvlease bench lookups``: the rows it judges and its report, from figures (the run itself is the benchmark's),
and a tiny run of its point-lookup measurements against a raw rocksdict (no cluster: a stand-in client)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from kvlease.ops.bench import lookups as bench_lookups
from kvlease.ops.bench import point_lookups
from kvlease.ops.bench import suite as bench_suite

pytestmark = pytest.mark.unit

POINT = {"batch_rows_per_s": 100_000.0, "raw_multi_get_rows_per_s": 150_000.0, "batch_vs_raw": 2 / 3,
         "round_rows_per_s": [{"lookup": 100_000.0, "raw": 150_000.0}], "single_p50_ms": 0.4, "single_p99_ms": 2.5,
         "raw_get_p50_ms": 0.002, "raw_get_p99_ms": 0.01, "one_thread_per_s": 2000.0, "threads_per_s": 5000.0}
FIGURES = {"rows": 50_000, "batch_keys": 10_000, "batches": 20, "singles": 2000, "threads": 16, "buckets": 4,
           "rounds": 3, "rf1": POINT}


def test_point_lookups_are_judged_against_raw_rocksdict_and_their_limits():
    batch, p50, p99, threads = bench_lookups.target_rows(FIGURES)
    assert (batch.measured, batch.anchor, batch.target, batch.met) == (100_000.0, 150_000.0, 0.5, True)
    assert (p50.measured, p50.target, p50.at_most, p50.met) == (0.4, 0.5, True, True)
    assert (p99.measured, p99.target, p99.met) == (2.5, 2.0, False)
    assert (threads.value, threads.target, threads.met) == (2.5, 1.0, True)
    slow = {**FIGURES, "rf1": {**POINT, "batch_rows_per_s": 70_000.0}, "rf3": POINT}
    rows = bench_lookups.target_rows(slow)
    assert len(rows) == 8 and not rows[0].met and rows[4].met
    assert [r.metric.split()[:2] for r in rows[::4]] == [["RF", "1"], ["RF", "3"]]
    text = bench_lookups.report(slow)
    assert "RF 3: batch lookups" in text and "(0.47 of raw, target >= 0.5)" in text


def test_prefix_lookups_are_judged_against_point_lookups_of_the_same_rows():
    assert "prefix" not in bench_lookups.report(FIGURES)
    prefix = {"rows": 50_000, "per_prefix": 100, "users_per_call": 20, "calls": 50, "point_rows_per_s": 100_000.0,
              "round_point_rows_per_s": [100_000.0], "prefix_rows_per_s": 150_000.0,
              "round_prefix_rows_per_s": [150_000.0], "prefix_vs_point": 1.5, "target_ratio": 1.0}
    row = bench_lookups.target_rows({**FIGURES, "prefix": prefix})[-1]
    assert (row.measured, row.anchor, row.target, row.met) == (150_000.0, 100_000.0, 1.0, True)
    assert not bench_lookups.target_rows({**FIGURES, "prefix": {**prefix, "prefix_rows_per_s": 99_000.0}})[-1].met
    assert "1.50   (target >= 1.0: ok)" in bench_lookups.report({**FIGURES, "prefix": prefix})


def test_lookups_is_in_the_suite_with_its_switches():
    assert bench_suite.MODULES["lookups"] == "kvlease.ops.bench.lookups"
    flags = {o.flag: o.type for o in bench_lookups.OPTIONS}
    assert flags["--prefix"] is bool and flags["--skip-rf3"] is bool and "--batch-keys" in flags


class RawClient:
    """A stand-in table client answering lookups from the raw anchor's own rocksdict (what a tiny run needs)."""

    def __init__(self, raw: point_lookups.RawAnchor) -> None:
        self.raw = raw

    def lookup_batch(self, keys: pa.RecordBatch) -> pa.RecordBatch:
        values = self.raw.db.get(self.raw.codec.encode_keys(keys))
        return self.raw.codec.decode_values(pa.array(values, pa.binary()))

    def lookup(self, keys: list) -> list:
        return self.lookup_batch(pa.record_batch({"id": pa.array(keys, pa.int64())})).to_pylist()


def test_a_tiny_run_measures_every_figure(tmp_path):
    raw = point_lookups.RawAnchor(str(tmp_path / "raw"), 300)
    try:
        client = RawClient(raw)
        figures = point_lookups.measure(client, client, client, raw, rows=300, batches=2, batch_keys=50, singles=40,
                                        threads=4, rounds=2, rng=np.random.default_rng(1), progress=lambda t: None,
                                        label="RF 1", idle_wait_s=0.2)
    finally:
        raw.close()
    assert not (tmp_path / "raw").exists()
    assert len(figures["round_rows_per_s"]) == 2 and figures["batch_vs_raw"] > 0
    assert 0 < figures["single_p50_ms"] <= figures["single_p99_ms"]
    assert 0 < figures["grpc_single_p50_ms"] <= figures["grpc_single_p99_ms"]  # shown beside the judged ones
    assert 0 < figures["echo_p50_ms"] <= figures["echo_p99_ms"]  # the floor, measured in the same run
    assert 0 <= figures["machine_busy_before_singles"] <= 1
    text = bench_lookups.report({**FIGURES, "rf1": figures})
    assert "bare gRPC echo round trip" in text and "machine busy before them" in text
    assert "the same over gRPC only" in text
    assert figures["threads_per_s"] > 0 and figures["one_thread_per_s"] > 0
    rows = bench_lookups.target_rows({**FIGURES, "rf1": figures})
    assert [r.unit for r in rows] == ["rows/s", "ms", "ms", "lookups/s"]
    json.dumps({"figures": figures, "rows": [r.doc() for r in rows]})  # what --json prints


def test_a_wrong_answer_fails_the_run(tmp_path):
    raw = point_lookups.RawAnchor(str(tmp_path / "raw"), 100)
    try:
        wrong = RawClient(raw)
        wrong.lookup = lambda keys: [{"id": -1}]
        with pytest.raises(RuntimeError, match="answered"):
            point_lookups.single_ms(wrong, [3])
        keys = pa.record_batch({"id": pa.array([1, 2], pa.int64())})
        shifted = RawClient(raw)
        shifted.lookup_batch = lambda k: RawClient(raw).lookup_batch(pa.record_batch({"id": pa.array([2, 1])}))
        with pytest.raises(RuntimeError, match="other rows"):
            point_lookups.batch_rows_per_s(shifted, [keys])
    finally:
        raw.close()


def test_figures_of_a_run_before_point_lookups_give_their_prefix_row():
    old = {"rows": 20000, "per_prefix": 100, "users_per_call": 20, "calls": 50, "buckets": 4, "rounds": 3,
           "point_rows_per_s": 100_000.0, "round_point_rows_per_s": [100_000.0], "prefix_rows_per_s": 120_000.0,
           "round_prefix_rows_per_s": [120_000.0], "prefix_vs_point": 1.2, "target_ratio": 1.0}
    (row,) = bench_lookups.target_rows(old)
    assert (row.measured, row.anchor, row.met) == (120_000.0, 100_000.0, True)
    assert "1.20   (target >= 1.0: ok)" in bench_lookups.report(old)
