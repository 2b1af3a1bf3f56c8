"""What a newcomer meets with a local cluster, through the real ``kvlease`` executable: ``cluster start``
serves rows without options (one tablet server by default), and a stopped cluster started again keeps its
coordinators' and tablet servers' addresses (a port taken meanwhile is replaced, with a warning)."""

from __future__ import annotations

import socket

import pytest

from ops import cluster as local_cluster
from tests.test_cli_e2e import cluster_dir, kvlease, kvlease_json, print_logs  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def addresses(directory: str, role: str) -> list[str]:
    return [entry["address"] for entry in local_cluster.load(directory)[role]]


def test_default_cluster_serves_and_keeps_its_ports_across_a_restart(cluster_dir):  # noqa: F811
    d = str(cluster_dir)
    try:
        kvlease("cluster", "start", "--dir", d)
        assert len(local_cluster.load(d)["tablets"]) == 1
        created = kvlease("--cluster", d, "table", "create", "db.orders", "--schema", "id BIGINT, v STRING",
                          "--primary-key", "id", "--buckets", "2")
        assert "warning" not in created.stderr, created.stderr
        kvlease("--cluster", d, "put", "db.orders", "-", input='{"id": 1, "v": "one"}\n')
        coordinators, tablets = addresses(d, "coordinators"), addresses(d, "tablets")
        kvlease("cluster", "stop", "--dir", d)

        kvlease("cluster", "start", "--dir", d)
        assert (addresses(d, "coordinators"), addresses(d, "tablets")) == (coordinators, tablets)
        assert kvlease_json("--bootstrap", coordinators[0], "get", "db.orders", "1", "--json")["found"] == 1
        kvlease("cluster", "stop", "--dir", d)

        taken = int(tablets[0].rsplit(":", 1)[1])
        with socket.socket() as squatter:  # another process took the tablet server's port meanwhile
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the old server's TIME_WAIT
            squatter.bind(("127.0.0.1", taken))
            squatter.listen()
            started = kvlease("cluster", "start", "--dir", d)
            assert f"warning: tablet server 1: its port {taken} is taken now" in started.stderr, started.stderr
            assert addresses(d, "coordinators") == coordinators and addresses(d, "tablets") != tablets
            assert kvlease_json("--cluster", d, "get", "db.orders", "1", "--json")["found"] == 1
    except BaseException:
        print_logs(cluster_dir)
        raise
