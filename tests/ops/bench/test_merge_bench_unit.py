"""``kvlease bench writes --engine aggregation --partial``'s figures, report and verdicts (ops/bench/merge_writes.py),
from the figures of a recorded run; the option's bad values."""

from __future__ import annotations

import argparse

import pytest

from kvlease.ops.bench import merge_writes, writes

pytestmark = pytest.mark.unit

ROUND = {"lww_insert": 250_000.0, "lww_update": 80_000.0, "engine_insert": 250_000.0, "engine_update": 52_000.0,
         "partial_insert": 200_000.0, "partial_update": 30_000.0}


def test_figures_take_the_best_round_and_judge_each_update_pass_against_last_write_wins():
    slower = {k: v / 2 for k, v in ROUND.items()}
    m = merge_writes.figures([slower, ROUND], 400_000.0, "aggregation", True)
    assert m["kinds"] == ["lww", "engine", "partial"]
    assert m["engine_update_vs_lww"] == pytest.approx(0.65) and m["partial_update_vs_lww"] == pytest.approx(0.375)
    assert m["lww_update_vs_rocksdb"] == pytest.approx(0.2)
    rows = merge_writes.target_rows(m)
    assert [(r.metric, r.met) for r in rows] == [("engine update / last-write-wins update", True),
                                               ("partial update / last-write-wins update", False)]
    text = "\n".join(merge_writes.report(m))
    assert "update / last write wins 0.65 (target >= 0.5: ok)" in text
    assert "update / last write wins 0.38 (target >= 0.5: BELOW TARGET)" in text


def test_only_the_kinds_asked_for_are_reported():
    m = merge_writes.figures([{k: v for k, v in ROUND.items() if not k.startswith("partial")}], 4e5, "aggregation",
                             False)
    assert m["kinds"] == ["lww", "engine"] and len(merge_writes.target_rows(m)) == 1


def test_the_engine_option_takes_none_or_aggregation():
    assert merge_writes.engine_name("aggregation") == "aggregation"
    with pytest.raises(argparse.ArgumentTypeError, match="'first_row' is not one of none, aggregation"):
        merge_writes.engine_name("first_row")
    assert {o.flag for o in writes.OPTIONS} >= {"--engine", "--partial"}
