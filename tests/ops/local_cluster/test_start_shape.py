"""The shape a ``cluster start`` runs (ops/local_cluster/shape.py): a new directory's defaults, a stopped
cluster's own when left out, and a given shape that differs refused naming what differs, before anything runs
(the real start and CLI: tests/ops/cli/test_cli_stopped_cluster_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlease.ops import local_cluster
from kvlease.ops.local_cluster.shape import Shape, resolve
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.unit

D = Path("/c")


def stopped(zk: int = 1, coordinators: int = 2, tablets: int = 2, **more) -> dict:
    """A cluster.json of that shape whose processes do not run."""
    def entries(n: int, port: int) -> list[dict]:
        return [{"id": str(i + 1), "pid": None, "address": f"127.0.0.1:{port + i}"} for i in range(n)]
    return {"zookeeper": entries(zk, 1), "coordinators": entries(coordinators, 10), "tablets": entries(tablets, 20),
            "remote": "file:///c/remote", **more}


def test_a_new_directory_gets_the_defaults_or_what_is_given():
    assert resolve(D, {}, "file:///c/remote") == Shape(1, 1, 1, "file:///c/remote", False)
    assert resolve(D, {}, "file:///c/remote", coordinators=2, tablets=0, secure=True, zk_nodes=None) == \
        Shape(1, 2, 0, "file:///c/remote", True)


def test_a_stopped_cluster_keeps_its_shape_and_what_is_given_must_be_it():
    secure = stopped(tablets=0, security={"ca_file": "x"}, remote="s3://b/p")
    assert resolve(D, secure, "file:///c/remote") == Shape(1, 2, 0, "s3://b/p", True)
    assert resolve(D, secure, "file:///c/remote", coordinators=2, tablets=0, secure=True) == resolve(D, secure, "")
    cases = {
        (("coordinators", 1),): "/c holds a cluster of 1 ZooKeeper node, 2 coordinators and 2 tablet servers; "
                                "--coordinators 1 differs: start it without shape options, or use a new --dir",
        (("tablets", 3), ("zk_nodes", 3)): "--tablets 3, --zk-nodes 3 differ:",
        (("secure", True),): "--secure differs",
        (("remote", "s3://b/q"),): "2 tablet servers, remote storage file:///c/remote; --remote s3://b/q differs",
    }
    for given, message in cases.items():
        with pytest.raises(local_cluster.ClusterError) as info:
            resolve(D, stopped(), "file:///c/remote", **dict(given))
        assert message in info.value.message, given
    with pytest.raises(local_cluster.ClusterError, match="security on; no --secure differs"):
        resolve(D, secure, "", secure=False)


def test_a_file_of_a_start_that_never_got_far_has_no_shape():
    assert resolve(D, stopped(zk=0, coordinators=0, tablets=0), "r", tablets=2) == Shape(1, 1, 2, "r", False)


def test_the_cli_refuses_another_shape_before_anything_starts(tmp_path):
    (tmp_path / "cluster.json").write_text(json.dumps(stopped()))
    line = assert_one_line_error(run("cluster", "start", "--dir", str(tmp_path), "--tablets", "1"))
    assert line == (f"error: {tmp_path.resolve()} holds a cluster of 1 ZooKeeper node, 2 coordinators and 2 tablet "
                    "servers; --tablets 1 differs: start it without shape options, or use a new --dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json"]
