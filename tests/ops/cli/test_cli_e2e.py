"""The real ``kvlease`` executable against a local cluster it starts itself.

One test walks the whole CLI surface of this issue: cluster start/status,
tables, snapshot list, every lease command, errors, failover of the active
coordinator (kill -9), and cluster stop. The cluster is stopped in the
fixture's teardown whatever happens, and the coordinator logs are printed when
the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlease.client.admin import AdminClient
from kvlease.common.model import TableBucket
from kvlease.ops import local_cluster
from kvlease.ops.wait import wait_until
from tests.support.snapshot_manifests import commit_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KVLEASE = str(Path(sys.executable).parent / "kvlease")
CLI_ENV = {k: v for k, v in os.environ.items() if k not in ("KVLEASE_CLUSTER", "KVLEASE_BOOTSTRAP")}


def kvlease(*args: str, check: bool = True, timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([KVLEASE, *args], capture_output=True, text=True, timeout=timeout, env=CLI_ENV,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"kvlease {' '.join(args)} exited {proc.returncode}\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def kvlease_json(*args: str) -> dict:
    proc = kvlease(*args)
    return json.loads(proc.stdout)  # exactly one JSON document, nothing else on stdout


def recorded_pids(directory: Path) -> list[int]:
    try:
        doc = json.loads((directory / "cluster.json").read_text())
    except FileNotFoundError:
        return []
    return [p["pid"] for role in ("coordinators", "tablets", "zookeeper") for p in doc.get(role, [])]


def print_logs(directory: Path) -> None:
    logs = (sorted(directory.glob("coordinator-*/coordinator.log")) + sorted(directory.glob("tablet-*/tablet.log"))
            + sorted(directory.glob("zookeeper/*/*.log")))
    for log in logs:
        print(f"==> {log} <==\n{local_cluster.log_tail(log, 200)}")


@pytest.fixture
def cluster_dir(tmp_path):
    """A cluster directory; whatever the test leaves running there is stopped afterwards."""
    directory = tmp_path / "cluster"
    yield directory
    stop_everything(directory)


def stop_everything(directory: Path) -> None:
    """Stop whatever runs in the cluster directory: ``cluster stop``, then SIGKILL for any process left."""
    pids = recorded_pids(directory)
    if pids:
        kvlease("cluster", "stop", "--dir", str(directory), check=False)
    for pid in pids:  # last resort: the CLI's stop itself may be what failed
        if local_cluster.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_cli_end_to_end(cluster_dir):
    try:
        walk_the_cli(cluster_dir)
    except BaseException:
        print_logs(cluster_dir)  # pytest shows captured output of failed tests
        raise


def walk_the_cli(cluster_dir: Path) -> None:
    d = str(cluster_dir)
    kvlease("cluster", "start", "--dir", d, "--coordinators", "2", "--tablets", "0")
    again = kvlease("cluster", "start", "--dir", d, check=False)
    assert again.returncode == 1 and "already running" in again.stderr

    status = kvlease_json("cluster", "status", "--dir", d, "--json")
    active = [c for c in status["coordinators"] if c["active"]]
    assert len(status["coordinators"]) == 2 and len(active) == 1
    assert active[0]["epoch"] >= 1 and all(c["alive"] for c in status["coordinators"])
    assert status["zookeeper"] and all(z["alive"] for z in status["zookeeper"]) and status["tablets"] == []

    c = ("--cluster", d)
    table_id = table_commands(c)
    addresses = [co["address"] for co in status["coordinators"]]
    with AdminClient(addresses, retry_total_s=20) as client:
        commit_snapshot(client, TableBucket(table_id, 0), 1, 10)
    snapshots = kvlease_json(*c, "snapshot", "list", "db.t", "--json")
    assert snapshots["table"] == "db.t"
    assert [(s["bucket"], s["snapshot_id"], s["log_offset"]) for s in snapshots["snapshots"]] == [(0, 1, 10)]
    assert snapshots["snapshots"][0]["leased_by"] == []
    lease_commands(c)
    errors_are_one_line(c)
    failover(c, d, active[0])

    pids = recorded_pids(cluster_dir)
    assert len(pids) >= 3
    kvlease("cluster", "stop", "--dir", d)
    assert [pid for pid in pids if local_cluster.pid_alive(pid)] == []
    assert "already stopped" in kvlease("cluster", "stop", "--dir", d).stdout


def table_commands(c: tuple[str, ...]) -> int:
    """Create (a warning when no tablet server leads), drop, list, describe; returns db.t's table id."""
    created = kvlease_json(*c, "table", "create", "db.t", "--schema", "id BIGINT, name STRING",
                           "--primary-key", "id", "--buckets", "2", "--json")
    assert created["table"] == "db.t" and created["buckets"] == 2
    assert created["no_leader"] == [0, 1]  # --tablets 0: said at create time, not first at put
    other = kvlease(*c, "table", "create", "db.t0", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "1")
    assert other.stdout.startswith("created table db.t0")
    assert other.stderr.startswith("warning: bucket(s) 0 of db.t0 have no leader") and "--tablets 1" in other.stderr
    kvlease(*c, "table", "drop", "db.t0")
    table_id = created["table_id"]
    listed = kvlease_json(*c, "table", "list", "--json")
    assert [t["table"] for t in listed["tables"]] == ["db.t"]
    described = kvlease_json(*c, "table", "describe", "db.t", "--json")
    assert described["primary_key"] == ["id"] and [col["name"] for col in described["schema"]] == ["id", "name"]
    assert "BIGINT" in kvlease(*c, "table", "describe", "db.t").stdout
    return table_id


def lease_commands(c: tuple[str, ...]) -> None:
    """Acquire (by snapshot and --latest), describe, list, renew, release (also again), drop."""
    before_ms = int(time.time() * 1000)
    acquired = kvlease_json(*c, "lease", "acquire", "L1", "--table", "db.t", "--snapshot", "0=1",
                            "--snapshot", "1=1", "--duration", "10m", "--json")
    assert acquired["lease_id"] == "L1"
    assert acquired["acquired"] == [{"table": "db.t", "bucket": 0, "snapshot_id": 1}]
    assert acquired["unavailable"] == [{"table": "db.t", "bucket": 1, "snapshot_id": 1}]
    assert before_ms + 590_000 <= acquired["expiration_time"] <= int(time.time() * 1000) + 610_000

    described = kvlease_json(*c, "lease", "describe", "L1", "--json")
    assert described == {"lease_id": "L1", "expiration_time": acquired["expiration_time"], "owner": None,
                         "buckets": [{"table": "db.t", "bucket": 0, "snapshot_id": 1}]}
    assert kvlease_json(*c, "lease", "list", "--json") == {"leases": [described]}
    assert kvlease_json(*c, "snapshot", "list", "db.t", "--json")["snapshots"][0]["leased_by"] == ["L1"]

    latest = kvlease_json(*c, "lease", "acquire", "L2", "--table", "db.t", "--latest", "--duration", "1m", "--json")
    assert latest["acquired"] == [{"table": "db.t", "bucket": 0, "snapshot_id": 1}]
    assert latest["no_snapshot"] == [{"table": "db.t", "bucket": 1}]

    kvlease(*c, "lease", "renew", "L1", "--duration", "20m")
    renewed = kvlease_json(*c, "lease", "describe", "L1", "--json")
    assert renewed["expiration_time"] > acquired["expiration_time"]

    released = kvlease_json(*c, "lease", "release", "L2", "--table", "db.t", "--bucket", "0", "--json")
    assert (released["released"], released["lease_remains"]) == (True, False)
    # releasing is safe to repeat: L2 is gone, and L1 never held bucket 1 (exit 0 both, nothing released)
    again = kvlease(*c, "lease", "release", "L2", "--table", "db.t", "--bucket", "0")
    assert again.stdout.strip() == "no lease L2 (nothing to release)" and again.stderr == ""
    not_held = kvlease(*c, "lease", "release", "L1", "--table", "db.t", "--bucket", "1")
    assert not_held.stdout.strip() == "lease L1 holds none of db.t bucket(s) 1: nothing released"
    assert kvlease_json(*c, "lease", "describe", "L1", "--json")["buckets"] == renewed["buckets"]
    assert kvlease_json(*c, "lease", "drop", "L1", "--json")["dropped"] is True
    assert kvlease_json(*c, "lease", "list", "--json") == {"leases": []}


def errors_are_one_line(c: tuple[str, ...]) -> None:
    """An unknown lease or table: one line, exit 1; a bad option value: exit 2."""
    unknown = kvlease(*c, "lease", "renew", "nope", "--duration", "1m", check=False)
    assert unknown.returncode == 1 and "nope" in unknown.stderr and "not found" in unknown.stderr.lower()
    assert len(unknown.stderr.strip().splitlines()) == 1 and "Traceback" not in unknown.stderr
    missing = kvlease(*c, "table", "describe", "db.missing", check=False)
    assert missing.returncode == 1 and "db.missing" in missing.stderr
    bad = kvlease(*c, "lease", "acquire", "L3", "--table", "db.t", "--snapshot", "0:1", "--duration", "1m",
                  check=False)
    assert bad.returncode == 2


def failover(c: tuple[str, ...], d: str, victim: dict) -> None:
    """kill -9 the active coordinator: the standby takes over in a newer epoch, with the leases."""
    kvlease(*c, "lease", "acquire", "L4", "--table", "db.t", "--snapshot", "0=1", "--duration", "10m")
    os.kill(victim["pid"], signal.SIGKILL)

    def new_active():
        doc = kvlease_json("cluster", "status", "--dir", d, "--json")
        return [co for co in doc["coordinators"] if co["active"] and co["id"] != victim["id"]]

    took_over = wait_until(new_active, 20, "a new active coordinator", interval_s=0.3)  # a CLI run a poll
    assert took_over[0]["epoch"] > victim["epoch"]
    dead = [co for co in kvlease_json("cluster", "status", "--dir", d, "--json")["coordinators"]
            if co["id"] == victim["id"]][0]
    assert dead["alive"] is False and dead["active"] is False
    leases = kvlease_json(*c, "lease", "list", "--json")["leases"]
    assert [lease["lease_id"] for lease in leases] == ["L4"]
