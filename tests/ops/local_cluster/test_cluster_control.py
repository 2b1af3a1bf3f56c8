"""ops.local_cluster's control of single processes on a real local cluster (3 ZooKeeper nodes, 2
coordinators, 2 tablet servers): kill and restart each role, find the active coordinator and
the ZooKeeper leader, a status that asks the active coordinator wherever it is listed, and a
start that returns only once every bucket is served."""

from __future__ import annotations

import os
import signal
import stat

import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.wait import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROWS = 200
SHAPE = {"zk_nodes": 3, "coordinators": 2, "tablets": 2,
         "config_overrides": {"zookeeper.session-timeout": "4s"}}  # as every test config: failovers sooner


@pytest.fixture
def cluster_dir(tmp_path):
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        if local_cluster.cluster_file(directory).exists():
            doc = local_cluster.load(directory)
            try:
                local_cluster.stop(directory)
            finally:
                for pid in local_cluster.running_pids(doc):  # last resort
                    os.kill(pid, signal.SIGKILL)


def lookups(directory) -> int:
    """How many of the ROWS keys a client that never retries finds right now."""
    with AdminClient(local_cluster.bootstrap(directory), retry_total_s=5) as admin:
        with TableClient(admin, "db.t", retry_total_s=0) as table:
            return sum(row is not None for row in table.lookup(list(range(ROWS))))


def test_kill_restart_status_and_readiness(cluster_dir):
    local_cluster.start(cluster_dir, **SHAPE)
    # owner only: ZooKeeper's data, the tablets' RocksDB and the default remote storage are files under it
    assert stat.S_IMODE(os.stat(cluster_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(local_cluster.load(cluster_dir)["remote"][len("file://"):]).st_mode) == 0o700
    with AdminClient(local_cluster.bootstrap(cluster_dir), retry_total_s=10) as admin:
        admin.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 4)
        with TableClient(admin, "db.t") as table:
            table.upsert([{"id": i, "v": str(i)} for i in range(ROWS)])

    # the first coordinator listed becomes the standby: status still finds the tablet servers
    if local_cluster.active_coordinator(cluster_dir)["id"] == "1":
        assert local_cluster.kill(cluster_dir, "coordinators", "1") is not None
        assert local_cluster.active_coordinator(cluster_dir)["id"] == "2"
        local_cluster.restart(cluster_dir, "coordinators", "1")
    status = local_cluster.status(cluster_dir)
    assert [(c["id"], c["active"], c["alive"]) for c in status["coordinators"]] == [(1, False, True),
                                                                                   (2, True, True)]
    assert all(t["registered"] and "error" not in t for t in status["tablets"])
    assert sum(t["buckets"] for t in status["tablets"]) == 4

    # a tablet server killed -9 and restarted serves its buckets again
    local_cluster.kill(cluster_dir, "tablets", "1")
    assert local_cluster.status(cluster_dir)["tablets"][0]["alive"] is False
    unserved = local_cluster.served_buckets(local_cluster.load(cluster_dir))["unserved"]
    assert unserved and all(entry.startswith("db.t/") for entry in unserved)  # what start waits out
    local_cluster.restart(cluster_dir, "tablets", "1")
    assert local_cluster.served_buckets(local_cluster.load(cluster_dir))["unserved"] == []
    assert lookups(cluster_dir) == ROWS

    # the ZooKeeper leader killed: another node leads; restarted, it serves again
    leader = local_cluster.zk_leader(cluster_dir)
    assert leader is not None
    local_cluster.kill(cluster_dir, "zookeeper", leader["id"])
    new_leader = wait_until(lambda: local_cluster.zk_leader(cluster_dir), 30, "a new ZooKeeper leader")
    assert new_leader["id"] != leader["id"]
    local_cluster.restart(cluster_dir, "zookeeper", leader["id"])
    assert all(z["alive"] for z in local_cluster.status(cluster_dir)["zookeeper"])

    # no coordinator at all: the tablet servers' state is an error, not "not registered"
    local_cluster.kill(cluster_dir, "coordinators", "1")
    local_cluster.kill(cluster_dir, "coordinators", "2")
    tablets = local_cluster.status(cluster_dir, request_timeout_s=0.5)["tablets"]
    assert [(t["registered"], t["error"]) for t in tablets] == [
        (None, "no active coordinator to ask which tablet servers are registered")] * 2
    with pytest.raises(local_cluster.ClusterError, match="has no tablet server 9"):
        local_cluster.kill(cluster_dir, "tablets", "9")

    # a cluster killed -9 and started again is ready only once every bucket answers (its
    # tablet servers register well before they lead their buckets again)
    for role in ("tablets", "zookeeper"):
        for entry in local_cluster.load(cluster_dir)[role]:
            local_cluster.kill(cluster_dir, role, entry["id"])
    stopped = local_cluster.status(cluster_dir, request_timeout_s=0.5)  # all down: nothing asked, nothing failed
    assert [(t["alive"], t["registered"], t["error"]) for t in stopped["tablets"]] == [(False, None, None)] * 2
    local_cluster.start(cluster_dir, **SHAPE)
    assert lookups(cluster_dir) == ROWS
