"""Children forked while gRPC is busy reach their ``exec`` (grpc/grpc#43055, ``common/__init__.py``).

PySpark starts its Java gateway, and our tools their JVMs, with ``subprocess`` and a ``preexec_fn``:
a real ``fork()`` that runs gRPC's fork handlers. With gRPC's default fork support a few of such
children die before ``exec`` (about 1 in 100 on this machine: Spark then fails with
JAVA_GATEWAY_EXITED). A fresh interpreter imports ``client`` (as a user's process does), keeps a
real gRPC server and channel busy on loopback, and forks 500 children that way: every one must run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fixtures.leaks import kill_group
from tests.support.paths import REPO

pytestmark = pytest.mark.unit

ROOT = REPO

CHILD = r"""
import os, subprocess, sys, threading
import kvlease.client  # noqa: F401  (what a user's process imports first)
from concurrent import futures
import grpc

server = grpc.server(futures.ThreadPoolExecutor(4))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")
call = channel.unary_unary("/kvlease.Nothing/Here")
stop = threading.Event()

def busy():
    while not stop.is_set():
        try:
            call(b"x", timeout=1)
        except grpc.RpcError:
            pass

threads = [threading.Thread(target=busy) for _ in range(2)]
for t in threads:
    t.start()
died = 0
try:
    for _ in range(int(sys.argv[1])):
        died += subprocess.run(["/bin/true"], preexec_fn=lambda: None).returncode != 0
finally:
    stop.set()
    for t in threads:
        t.join()
    channel.close()
    server.stop(None)
print(os.environ.get("GRPC_ENABLE_FORK_SUPPORT"), died)
"""


def test_children_forked_with_handlers_while_grpc_is_busy_all_reach_exec():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(ROOT)
    # its own process group: a child stuck before exec (what the bug can also do) is killed with it
    proc = subprocess.Popen([sys.executable, "-c", CHILD, "500"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(ROOT), env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None or proc.returncode != 0:
            kill_group(proc)
    assert proc.returncode == 0, err
    setting, died = out.split()
    assert setting == "false"
    assert int(died) == 0
    assert "fork" not in err  # nor gRPC's "skipping fork() handlers" lines, one per child


def test_a_setting_given_in_the_environment_is_kept():
    env = dict(os.environ, GRPC_ENABLE_FORK_SUPPORT="true", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", "import kvlease.client, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT), env=env)
    assert proc.stdout.strip() == "true", proc.stderr
