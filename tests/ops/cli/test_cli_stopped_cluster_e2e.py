"""A stopped local cluster as a newcomer meets it, through the real ``kvlease`` executable and
``kvlease.connect``: its clients are told at once that it is not running; ``cluster start`` starts it again
in the shape it was first started with, refuses other shape options at once, and a start that fails leaves
cluster.json as it was and names the log files (not their tails)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import kvlease as kvlease_api
from kvlease.common import errors
from kvlease.ops import local_cluster
from tests.ops.cli.test_cli_e2e import CLI_ENV, KVLEASE, cluster_dir, kvlease, kvlease_json, print_logs  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

#: a client of a stopped cluster gives up well before this (its retries would last this long)
RETRY = "60s"


def kvlease_env(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([KVLEASE, *args], capture_output=True, text=True, timeout=120, env={**CLI_ENV, **env},
                          stdin=subprocess.DEVNULL)


def processes_of(directory: Path) -> list[int]:
    """The pids of the processes whose command line names ``directory`` (its servers, ZooKeeper included)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"{directory}/" in cmdline and local_cluster.pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def addresses(directory: str) -> list[str]:
    doc = local_cluster.load(directory)
    return [entry["address"] for role in ("coordinators", "tablets") for entry in doc[role]]


def test_a_stopped_cluster_is_told_at_once_and_starts_again_in_its_own_shape(cluster_dir):  # noqa: F811
    d = str(cluster_dir.resolve())  # as the messages name it
    try:
        kvlease("cluster", "start", "--dir", d, "--coordinators", "2", "--tablets", "2")
        kvlease("--cluster", d, "table", "create", "db.t", "--schema", "id BIGINT, v STRING", "--primary-key", "id",
                "--buckets", "2")
        kvlease("--cluster", d, "put", "db.t", "-", input='{"id": 1, "v": "one"}\n')
        ports = addresses(d)
        kvlease("cluster", "stop", "--dir", d)
        recorded = (cluster_dir / "cluster.json").read_bytes()

        # its clients: told it is not running, at once, not after their retries
        began = time.monotonic()
        listed = kvlease("--cluster", d, "--retry-timeout", RETRY, "table", "list", check=False)
        assert listed.returncode == 1 and time.monotonic() - began < 30, listed
        assert listed.stderr == (f"error: the cluster in {d} is not running (none of the 5 processes its "
                                 f"cluster.json records runs): start it with: kvlease cluster start --dir {d}\n")
        began = time.monotonic()
        with pytest.raises(errors.ClusterNotRunningError, match=f"the cluster in {d} is not running"):
            kvlease_api.connect(cluster=d, retry_timeout=RETRY, env={})
        assert time.monotonic() - began < 2

        # other shape options: refused before anything starts, cluster.json as it was
        refused = kvlease("cluster", "start", "--dir", d, "--coordinators", "1", check=False)
        assert (refused.returncode, refused.stdout) == (1, "")
        assert refused.stderr == (f"error: {d} holds a cluster of 1 ZooKeeper node, 2 coordinators and 2 tablet "
                                  "servers; --coordinators 1 differs: start it without shape options, or use a new "
                                  "--dir\n")
        assert processes_of(cluster_dir) == [] and (cluster_dir / "cluster.json").read_bytes() == recorded

        # a start that fails (its coordinators exit at once: a bad value in their environment) stops what it
        # started, leaves cluster.json as it was and names the log files
        failed = kvlease_env("cluster", "start", "--dir", d, env={"KVLEASE_ZOOKEEPER_SESSION_TIMEOUT": "soon"})
        assert failed.returncode == 1
        assert failed.stderr.splitlines()[-1] == (
            f"error: every coordinator exited (exit codes 2, 2); logs: coordinator 1 {d}/coordinator-1/coordinator.log, "
            f"coordinator 2 {d}/coordinator-2/coordinator.log")
        assert processes_of(cluster_dir) == [] and (cluster_dir / "cluster.json").read_bytes() == recorded
        assert not (cluster_dir / local_cluster.STARTING_FILE).exists()

        # started again without options: its own shape, ports and rows
        kvlease("cluster", "start", "--dir", d)
        doc = local_cluster.load(d)
        assert [len(doc[role]) for role in ("zookeeper", "coordinators", "tablets")] == [1, 2, 2]
        assert addresses(d) == ports
        assert kvlease_json("--cluster", d, "get", "db.t", "1", "--json")["rows"] == [{"id": 1, "v": "one"}]

        # partly running (a tablet server killed): its clients go on as before
        local_cluster.kill(d, "tablets", "2")
        assert "db.t" in kvlease("--cluster", d, "table", "list").stdout
        with kvlease_api.connect(cluster=d, env={}) as kv:
            assert [t.path for t in kv.admin.list_tables()] == ["db.t"]
    except BaseException:
        print_logs(cluster_dir)
        raise
