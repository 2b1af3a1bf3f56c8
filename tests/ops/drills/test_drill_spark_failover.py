"""The spark-failover drill (ops/drills/spark_failover.py) against a small process cluster, on the tests'
shared SparkSession; and its refusal of a cluster it cannot run on."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from kvlease.client.admin import AdminClient
from kvlease.ops import local_cluster
from kvlease.ops.drills import spark_failover as drill_spark_failover


@pytest.fixture
def small_cluster(tmp_path):
    """ZooKeeper, 2 coordinators and 1 tablet server as processes (the drill kills one), stopped at the end."""
    directory = tmp_path / "cluster"
    try:
        local_cluster.start(directory, coordinators=2, tablets=1,
                            config_overrides={"zookeeper.session-timeout": "4s"})
        yield str(directory)
    finally:
        if local_cluster.cluster_file(directory).exists():
            local_cluster.stop(directory)


def test_the_drill_passes_and_leaves_the_cluster_as_it_found_it(spark, small_cluster):
    out = io.StringIO()
    with redirect_stdout(out):
        code = drill_spark_failover.main(small_cluster, True, rows=2_000, spark=spark)
    doc = json.loads(out.getvalue())
    assert code == 0 and doc["ok"], json.dumps(doc, indent=1)
    assert doc["drill"] == "spark-failover"
    names = [c["name"] for c in doc["checks"]]
    assert "the change rows applied in (bucket, offset) order equal the table" in names
    assert "every coordinator killed was started again and serves" in names
    assert names[-1] == "the cluster is whole again (every process runs, every bucket served)"  # as every drill's
    figures = doc["figures"]
    assert figures["snapshots_leased"] == figures["snapshots_released"] == 4 and figures["change_rows"] > 0
    assert figures["killed_coordinator"] != figures["active_coordinator"]
    status = local_cluster.status(small_cluster)
    assert all(c["alive"] for c in status["coordinators"])
    with AdminClient(local_cluster.bootstrap(small_cluster)) as admin:
        assert admin.list_tables() == [] and admin.list_leases() == []


@pytest.mark.unit
def test_a_cluster_without_a_standby_coordinator_is_refused(tmp_path):
    local_cluster.save(tmp_path, {"zookeeper": [], "tablets": [],
                                  "coordinators": [{"id": "1", "pid": 0, "address": "127.0.0.1:1"}]})
    with pytest.raises(local_cluster.ClusterError, match="at least 2 running coordinators") as info:
        drill_spark_failover.main(str(tmp_path), False)
    assert "0 coordinator(s) and 0 tablet server(s) running" in str(info.value)
