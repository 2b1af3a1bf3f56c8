"""The scripts in ``examples/`` run as a newcomer runs them (``python examples/X.py --cluster DIR``, or with
KVLEASE_CLUSTER set) against a real cluster (a coordinator and a tablet server on ZooKeeper, real gRPC),
and read or replay exactly the rows they should. The Spark job runs on the session's local Spark."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlease.common.tables import Column
from tests.support.local_cluster import LocalCluster
from tests.client.test_connect import cluster_dir
from tests.tablet.replication.test_data_loss_cluster import cluster  # noqa: F401
from tests.support.paths import REPO

ROOT = REPO
EXAMPLES = ROOT / "examples"
COLUMNS = [Column("id", "BIGINT"), Column("name", "STRING"), Column("qty", "INT")]


def row(i: int, version: int = 0) -> dict:
    return {"id": i, "name": f"n{i}-v{version}", "qty": i * 10 + version}


def run_example(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python examples/SCRIPT ARGS`` with this checkout importable and none of the caller's KVLEASE_*."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVLEASE_")}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT), env={**base, "PYTHONPATH": str(ROOT), **(env or {})})
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc


@pytest.fixture
def kv(make_config, tmp_path):
    """A cluster (coordinator + 1 tablet server) and its directory, as ``kvlease cluster start`` leaves it."""
    cluster = LocalCluster(make_config, tmp_path, 1)
    try:
        cluster.dir = cluster_dir(tmp_path / "cluster", cluster.coordinator.address)
        yield cluster
    finally:
        cluster.close()


def table_rows(kv: LocalCluster, path: str) -> list[dict]:
    from kvlease.client.table import TableClient

    with TableClient(kv.admin, path) as client:
        return sorted(client.scan().rows, key=lambda r: r["id"])


def test_lease_guarded_read_reads_the_snapshots_and_leaves_no_lease(kv):
    from kvlease.client.table import TableClient

    kv.create_table("shop.orders", COLUMNS, ["id"], 2)
    with TableClient(kv.admin, "shop.orders") as orders:
        orders.upsert([row(i) for i in range(10)])
        assert len(orders.trigger_snapshot()) == 2
        orders.upsert([row(0, 1), row(100)])  # after the snapshots: not in what the example reads
    proc = run_example("lease_guarded_read.py", "--cluster", str(kv.dir), "--table", "shop.orders")
    read = sorted((json.loads(line) for line in proc.stdout.splitlines()), key=lambda r: r["id"])
    assert read == [row(i) for i in range(10)]
    assert "10 rows read under a lease, lease dropped" in proc.stderr
    assert kv.admin.list_leases() == []


def test_change_feed_replay_copies_the_table_and_then_only_new_changes(kv, tmp_path):
    from kvlease.client.table import TableClient

    kv.create_table("shop.src", COLUMNS, ["id"], 2)
    state = tmp_path / "replay.json"
    env = {"KVLEASE_CLUSTER": str(kv.dir)}  # the CLI's variable instead of --cluster
    with TableClient(kv.admin, "shop.src") as src:
        src.upsert([row(i) for i in range(20)])
        src.upsert([row(i, 1) for i in range(5)])  # updates: -U and +U
        src.delete([17, 18, 19])
        proc = run_example("change_feed_replay.py", "--source", "shop.src", "--target", "shop.copy",
                           "--state", str(state), env=env)
        summary = json.loads(proc.stdout)
        assert (summary["records"], summary["upserts"], summary["deletes"]) == (28, 25, 3)
        assert table_rows(kv, "shop.copy") == table_rows(kv, "shop.src")
        assert len(table_rows(kv, "shop.copy")) == 17
        src.upsert([row(30), row(3, 2)])
        src.delete([4])
        proc = run_example("change_feed_replay.py", "--source", "shop.src", "--target", "shop.copy",
                           "--state", str(state), env=env)
    assert json.loads(proc.stdout)["records"] == 3  # only what changed since the state file
    assert table_rows(kv, "shop.copy") == table_rows(kv, "shop.src")
    assert kv.admin.get_table("shop.copy").primary_key == ("id",)


@pytest.mark.zk
def test_change_feed_replay_stops_where_the_source_reuses_offsets_it_applied(cluster, tmp_path):
    """The source bucket is restored from an older snapshot between two runs and new changes take offsets
    the first run applied: the second run is refused at its first fetch and applies none of them."""
    from kvlease.client.table import TableClient
    from kvlease.common import errors
    from kvlease.ops.wait import wait_until
    from tests.tablet.replication.test_data_loss_cluster import _restart_wiped, _served
    from tests.tablet.replication.test_replicated_buckets import SCHEMA, bucket_state

    example, c = load_example("change_feed_replay"), cluster
    server = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("shop.src", SCHEMA, ["id"], 1)
    c.admin.create_table("shop.copy", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "shop.src") as src, TableClient(c.admin, "shop.copy") as copy:
        src.upsert([{"id": i, "v": "old"} for i in range(10)])  # offsets 0..9
        assert server.replicas.snapshot_changed() == 1  # the snapshot at log offset 10
        src.upsert([{"id": i, "v": "tail"} for i in range(10, 15)])  # offsets 10..14: to be lost
        summary = example.replay(src, copy, {})
        assert summary["records"] == 15 and summary["next_offsets"] == {0: 15}
        state = example.load_state(json.dumps({k: summary[k] for k in ("next_offsets", "epochs")}))
        assert state[0].offset == 15 and state[0].epoch is not None
        assert len(copy.trigger_snapshot()) == 1  # the target (on the same server) is restored whole
    assert server.log_ends.run_once() == 2  # the ends of both tables' buckets
    _restart_wiped(c, 1, tmp_path / "t1")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline")
    c.admin.restore_bucket("shop.src", 0, accept_data_loss=True)
    c.admin.restore_bucket("shop.copy", 0, accept_data_loss=True)
    with TableClient(c.admin, "shop.src") as src, TableClient(c.admin, "shop.copy") as copy:
        wait_until(lambda: _served(src) and _served(copy), 20, "the restored buckets to serve")
        src.upsert([{"id": i, "v": "new"} for i in range(100, 110)])  # offsets 10..19 of the restored log
        with pytest.raises(errors.DataLostError, match=r"bucket 0 of table shop\.src: offsets 10\.\.14 this reader read"):
            example.replay(src, copy, state)
        assert sorted(r["id"] for r in copy.scan().rows) == list(range(15))  # none of the new changes applied
        assert example.load_state('{"next_offsets": {"0": 12}}') == {0: example.kvlease.LogPosition(12)}


def test_examples_fail_in_one_line_without_a_cluster(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLES / "lease_guarded_read.py"), "--table", "shop.orders"],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT),
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("KVLEASE_")},
                               "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: connect(): no cluster given: connect(cluster=DIR) or connect(bootstrap='HOST:PORT,…'), "
        "or set KVLEASE_CLUSTER or KVLEASE_BOOTSTRAP"]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.spark
def test_spark_job_bootstraps_then_tails(spark, kv, tmp_path):
    """The job's query (its ``start``), run twice on one checkpoint: the table, then only its changes."""
    from kvlease.client.table import TableClient

    job = load_example("spark_bootstrap_then_tail")
    out, checkpoint = str(tmp_path / "feed"), str(tmp_path / "feed-checkpoint")
    kv.create_table("shop.orders", COLUMNS, ["id"], 2)

    def run_once() -> list[dict]:
        job.start(spark, {"cluster": str(kv.dir)}, "shop.orders", out, checkpoint).awaitTermination(120)
        return [r.asDict() for r in spark.read.parquet(out).collect()]

    with TableClient(kv.admin, "shop.orders") as orders:
        orders.upsert([row(i) for i in range(6)])
        orders.trigger_snapshot()
        first = run_once()
        assert sorted((r["_change_type"], r["id"], r["name"]) for r in first) == \
            [("insert", i, f"n{i}-v0") for i in range(6)]
        orders.upsert([row(1, 1)])
        orders.delete([2])
    changes = [r for r in run_once() if r not in first]
    assert sorted((r["_change_type"], r["id"], r["name"]) for r in changes) == [
        ("delete", 2, "n2-v0"), ("update_postimage", 1, "n1-v1"), ("update_preimage", 1, "n1-v0")]


PYTHON_API = ROOT / "docs" / "python-api.md"


def python_api_blocks() -> list[str]:
    """The ```python blocks of docs/python-api.md, in order."""
    text = PYTHON_API.read_text()
    return [part.split("```")[0].split("\n", 1)[1] for part in text.split("```python")[1:]]


def test_the_python_api_page_runs_as_written(kv, capsys):
    blocks = python_api_blocks()
    assert len(blocks) == 4
    namespace: dict = {}
    for block in blocks:  # the page's cluster directory is this test's
        exec(compile(block.replace('"/tmp/kv"', repr(str(kv.dir))), "docs/python-api.md", "exec"), namespace)
    assert capsys.readouterr().out == ("[{'id': 1, 'name': 'a'}, None]\n"
                                       "[{'id': 1, 'total': 12, 'note': 'refunded'}]\n"
                                       "[('bob', 1), ('bob', 2), ('ann', 1), ('ann', 2)]\n")
    assert sorted(namespace["lease"].acquired) == sorted(namespace["latest"])
    assert kv.admin.list_leases() == []  # each bucket released: the lease went with the last one
