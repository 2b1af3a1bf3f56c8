"""A server that cannot start says why in one line and exits 1, never with a traceback:
ZooKeeper unreachable, its port taken, or anything else its start raises."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.process import run_server
from kvlease.common.zk import make_client
from kvlease.ops.local_cluster import dying_with_parent
from tests.support.paths import REPO

PROJECT_ROOT = REPO


class _Server:
    """What ``run_server`` builds: ``start`` raises ``exc``; ``stop`` is counted (and may raise too)."""

    def __init__(self, exc: BaseException, stop_raises: bool = False) -> None:
        self.exc, self.stop_raises, self.stops = exc, stop_raises, 0

    def start(self) -> None:
        raise self.exc

    def stop(self) -> None:
        self.stops += 1
        if self.stop_raises:
            raise RuntimeError("half started")


@pytest.mark.unit
@pytest.mark.parametrize("exc, stop_raises, line", [
    (errors.KvLeaseError("cannot listen on h:1"), False, "error: cannot listen on h:1"),
    (PermissionError(13, "Permission denied", "/data"), False,
     "error: cannot start: PermissionError: [Errno 13] Permission denied: '/data' (--log-level DEBUG for a traceback)"),
    (RuntimeError("boom"), True, "error: cannot start: RuntimeError: boom (--log-level DEBUG for a traceback)"),
])
def test_a_failed_start_is_one_line_and_exit_1(monkeypatch, capsys, exc, stop_raises, line):
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # keep pytest's own handlers
    server = _Server(exc, stop_raises)
    code = run_server("python -m test", "a test server", lambda config: server, lambda s: "serving", [])
    err = capsys.readouterr().err
    assert code == 1 and server.stops == 1
    assert err.strip().splitlines()[-1] == line and "Traceback" not in err


@pytest.mark.zk
def test_an_unreachable_zookeeper_is_a_network_error_naming_the_address():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = cfg.Config({cfg.ZK_ADDRESS.name: f"127.0.0.1:{port}"}, env={})
    started = time.monotonic()
    with pytest.raises(errors.NetworkError, match=rf"cannot reach ZooKeeper at 127\.0\.0\.1:{port} "
                                                  r"\(config key 'zookeeper.address'\) within 0.5 s"):
        make_client(config, timeout_s=0.5)
    assert time.monotonic() - started < 5


@pytest.mark.zk
def test_a_coordinator_whose_port_is_taken_says_so_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "config.toml").write_text(
            f'"zookeeper.address" = "127.0.0.1:1"\n"coordinator.host" = "127.0.0.1"\n"coordinator.port" = {port}\n'
            f'"metrics.port" = -1\n"remote.data.dir" = "{(tmp_path / "remote").as_uri()}"\n')
        cmd = [sys.executable, "-m", "kvlease.coordinator", "--config", str(tmp_path / "config.toml")]
        proc = subprocess.Popen(dying_with_parent(cmd), cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"error: cannot listen on 127.0.0.1:{port} (config keys 'coordinator.host', 'coordinator.port'): "
        "the port is in use or the host is not this machine's")
