"""Every drill once, through the real ``kvlease drill NAME --json``, on small local clusters (tier 3).

Two clusters, each shared by the tests of its kind and stopped (whatever
happens) when they are done: one with 2 coordinators and 2 tablet servers
(coordinator-failover, tablet-restart, remote-outage), each on a 64 MiB tmpfs
of its own when the tests run as root (``--tablet-disk``, so chaos fills a
leader's disk), and one with a 3-node
ZooKeeper ensemble and 2 coordinators (zk-leader-loss, run by ``all``, which
skips what the shape does not allow). Each drill must pass, report what it checks, and leave the
cluster whole. The cluster logs are printed when a drill fails.

Small settings: a 4 s ZooKeeper session timeout (as every test config), so
failovers are detected sooner. Chaos runs in this process on the tests'
shared SparkSession (``ops.drills.chaos.main``, as ``kvlease drill chaos``
calls it) instead of starting a Spark of its own per run.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from kvlease.ops import local_cluster
from kvlease.ops.drills import chaos
from tests.support.cluster_logs import cluster_logs
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PROJECT_ROOT = REPO
KVLEASE = str(Path(sys.executable).parent / "kvlease")
ENV = {**{k: v for k, v in os.environ.items() if k not in ("KVLEASE_CLUSTER", "KVLEASE_BOOTSTRAP")},
       "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def _cluster(kvlease_tmp: str, **shape):
    """Start a cluster of ``shape`` in a fresh dir; yield it; stop it and remove the dir."""
    directory = Path(tempfile.mkdtemp(prefix="drills-", dir=kvlease_tmp))
    try:
        overrides = {"zookeeper.session-timeout": "4s", **shape.pop("config_overrides", {})}
        local_cluster.start(directory, config_overrides=overrides, **shape)
        yield directory
    finally:
        try:
            local_cluster.stop(directory)
        except Exception:  # last resort below: the recorded pids
            pass
        try:
            doc = local_cluster.load(directory)
        except Exception:
            doc = {}
        for role in local_cluster.ROLES:
            for entry in doc.get(role, []):
                if local_cluster.pid_alive(entry.get("pid"), entry.get("proc_start")):
                    os.kill(entry["pid"], signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(kvlease_tmp):
    disk = TABLET_DISK if _can_mount(kvlease_tmp) else None
    yield from _cluster(kvlease_tmp, coordinators=2, tablets=2, tablet_disk=disk)


TABLET_DISK = "64m"


def _can_mount(kvlease_tmp: str) -> bool:
    """Whether this process may mount a tmpfs (root, and not a container that forbids it)."""
    if os.geteuid() != 0:
        return False
    path = Path(tempfile.mkdtemp(prefix="mount-probe-", dir=kvlease_tmp))
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
        if mounted.returncode:
            return False
        subprocess.run(["umount", str(path)], capture_output=True, check=True)
        return True
    finally:
        path.rmdir()


@pytest.fixture(scope="module")
def ensemble(kvlease_tmp):
    yield from _cluster(kvlease_tmp, zk_nodes=3, coordinators=2, tablets=1)


def drill(directory: Path, *args: str) -> dict:
    """``kvlease drill ARGS --cluster DIR --json``: exit 0 and one JSON document, else an assertion
    error with its output and the cluster's logs."""
    started = time.time()
    proc = subprocess.run([KVLEASE, "drill", *args, "--cluster", str(directory), "--json"], capture_output=True,
                          text=True, timeout=200, env=ENV)
    if proc.returncode != 0:
        print(cluster_logs(directory, started))  # shown with the failure
        raise AssertionError(f"kvlease drill {' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\n"
                             f"stderr: {proc.stderr}")
    return json.loads(proc.stdout)


def checks_of(report: dict) -> dict[str, dict]:
    assert report["ok"], report
    return {c["name"]: c for c in report["checks"]}


def assert_checked(report: dict, *fragments: str) -> None:
    """Each fragment names a check that held and looked at something."""
    checks = checks_of(report)
    for fragment in fragments:
        (name,) = [n for n in checks if fragment in n]
        assert checks[name]["ok"] and checks[name]["checked"] > 0, checks[name]
    whole = [c for n, c in checks.items() if "whole again" in n]
    assert whole and whole[0]["ok"]


def test_coordinator_failover(cluster):
    report = drill(cluster, "coordinator-failover", "--rounds", "1")
    assert report["drill"] == "coordinator-failover"
    assert_checked(report, "read back as acknowledged", "leased snapshot", "deposed coordinator",
                   "new active coordinator")
    figures = report["figures"]
    assert len(figures["recovery_s"]) == 1 and 0 < figures["recovery_s"][0] < 30
    assert figures["acknowledged"] > 0


def test_tablet_restart(cluster):
    report = drill(cluster, "tablet-restart", "--rounds", "1")
    assert_checked(report, "acknowledged write present", "right data", "typed error or resume", "succeed within")
    assert report["figures"]["scans_interrupted"] >= 2  # the resuming scanners had to resume


def test_remote_outage(cluster):
    report = drill(cluster, "remote-outage", "--outage", "2", "--clients", "8")
    assert_checked(report, "fail cleanly", "missing lease file", "orphan", "read back as acknowledged",
                   "after the outage")
    assert report["figures"]["calls_failed_in_outage"] > 0  # the outage was felt
    assert (cluster / "remote").is_dir() and not (cluster / "remote.remote-outage").exists()


def test_all_runs_what_the_shape_allows_in_one_report_and_zk_leader_loss_passes(ensemble):
    """``all`` with every other drill skipped runs zk-leader-loss (a run of its own repeated this one)."""
    doc = drill(ensemble, "all", "--rounds", "1", "--skip", "coordinator-failover", "--skip", "tablet-restart",
                "--skip", "remote-outage", "--skip", "spark-failover", "--skip", "chaos")
    reports = {d["drill"]: d for d in doc["drills"]}
    assert doc["ok"]
    assert reports["coordinator-failover"]["skipped"] == reports["tablet-restart"]["skipped"] == "--skip"
    report = reports["zk-leader-loss"]
    assert_checked(report, "read back as acknowledged", "deposed coordinator", "sent after the kill",
                   "moved to the newest snapshots", "standby takes over")
    assert len(report["figures"]["killed_zookeeper_nodes"]) == 2  # the round, then the quiet fault
    assert report["figures"]["leases_moved"] > 0
    assert 0 < report["figures"]["coordinator_failover_s"] < 30


# Chaos on both shapes, with fixed seeds (a failure's report names its seed and the command that replays it).
# Between them the two plans make every kind of fault but a remote outage: on one ZooKeeper the active
# coordinator's and a tablet server's kill -9, a SIGSTOP of the coordinator and one of a bucket's leader past its
# session (the row table has 2 replicas there: the other one leads meanwhile); on the ensemble (1 tablet server:
# 1 replica) the coordinator's, a node's and the leader's kill -9 (test_chaos_plan pins the plans). No remote
# outage: one during the stream's bootstrap fails the Spark query (StorageError reading the snapshot), seen with
# seeds 647 and 1326. On small disks (as root) the first seed's plan has a full disk of a bucket's leader
# instead of the coordinator's kill -9 (5.2 s: past the 3 s replica.leader.failure-timeout, so it usually steps
# down; the drill reports whether it did, the test does not ask: the contract's bound is 10 s).
CHAOS_SEEDS = {"one zookeeper": 4552, "one zookeeper on small disks": 736, "ensemble": 4853}
CHAOS_ROUNDS = 4


def test_chaos_on_one_zookeeper_and_two_tablet_servers(cluster, spark):
    small_disks = local_cluster.tablet_disks.every_tablet_has_one(local_cluster.load(cluster))
    seed = CHAOS_SEEDS["one zookeeper on small disks" if small_disks else "one zookeeper"]
    figures = _chaos(cluster, spark, seed=seed)
    assert figures["replication_factor"] == 2 and figures["tablet_pauses"] == 1
    assert figures["reads_across_tablet_pauses"] > 0  # lookups were under way while the leader was paused
    if small_disks:
        assert figures["disk_fulls"] == 1 and figures["reads_across_full_disks"] > 0
        (full,) = [d for d in figures["faults_done"] if d["kind"] == "disk-full"]
        assert full["filled_bytes"] > 0 and not (Path(cluster) / f"tablet-{full['leader']}" / "data" /
                                                 "kvlease-drill-disk-full.filler").exists()  # freed again


def test_chaos_on_a_zookeeper_ensemble(ensemble, spark):
    figures = _chaos(ensemble, spark, seed=CHAOS_SEEDS["ensemble"])
    assert figures["replication_factor"] == 1


def _chaos(directory: Path, spark, seed: int) -> dict:
    out, started = io.StringIO(), time.time()
    with redirect_stdout(out):
        code = chaos.main(str(directory), True, seed=seed, rounds=CHAOS_ROUNDS, spark=spark)
    report = json.loads(out.getvalue())
    if code != 0 or not report["ok"]:
        print(json.dumps([c for c in report["checks"] if not c["ok"]], indent=1))  # shown with the failure
        print(json.dumps(report["figures"].get("faults_done"), indent=1))
        print(cluster_logs(directory, started))
    assert_checked(report, "read back as acknowledged", "leased snapshot", "deposed coordinator",
                   "acknowledged write present", "exactly once", "equal the table", "ran through every fault",
                   "acknowledged before they were sent", "sent after another was answered", "back in the ISR")
    figures = report["figures"]
    assert figures["seed"] == seed and len(figures["faults_done"]) == CHAOS_ROUNDS
    assert figures["stream_change_rows"] > 0 and figures["acknowledged"] > 0 and figures["reads_checked"] > 0
    assert figures["stream_bootstrap_s"] is not None  # the faults began once the query had bootstrapped
    return figures
