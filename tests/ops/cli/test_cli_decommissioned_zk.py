"""``kvlease cluster decommission|recommission|status`` and a decommissioned tablet server, against a real
coordinator on a real ZooKeeper; tablet servers are registered by hand (their ZooKeeper nodes), none runs."""

from __future__ import annotations

import json
import os

import pytest

from kvlease.client.admin import AdminClient
from kvlease.ops.local_cluster.cluster_file import save
from kvlease.ops.wait import wait_until
from tests.ops.cli.test_cli_moves_zk import coordinator  # noqa: F401  (the fixture: three servers registered)
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.zk


def status(directory, address) -> dict:
    """``cluster status --json`` of a cluster file naming this coordinator (as running: this process) and the
    three tablet servers (not running: their registration is asked of the coordinator). The file keeps ids as
    text, as ``cluster start`` writes them; the document tells them as integers, as ``table describe`` does."""
    save(directory, {"zookeeper": [], "coordinators": [{"id": "1", "pid": os.getpid(), "address": address}],
                     "tablets": [{"id": str(i), "pid": None, "address": f"127.0.0.1:{1000 + i}"} for i in (1, 2, 3)]})
    result = run("cluster", "status", "--dir", str(directory), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [c["id"] for c in doc["coordinators"]] == [1] and [t["id"] for t in doc["tablets"]] == [1, 2, 3]
    return {t["id"]: t for t in doc["tablets"]}


def test_decommission_recommission_and_status(coordinator, tmp_path):  # noqa: F811
    b = ("--bootstrap", coordinator.address)
    with AdminClient(coordinator.address) as admin:
        wait_until(lambda: len(admin.list_tablet_servers()) == 3, 15, "the three tablet servers registered")
        done = run(*b, "cluster", "decommission", "--tablet", "3")
        assert done.exit_code == 0, done.output
        assert "tablet server 3 holds no bucket replica: nothing to move (decommissioned)" in done.stdout
        assert {s.id: s.decommissioned for s in admin.list_tablet_servers()} == {1: False, 2: False, 3: True}
        assert admin.cluster_health().decommissioned == (3,)
        tablets = status(tmp_path, coordinator.address)
        assert [tablets[i]["decommissioned"] for i in (1, 2, 3)] == [False, False, True]
        text = " ".join(run("cluster", "status", "--dir", str(tmp_path)).stdout.split())  # the table may wrap
        assert "0 buckets; decommissioned (takes no new replicas)" in text

        line = assert_one_line_error(run(*b, "table", "create", "db.t", "--schema", "id BIGINT", "--primary-key",
                                         "id", "--buckets", "2", "--replication-factor", "3"))
        assert "more than the 2 live tablet server(s) taking new replicas (tablet server(s) [3] are " \
               "decommissioned" in line
        created = run(*b, "table", "create", "db.t", "--schema", "id BIGINT", "--primary-key", "id", "--buckets",
                      "4", "--replication-factor", "2")
        assert created.exit_code == 0, created.output
        placed = json.loads(run(*b, "table", "describe", "db.t", "--json").stdout)["assignment"]
        assert {r for bucket in placed for r in bucket["replicas"]} == {1, 2}

        again = run(*b, "cluster", "recommission", "--tablet", "3")
        assert again.exit_code == 0, again.output
        assert "tablet server 3 recommissioned: it takes new replicas again" in again.stdout
        resent = json.loads(run(*b, "cluster", "recommission", "--tablet", "3", "--json").stdout)
        assert resent == {"tablet": 3, "was_decommissioned": False}  # a resent one succeeds
        assert "tablet server 3 is not decommissioned: nothing to change" in run(
            *b, "cluster", "recommission", "--tablet", "3").stdout
        assert admin.cluster_health().decommissioned == ()
        assert status(tmp_path, coordinator.address)[3]["decommissioned"] is False
        rebalanced = json.loads(run(*b, "cluster", "rebalance", "--json").stdout)["moves"]
        assert rebalanced and all(3 in m["target"] for m in rebalanced)  # it takes replicas again


def test_bad_recommission_and_decommission_input_is_one_line(coordinator):  # noqa: F811
    b = ("--bootstrap", coordinator.address)
    for verb in ("decommission", "recommission"):
        line = assert_one_line_error(run(*b, "cluster", verb, "--tablet", "9"))
        assert line == (f"error: cannot {verb} tablet server 9: no tablet server with this id is registered or "
                        "holds a replica (registered: [1, 2, 3])")
        usage = run(*b, "cluster", verb, "--tablet", "x")
        assert usage.exit_code == 2 and "Traceback" not in usage.output and "--tablet" in usage.stderr
        assert run(*b, "cluster", verb).exit_code == 2  # --tablet required
