"""The ports a local cluster picks for servers it starts later: free, distinct, and below the kernel's
ephemeral range, so no client socket of any process is handed one before its server binds it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from kvlease.ops.local_cluster import free_ports, holds_port, kept_ports, processes

pytestmark = pytest.mark.unit


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_free_ports_are_distinct_free_and_below_the_ephemeral_range():
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(processes.FIXED_PORTS_LOW <= port < processes._ephemeral_low() for port in ports), ports
    assert all(_bindable(port) for port in ports)


def test_without_room_below_the_ephemeral_range_a_port_from_it_is_taken(monkeypatch):
    monkeypatch.setattr(processes, "_ephemeral_low", lambda: processes.FIXED_PORTS_LOW + 10)
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert all(_bindable(port) for port in ports)


def test_a_recorded_port_is_kept_and_a_taken_one_replaced_below_the_ephemeral_range():
    kept, taken_port = free_ports(2)
    warnings = []
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken_port))
        squatter.listen()
        previous = [{"id": 1, "address": f"127.0.0.1:{kept}"}, {"id": 2, "address": f"127.0.0.1:{taken_port}"}]
        picked = kept_ports(previous, 2, "tablet server", warnings.append)
    assert picked[0][0] == kept
    assert picked[1][0] not in (kept, taken_port)
    assert processes.FIXED_PORTS_LOW <= picked[1][0] < processes._ephemeral_low()
    assert len(warnings) == 1 and f"its port {taken_port} is taken now" in warnings[0], warnings


def test_holds_port_tells_the_process_that_listens_from_any_other():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert holds_port(os.getpid(), port)
            assert not holds_port(child.pid, port)  # alive, but the listener is another process's
        finally:
            child.kill()
            child.wait()
    assert not holds_port(os.getpid(), port)  # closed
