"""A cluster start whose coordinator or tablet server loses the race for its port (another process binds it
between the start picking it and the server listening) starts that server again on a new port, and says so,
instead of failing the whole start."""

from __future__ import annotations

import contextlib
import socket

import pytest

from kvlease.client.admin import AdminClient
from kvlease.ops import local_cluster
from kvlease.ops.local_cluster import launch
from tests.ops.local_cluster.test_cluster_control import cluster_dir  # noqa: F401 (a fixture: stops what started)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def racing_start(directory, monkeypatch, squat) -> tuple[dict, list[str], dict[str, int]]:
    """``local_cluster.start`` of one server of each role in ``directory``, where ``squat(role, port, stack)`` may
    take a server's port just before it is launched (True if it did; ``stack`` stops what it started, after the
    start): the cluster's document, its warnings, and the port squatted per role."""
    squatted: dict[str, int] = {}
    real_spawn = launch._spawn
    with contextlib.ExitStack() as squatters:
        def racing_spawn(directory_, role, index, zk_connect, remote, port, metrics_port, overrides):
            if role not in squatted and squat(role, port, squatters):
                squatted[role] = port
            return real_spawn(directory_, role, index, zk_connect, remote, port, metrics_port, overrides)

        monkeypatch.setattr(launch, "_spawn", racing_spawn)
        warnings: list[str] = []
        doc = local_cluster.start(directory, zk_nodes=1, coordinators=1, tablets=1, warn=warnings.append,
                                  config_overrides={"zookeeper.session-timeout": "4s"})
    return doc, warnings, squatted


def test_a_server_whose_port_is_taken_as_it_starts_is_started_again_on_a_new_one(cluster_dir, monkeypatch):
    def squat(role, port, stack) -> bool:  # each role's first launch loses its port to another process
        squatter = stack.enter_context(socket.socket())
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        return True

    doc, warnings, squatted = racing_start(cluster_dir, monkeypatch, squat)
    coordinator, tablet = doc["coordinators"][0]["address"], doc["tablets"][0]["address"]
    assert coordinator != f"127.0.0.1:{squatted['coordinators']}"
    assert tablet != f"127.0.0.1:{squatted['tablets']}"
    assert any(f"coordinator 1: its port {squatted['coordinators']} was taken" in w for w in warnings), warnings
    assert any(f"tablet server 1: its port {squatted['tablets']} was taken" in w for w in warnings), warnings
    assert local_cluster.load(cluster_dir)["tablets"][0]["address"] == tablet  # what clients read
    with AdminClient(local_cluster.bootstrap(cluster_dir), retry_total_s=10) as admin:
        assert [s.address for s in admin.list_tablet_servers()] == [tablet]


@pytest.mark.zk
def test_a_coordinator_of_another_cluster_on_the_picked_port_is_not_taken_for_ours(cluster_dir, monkeypatch,
                                                                                      make_config):
    """The squatter answers as an active coordinator (another cluster's, on its own chroot): the start waits
    for its own process, which lost the port, and starts it again elsewhere instead of trusting the answer."""
    from kvlease.common import config as cfg
    from kvlease.coordinator.server import CoordinatorServer

    def squat(role, port, stack) -> bool:
        if role != "coordinators":
            return False
        foreign = CoordinatorServer(make_config({cfg.COORDINATOR_PORT.name: port})).start()
        stack.callback(foreign.stop)
        assert foreign.wait_active(30)
        return True

    doc, warnings, squatted = racing_start(cluster_dir, monkeypatch, squat)
    assert doc["coordinators"][0]["address"] != f"127.0.0.1:{squatted['coordinators']}"
    assert any(f"coordinator 1: its port {squatted['coordinators']} was taken" in w for w in warnings), warnings
    with AdminClient(local_cluster.bootstrap(cluster_dir), retry_total_s=10) as admin:
        assert [s.address for s in admin.list_tablet_servers()] == [doc["tablets"][0]["address"]]
