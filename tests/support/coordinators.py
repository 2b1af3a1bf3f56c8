"""Coordinators in this process for tests: one serving, or two (one active, one standby); stopped after."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from kvlease.common.config import Config
from kvlease.ops.wait import wait_until


@contextlib.contextmanager
def serving(config: Config) -> Iterator[Any]:
    """One coordinator on ``config``, once active."""
    from kvlease.coordinator.server import CoordinatorServer

    server = CoordinatorServer(config).start()
    try:
        assert server.wait_active(15)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def pair(config: Config, **options: Any) -> Iterator[list[Any]]:
    """Two coordinators on ``config`` (``options``: CoordinatorServer's, e.g. ``clock_ms``), once one is active."""
    from kvlease.coordinator.server import CoordinatorServer

    servers = [CoordinatorServer(config, **options).start(), CoordinatorServer(config, **options).start()]
    try:
        wait_until(lambda: any(s.is_active for s in servers), 15, "an active coordinator", interval_s=0.02)
        yield servers
    finally:
        for server in servers:
            server.stop()
