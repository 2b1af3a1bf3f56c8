"""``kvlease bench lookups``: the row it judges and its report, from figures (the run itself is the benchmark's)."""

from __future__ import annotations

import pytest

from kvlease.ops.bench import lookups as bench_lookups
from kvlease.ops.bench import suite as bench_suite

pytestmark = pytest.mark.unit

FIGURES = {"rows": 50_000, "per_prefix": 100, "users_per_call": 20, "calls": 50, "buckets": 4, "rounds": 3,
           "point_rows_per_s": 100_000.0, "round_point_rows_per_s": [90_000.0, 100_000.0, 95_000.0]}


def test_prefix_lookups_are_judged_against_point_lookups_of_the_same_rows():
    assert bench_lookups.target_rows(FIGURES) == []  # without --prefix: nothing judged
    assert "prefix" not in bench_lookups.report(FIGURES)
    with_prefix = {**FIGURES, "prefix_rows_per_s": 150_000.0, "round_prefix_rows_per_s": [150_000.0],
                   "prefix_vs_point": 1.5, "target_ratio": 1.0}
    (row,) = bench_lookups.target_rows(with_prefix)
    assert (row.measured, row.anchor, row.target, row.met) == (150_000.0, 100_000.0, 1.0, True)
    assert not bench_lookups.target_rows({**with_prefix, "prefix_rows_per_s": 99_000.0})[0].met
    assert "1.50   (target >= 1.0: ok)" in bench_lookups.report(with_prefix)


def test_lookups_is_in_the_suite_with_its_prefix_switch():
    assert bench_suite.MODULES["lookups"] == "kvlease.ops.bench.lookups"
    assert {o.flag: o.type for o in bench_lookups.OPTIONS}["--prefix"] is bool
