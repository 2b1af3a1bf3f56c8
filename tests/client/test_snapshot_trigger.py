"""``kvlease snapshot trigger --wait`` against a real coordinator and tablet servers (in this process, on a
real ZooKeeper, gRPC on loopback): every bucket is accounted for, one down server fails only its own
buckets, and progress goes to stderr."""

from __future__ import annotations

import json
import re
import threading

import pytest

from kvlease.client.snapshot_trigger import COMMITTED, trigger_snapshots
from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from tests.support.cli_runner import run
from tests.support.local_cluster import LocalCluster

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


@pytest.fixture
def local_cluster(make_config, tmp_path):
    clusters = []

    def make(tablets: int) -> LocalCluster:
        clusters.append(LocalCluster(make_config, tmp_path, tablets))
        return clusters[-1]

    yield make
    for cluster in clusters:
        cluster.close()


def trigger(cluster, *args: str):
    return run("--bootstrap", cluster.coordinator.address, "--retry-timeout", "1s", "snapshot", "trigger", *args)


def latest_ids(cluster, table_id: int) -> dict[int, int]:
    return {tb.bucket: info.snapshot_id for tb, info in cluster.admin.get_latest_kv_snapshots(table_id).items()}


def progress_lines(stderr: str) -> dict[int, str]:
    """bucket -> its progress line on stderr (the last one, if several)."""
    found = {}
    for line in stderr.splitlines():
        match = re.match(r"db\.t: bucket (\d+) ", line)
        if match:
            found[int(match[1])] = line
    return found


def test_a_bucket_the_periodic_snapshot_took_just_before_counts_as_done(local_cluster):
    cluster = local_cluster(1)
    table = cluster.create_table("db.t", COLUMNS, ["id"], 4)
    tablet = cluster.tablets[1]
    with TableClient(cluster.admin, "db.t") as client:
        assert sorted(client.upsert([{"id": i, "v": f"a{i}"} for i in range(200)])) == [0, 1, 2, 3]
        assert tablet.replicas.snapshot_changed() == 4  # the periodic snapshot (its timer's own call)
        periodic = latest_ids(cluster, table.table_id)
        (changed,) = client.upsert([{"id": 0, "v": "b0"}])  # one bucket changes after it
    result = trigger(cluster, "db.t", "--wait", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    now = latest_ids(cluster, table.table_id)
    assert now[changed] > periodic[changed] and all(now[b] == periodic[b] for b in range(4) if b != changed)
    assert doc["snapshots"] == [{"bucket": b, "snapshot_id": now[b], "log_offset": doc["snapshots"][b]["log_offset"],
                                 "new": b == changed} for b in range(4)]
    assert doc["empty"] == [] and doc["not_committed"] == []
    lines = progress_lines(result.stderr)
    assert sorted(lines) == [0, 1, 2, 3]
    assert f"bucket {changed} committed as snapshot {now[changed]}" in lines[changed]
    assert all(f"unchanged since snapshot {now[b]}" in lines[b] for b in range(4) if b != changed)
    assert "(4/4 buckets done)" in result.stderr
    text = trigger(cluster, "db.t", "--wait")  # nothing changed since: every bucket done, nothing new
    assert text.exit_code == 0 and "nothing committed" in text.stdout, text.output


def test_an_empty_bucket_is_done_with_nothing_to_snapshot(local_cluster):
    cluster = local_cluster(1)
    cluster.create_table("db.t", COLUMNS, ["id"], 2)
    result = trigger(cluster, "db.t", "--wait", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"table": "db.t", "waited": True, "snapshots": [], "empty": [0, 1],
                                         "not_committed": []}
    assert "empty, nothing to snapshot (2/2 buckets done)" in result.stderr


def test_with_one_tablet_server_down_the_others_buckets_are_committed_and_its_own_named(local_cluster):
    cluster = local_cluster(2)
    table = cluster.create_table("db.t", COLUMNS, ["id"], 4)
    _, leaders = cluster.admin.get_table_assignment(table.table_id)
    on_2 = sorted(b for b, leader in leaders.items() if leader.leader_id == 2)
    on_1 = sorted(set(range(4)) - set(on_2))
    assert on_1 and on_2
    with TableClient(cluster.admin, "db.t") as client:
        assert sorted(client.upsert([{"id": i, "v": f"a{i}"} for i in range(200)])) == [0, 1, 2, 3]
    cluster.stop_tablet(2)
    result = trigger(cluster, "db.t", "--wait", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    now = latest_ids(cluster, table.table_id)
    assert sorted(now) == on_1
    assert [(s["bucket"], s["snapshot_id"], s["new"]) for s in doc["snapshots"]] == [(b, now[b], True) for b in on_1]
    assert [f["bucket"] for f in doc["not_committed"]] == on_2
    assert all("tablet server 2, is not live" in f["error"] for f in doc["not_committed"])
    *progress, error = result.stderr.strip().splitlines()
    assert error.startswith("error: db.t: bucket") and f"{', '.join(map(str, on_2))} not committed" in error
    assert sorted(progress_lines("\n".join(progress))) == on_1
    text = trigger(cluster, "db.t", "--wait")  # the same as text: both lists, then the error
    assert text.exit_code == 1 and "not committed" in text.stdout and "is not live" in text.stdout, text.output


def test_progress_reports_a_bucket_committed_while_its_leader_still_works_on_the_next(local_cluster, monkeypatch):
    cluster = local_cluster(1)
    cluster.create_table("db.t", COLUMNS, ["id"], 2)
    replicas = cluster.tablets[1].replicas
    reported_0 = threading.Event()
    real_snapshot = replicas.snapshots._snapshot

    def snapshot(replica, *args):  # the leader takes bucket 1 only once bucket 0's commit was reported
        if replica.bucket == 1:
            assert reported_0.wait(60), "bucket 0's commit was not reported while bucket 1 was pending"
        return real_snapshot(replica, *args)

    reported = []

    def on_outcome(outcome, done, total):
        reported.append((outcome.bucket, outcome.state, done, total))
        if outcome.bucket == 0:
            reported_0.set()

    with TableClient(cluster.admin, "db.t") as client:
        assert sorted(client.upsert([{"id": i, "v": f"a{i}"} for i in range(50)])) == [0, 1]
        monkeypatch.setattr(replicas.snapshots, "_snapshot", snapshot)
        outcomes = trigger_snapshots(client, on_outcome=on_outcome, poll_s=0.05)
    assert [(o.bucket, o.state) for o in outcomes] == [(0, COMMITTED), (1, COMMITTED)]
    assert reported == [(0, COMMITTED, 1, 2), (1, COMMITTED, 2, 2)]
