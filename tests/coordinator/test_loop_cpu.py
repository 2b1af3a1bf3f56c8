"""Tier 1: the event loop accounts its own thread's CPU into kvlease_coordinator_loop_cpu_seconds_total."""

from __future__ import annotations

import threading

import pytest

from kvlease.coordinator.loop import EventLoop
from kvlease.coordinator.metrics import CoordinatorMetrics
from kvlease.leases import state as ls
from kvlease.ops.wait import wait_until

pytestmark = pytest.mark.unit


class Burner:
    """A controller whose every batch costs 5 ms of (fake) thread CPU; ticks cost nothing."""

    def __init__(self, cpu: list[float]) -> None:
        self.cpu = cpu
        self.batches = 0
        self.lock = threading.Lock()

    def process(self, items):
        with self.lock:
            if any(not isinstance(request, ls.Expire) for request, _future in items):
                self.cpu[0] += 0.005
                self.batches += 1
        for _request, future in items:
            if future is not None:
                future.set_result(None)
        return []

    def fail_all(self, error):
        pass


def test_the_loop_counts_the_cpu_of_its_batches():
    cpu = [1.0]
    metrics = CoordinatorMetrics()
    controller = Burner(cpu)
    loop = EventLoop(controller, max_batch=1, tick_interval_ms=20, on_fatal=lambda exc: None, metrics=metrics,
                     thread_time=lambda: cpu[0])
    loop.start()
    try:
        for i in range(4):
            loop.submit(f"request {i}").result(timeout=10)
        counted = lambda: metrics.registry.get_sample_value("kvlease_coordinator_loop_cpu_seconds_total")  # noqa: E731
        wait_until(lambda: counted() == pytest.approx(0.005 * controller.batches), 5, "the batches' CPU counted")
        assert controller.batches == 4
        ticks_only = counted()
        threading.Event().wait(0.2)  # ~10 ticks: they cost no (fake) CPU, so nothing is added
        assert counted() == pytest.approx(ticks_only)
    finally:
        loop.stop()
