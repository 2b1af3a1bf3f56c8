"""A local S3 endpoint for a benchmark: moto's server mode in a process of its own, over HTTP on loopback.

``with local_s3(log_dir) as overrides:`` starts ``python -m moto.server`` on a
free 127.0.0.1 port, creates one bucket and yields the config overrides that
point ``remote.data.dir`` at it (endpoint, region, the test credentials moto
takes); the server is stopped at the end whatever happens. moto keeps the
objects in its own memory: the process is the "remote" (a copy travels through
HTTP and boto3 as it would from S3, not a page-cache copy).

moto is a development dependency (``pip install -e '.[dev]'``, what ``make``
installs); without it :class:`~kvlease.ops.bench.suite.UsageError` says so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from kvlease.common import config as cfg
from kvlease.ops.bench.suite import UsageError
from kvlease.ops.local_cluster import free_ports, holds_port
from kvlease.ops.wait import poll

BUCKET = "kvlease-bench"
ACCESS_KEY = SECRET_KEY = "testing"  # moto takes any
REGION = "us-east-1"
START_TIMEOUT_S = 30.0


def _free_port() -> int:
    return free_ports(1)[0]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def local_s3(log_dir: str | Path) -> Iterator[dict[str, str]]:
    """Yield the config overrides of a fresh bucket on a moto server started here (see the module docstring)."""
    if importlib.util.find_spec("moto") is None:
        raise UsageError("--remote s3 needs moto's S3 server (a development dependency): "
                         "pip install 'moto[server]', or use --remote file")
    port = _free_port()
    log_path = Path(log_dir) / "moto.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def serves() -> bool:  # it, not a server that took the port first (ours then exits)
            return _listening(port) and holds_port(proc.pid, port)

        poll(lambda: proc.poll() is not None or serves(), START_TIMEOUT_S)  # exited, or it serves
        if proc.poll() is not None or not serves():
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"moto's S3 server did not start on 127.0.0.1:{port}: {tail}")
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                                       aws_secret_access_key=SECRET_KEY).create_bucket(Bucket=BUCKET)
        yield {cfg.REMOTE_DATA_DIR.name: f"s3://{BUCKET}/bench", cfg.S3_ENDPOINT.name: endpoint,
               cfg.S3_REGION.name: REGION, cfg.S3_ACCESS_KEY.name: ACCESS_KEY,
               cfg.S3_SECRET_KEY.name: SECRET_KEY}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
