"""``bench replication``'s failover snapshot figures (ops/bench/failover_snapshots.py): their rows without a cluster,
and the failovers for real at small sizes (about a minute: ZooKeeper, a coordinator and three tablet server
processes; nothing left behind)."""

from __future__ import annotations

import copy
import json

import pytest

from kvlease.ops import local_cluster
from kvlease.ops.bench import failover_snapshots, replication as bench_replication
from tests.support.paths import FIXTURES

RECORDED = json.loads((FIXTURES / "bench_all.json").read_text())


def incremental(**changes) -> dict:
    inc = copy.deepcopy(RECORDED["benchmarks"]["replication"]["figures"]["failover"]["incremental"])
    inc.update(changes)
    return inc


@pytest.mark.unit
def test_the_first_snapshot_row_is_met_at_up_to_twice_the_changed_data():
    inc = incremental(first_snapshot_bytes=200_000, changed_bytes=100_000)
    first, share, download, seconds = bench_replication.incremental_rows(inc, 100_000)
    assert first.met and first.value == 2.0 and first.at_most
    assert not bench_replication.incremental_rows(incremental(first_snapshot_bytes=200_001, changed_bytes=100_000),
                                                  100_000)[0].met
    full = incremental(first_snapshot_bytes=inc["full_snapshot_bytes"], changed_bytes=100_000)  # today: the table
    assert not any(row.met for row in bench_replication.incremental_rows(full, 100_000)[:2])
    assert share.target == pytest.approx(2 * inc["changed_rows"] / 100_000)
    assert download.value == pytest.approx(inc["rebase_steady"]["downloaded_bytes"]
                                           / inc["second_snapshot_upload_bytes"])
    assert seconds.unit == "s" and seconds.value == inc["rebase_steady"]["seconds"]


@pytest.mark.unit
def test_new_files_counts_only_what_the_previous_snapshot_lacks():
    assert failover_snapshots.new_files({"a": 5, "b": 7}, {"a": 5, "c": 11, "d": 2}) == 13


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_new_leaders_first_snapshot_uploads_about_the_changed_rows(scratch):
    from kvlease.client.admin import AdminClient

    directory = str(scratch / "cluster")
    overrides = {"kv.snapshot.interval": "1h", "zookeeper.session-timeout": "6s",
                 "replica.rebase.interval": failover_snapshots.REBASE_INTERVAL}
    seen: list[str] = []
    with local_cluster.running(directory, tablets=3, config_overrides=overrides):
        with AdminClient(local_cluster.bootstrap(directory), retry_total_s=60) as admin:
            fo = bench_replication.failovers(directory, admin, 20_000, 1, seen.append, changed=200)
    inc = fo["incremental"]
    assert inc["changed_rows"] == 200 and inc["changed_bytes"] == 201 * failover_snapshots.ROW_BYTES
    assert 0 < inc["first_snapshot_bytes"] <= 2 * inc["changed_bytes"] + 16_384  # + the private files
    assert inc["full_snapshot_bytes"] > 20_000 * 100
    assert inc["rebase_initial"]["rebases"] == 2
    assert inc["rebase_initial"]["downloaded_bytes"] == inc["full_snapshot_bytes"]  # all of it, once
    assert inc["rebase_steady"]["downloaded_bytes"] == inc["second_snapshot_upload_bytes"]  # then what is new
    assert inc["rebase_steady"]["linked_bytes"] > 0
    assert "new leader's first snapshot" in "\n".join(bench_replication.incremental_lines(inc))
    assert any("re-base on the first snapshot" in line for line in seen)
