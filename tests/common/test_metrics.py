"""The metrics endpoint (common/metrics.py): serves the registry over HTTP and stops at once."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client import Counter

from kvlease.common.metrics import STOP_POLL_S, MetricsRegistry

pytestmark = pytest.mark.unit


def test_the_endpoint_serves_the_registry_and_closes_without_waiting_out_a_poll():
    """Right after a scrape the server's loop has just started a new wait for requests: closing then
    waited out that whole wait (0.5 s with prometheus_client's start_http_server, once per server stop)."""
    metrics = MetricsRegistry()
    Counter("kvlease_test_events", "events", registry=metrics.registry).inc(3)
    port = metrics.serve("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert "kvlease_test_events_total 3.0" in response.read().decode()
    started = time.monotonic()
    metrics.close()
    assert time.monotonic() - started < STOP_POLL_S + 0.25
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)
    metrics.close()  # idempotent
