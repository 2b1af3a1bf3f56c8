"""``kvlease bucket reassign`` and ``cluster reassignments|decommission`` against a real coordinator on a real
ZooKeeper; tablet servers are registered by hand (their ZooKeeper nodes), none runs, so a move stays in
progress: its errors are one line, and describe / reassignments show it."""

from __future__ import annotations

import json

import pytest

from kvlease.common import zkpaths
from kvlease.common.zk import make_client
from kvlease.client.admin import AdminClient
from kvlease.coordinator.server import CoordinatorServer
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.zk


@pytest.fixture
def coordinator(make_config):
    config = make_config()
    server = CoordinatorServer(config).start()
    zk = make_client(config)
    try:
        assert server.wait_active(15)
        for sid in (1, 2, 3):
            zk.create(zkpaths.tablet_server(sid), f'{{"address": "127.0.0.1:{1000 + sid}"}}'.encode(),
                      ephemeral=True, makepath=True)
        with AdminClient(server.address) as admin:  # the coordinator learns of them from its ZooKeeper watch
            wait_until(lambda: len(admin.list_tablet_servers()) == 3, 15, "the three tablet servers registered")
        yield server
    finally:
        zk.stop()
        zk.close()
        server.stop()


def test_reassign_from_the_command_line(coordinator):
    b = ("--bootstrap", coordinator.address)
    def create(name, *more):
        return run(*b, "table", "create", name, "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "1",
                   *more)
    created = wait_until(lambda: create("db.t", "--replication-factor", "2").exit_code == 0, 15,
                         "the three tablet servers registered")
    assert created and create("db.one").exit_code == 0, create("db.one").output
    reassign = (*b, "bucket", "reassign", "db.t", "--bucket", "0")
    for args, message in ((("--replicas", "1,2", "--partition", "p1"), "error: table db.t is not partitioned"),
                          (("--replicas", "1,2,3"), "3 replica(s) [1, 2, 3] given, its table has replication factor 2"),
                          (("--replicas", "1,7"), "tablet server(s) [7] are not live (live: [1, 2, 3])"),
                          (("--replicas", ""), "the new replica list is empty")):
        assert message in assert_one_line_error(run(*reassign, *args))
    one = assert_one_line_error(run(*b, "bucket", "reassign", "db.one", "--bucket", "0", "--replicas", "1,2"))
    assert "2 replica(s) [1, 2] given, its table has replication factor 1" in one
    current = json.loads(run(*b, "table", "describe", "db.t", "--json").stdout)["assignment"][0]
    new = next(s for s in (1, 2, 3) if s not in current["replicas"])
    target = f"{new},{current['leader']}"
    doc = json.loads(run(*reassign, "--replicas", target, "--json").stdout)
    assert doc["state"] == "moving" and doc["waiting"] == [new]
    assert json.loads(run(*reassign, "--replicas", target, "--json").stdout) == doc  # resent: the same move
    other = next(s for s in current["replicas"] if s != current["leader"])
    assert "is in progress" in assert_one_line_error(run(*reassign, "--replicas", f"{other},{new}"))
    described = json.loads(run(*b, "table", "describe", "db.t", "--json").stdout)["assignment"][0]
    assert described["reassign_target"] == [new, current["leader"]]
    listed = json.loads(run(*b, "cluster", "reassignments", "--json").stdout)["moves"]
    assert [(m["table"], m["bucket"], m["waiting"]) for m in listed] == [("db.t", 0, [new])]
    line = assert_one_line_error(run(*b, "cluster", "decommission", "--tablet", str(new)))
    assert "is being moved to" in line  # the move in progress holds it
