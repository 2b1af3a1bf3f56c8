"""``kvlease cluster status`` names the partition of each offline, under-replicated or moving bucket of a
partitioned table (``shop.events partition 20261129 bucket 0``, ``--json``: ``partition`` and
``partition_id``), against a real coordinator on a real ZooKeeper; tablet servers are registered by hand
(their ZooKeeper nodes), none runs, so a move stays in progress and unregistering them takes the buckets
offline."""

from __future__ import annotations

import json
import os

import pytest

from kvlease.client.admin import AdminClient
from kvlease.common import zkpaths
from kvlease.ops.local_cluster.cluster_file import save
from kvlease.ops.wait import wait_until
from tests.ops.cli.test_cli_moves_zk import coordinator  # noqa: F401  (the fixture: three servers registered)
from tests.support.cli_runner import run

pytestmark = pytest.mark.zk


def status(directory, address, *json_flag: str):
    """``cluster status`` of a cluster file naming this coordinator (as running: this process) and three tablet
    servers that do not run: the document with ``--json``, else the text (its lines unwrapped)."""
    save(directory, {"zookeeper": [], "coordinators": [{"id": "1", "pid": os.getpid(), "address": address}],
                     "tablets": [{"id": str(i), "pid": None, "address": f"127.0.0.1:{1000 + i}"} for i in (1, 2, 3)]})
    result = run("cluster", "status", "--dir", str(directory), *json_flag)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if json_flag else " ".join(result.stdout.split())


def test_status_names_the_partition_of_each_offline_and_moving_bucket(coordinator, zk_client, tmp_path):  # noqa: F811
    b = ("--bootstrap", coordinator.address)
    for create in (("shop.events", "--schema", "hour STRING, id BIGINT", "--primary-key", "hour,id",
                    "--partition-by", "hour", "--buckets", "2"),
                   ("db.t", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "1")):
        assert run(*b, "table", "create", *create).exit_code == 0
    assert run(*b, "partition", "add", "shop.events", "20261129").exit_code == 0
    events = json.loads(run(*b, "table", "describe", "shop.events", "--json").stdout)
    (partition,) = events["partitions"]
    partition_id, moving = partition["partition_id"], partition["assignment"][0]
    target = next(s for s in (1, 2, 3) if s not in moving["replicas"])
    moved = run(*b, "bucket", "reassign", "shop.events", "--partition", "20261129", "--bucket", "0",
                "--replicas", str(target), "--json")
    assert moved.exit_code == 0, moved.output
    text = status(tmp_path, coordinator.address)
    assert f"buckets being moved: 1: shop.events partition 20261129 bucket 0 to [{target}]" in text

    for sid in (1, 2, 3):  # every server gone: every bucket offline
        zk_client.delete(zkpaths.tablet_server(sid))
    with AdminClient(coordinator.address) as admin:
        wait_until(lambda: len(admin.cluster_health().offline) == 3, 15, "the three buckets offline")
    doc = status(tmp_path, coordinator.address, "--json")
    flat = json.loads(run(*b, "table", "describe", "db.t", "--json").stdout)["table_id"]
    of_partition = {"table": "shop.events", "table_id": events["table_id"], "partition": "20261129",
                    "partition_id": partition_id}
    assert sorted(doc["offline"], key=lambda x: (x["table"], x["bucket"])) == [
        {"table": "db.t", "table_id": flat, "bucket": 0}, {**of_partition, "bucket": 0}, {**of_partition, "bucket": 1}]
    assert doc["offline_count"] == 3
    text = status(tmp_path, coordinator.address)
    assert "offline buckets (no live leader): 3:" in text
    for bucket in ("shop.events partition 20261129 bucket 0", "shop.events partition 20261129 bucket 1", "db.t/0"):
        assert bucket in text
