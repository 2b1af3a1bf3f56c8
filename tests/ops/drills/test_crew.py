"""A drill workload's threads (ops/drills/crew.py): started together, stopped through one event, and the ones
that would not stop named."""

from __future__ import annotations

import threading

import pytest

from kvlease.ops.drills.crew import Crew

pytestmark = pytest.mark.unit


def test_a_crew_runs_each_target_until_its_stop_event_and_stops_together():
    rounds: dict[int, int] = {0: 0, 1: 0}
    both_ran = threading.Barrier(3)

    def run(i: int) -> None:
        both_ran.wait(5)
        while not crew.stop_event.wait(0.01):
            rounds[i] += 1

    crew = Crew("test-worker", run, [(0,), (1,)])
    crew.start()
    both_ran.wait(5)
    assert crew.stop(5) == []
    assert crew.stop_event.is_set()


def test_stop_names_the_threads_still_running_and_skips_ones_never_started():
    release = threading.Event()
    stuck = Crew("test-stuck", lambda: release.wait(10), [()])
    stuck.start()
    assert stuck.stop(0.05) == ["test-stuck-0"]
    release.set()
    assert stuck.stop(5) == []
    assert Crew("test-idle", lambda: None, [(), ()]).stop(0.01) == []  # never started: nothing to wait for
