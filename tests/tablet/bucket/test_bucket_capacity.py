"""Many buckets on one tablet server with a low open-file limit (a small copy of 10,000 buckets at
20,000 fds): its open fds stay bounded as buckets grow, every bucket serves writes and reads, a
restart serves them all again, and a table beyond the server's capacity is refused at create.

A real tablet server process (``prlimit --nofile``), an in-process coordinator on the test's
ZooKeeper, the client over gRPC on loopback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.config import to_toml
from kvlease.common.tables import Column
from kvlease.coordinator.server import CoordinatorServer
from kvlease.ops.local_cluster import free_ports, log_tail
from kvlease.ops.local_cluster import read_health
from kvlease.ops.local_cluster import dying_with_parent
from kvlease.tablet.store.kvstore import FDS_PER_OPEN_BUCKET
from kvlease.ops.wait import wait_until
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")]

ROOT = REPO
SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]
NOFILE = 512  # the tablet's hard limit: 120 buckets at ~10 fds each (16 open held 160) would not fit in it
MAX_OPEN = 16  # tablet.buckets.max-open
TABLES, BUCKETS = 6, 20  # 120 buckets (240 in 1024 fds took twice as long)
CAPACITY = TABLES * BUCKETS  # tablet.buckets.max: exactly full
ROWS = 200  # per table: keys 0..199 reach every one of its 20 buckets
SLACK_FDS = 64  # connections and threads that come and go besides the buckets


class TabletProcess:
    """``python -m kvlease.tablet`` under ``prlimit --nofile=NOFILE:NOFILE``."""

    def __init__(self, home: Path, values: dict) -> None:
        self.home = home
        self.values = values
        self.metrics_address = f"127.0.0.1:{values['metrics.port']}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(to_toml(values))
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = ["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--",
               sys.executable, "-m", "kvlease.tablet", "--config", str(self.home / "config.toml")]
        with open(self.home / "tablet.log", "ab") as log:
            self.proc = subprocess.Popen(dying_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                         env=dict(os.environ, PYTHONPATH=str(ROOT)))

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


@pytest.fixture
def setup(make_config, tmp_path):
    coordinator = CoordinatorServer(make_config()).start()
    tablet = None
    try:
        assert coordinator.wait_active(30)
        port, metrics_port = free_ports(2)
        values = {k: v for k, v in make_config().as_dict().items() if k.startswith(("zookeeper.", "remote."))}
        values.update({"tablet.id": 1, "tablet.port": port, "metrics.port": metrics_port,
                       "tablet.data-dir": str(tmp_path / "data"), "log.flush.fsync": False,
                       "kv.snapshot.interval": "1h", "tablet.buckets.max": CAPACITY,
                       "tablet.buckets.max-open": MAX_OPEN})
        tablet = TabletProcess(tmp_path / "t1", values)
        with AdminClient([coordinator.address], retry_total_s=30) as admin:
            yield admin, tablet
    except BaseException:
        if tablet is not None:
            print(f"--- tablet log ---\n{log_tail(tablet.home / 'tablet.log', 80)}")
        raise
    finally:
        if tablet is not None:
            tablet.stop()
        coordinator.stop()


def registered(admin: AdminClient) -> bool:
    return any(s.id == 1 for s in admin.list_tablet_servers())


def test_hundreds_of_buckets_under_a_low_fd_limit_serve_restart_and_refuse_beyond_capacity(setup):
    admin, tablet = setup
    tablet.start()
    wait_until(lambda: registered(admin), 60, "the tablet server registered")
    base = peak = tablet.open_fds()
    for t in range(TABLES):
        info = admin.create_table(f"db.t{t}", SCHEMA, ["id"], BUCKETS)
        with TableClient(admin, info.table_id, retry_total_s=30) as table:
            written = table.upsert([{"id": i, "v": f"{t}-{i}"} for i in range(ROWS)])
            assert sorted(written) == list(range(BUCKETS))  # every bucket took rows
            assert table.lookup(list(range(ROWS))) == [{"id": i, "v": f"{t}-{i}"} for i in range(ROWS)]
        peak = max(peak, tablet.open_fds())
    bound = base + MAX_OPEN * FDS_PER_OPEN_BUCKET + SLACK_FDS
    assert peak <= bound < NOFILE, (base, peak)

    health = read_health(tablet.metrics_address)
    assert health["healthy"] and health["problems"] == []
    assert (health["buckets"], health["capacity"], health["unserved"]) == (CAPACITY, CAPACITY, 0)
    assert health["open_buckets"] <= MAX_OPEN and health["max_fds"] == NOFILE

    # full: a table that does not fit is refused, clearly, and is not created
    refused = rf"db\.over.*tablet server 1 leads {CAPACITY} of {CAPACITY}.*tablet.buckets.max"
    with pytest.raises(errors.InvalidRequestError, match=refused):
        admin.create_table("db.over", SCHEMA, ["id"], 1)
    assert "db.over" not in {t.path for t in admin.list_tables()}

    # a restart serves every bucket again, within the same bound
    tablet.stop()
    wait_until(lambda: not registered(admin), 60, "the tablet server gone")
    tablet.start()
    wait_until(lambda: registered(admin), 60, "the tablet server registered again")
    base_after = tablet.open_fds()
    for t in range(TABLES):
        with TableClient(admin, f"db.t{t}", retry_total_s=30) as table:
            assert table.lookup(list(range(ROWS))) == [{"id": i, "v": f"{t}-{i}"} for i in range(ROWS)]
            table.upsert([{"id": i, "v": "again"} for i in range(ROWS)])
            assert {row["v"] for row in table.lookup(list(range(ROWS)))} == {"again"}
        assert tablet.open_fds() <= base_after + MAX_OPEN * FDS_PER_OPEN_BUCKET + SLACK_FDS
    assert read_health(tablet.metrics_address)["healthy"]
