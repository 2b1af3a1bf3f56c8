"""With security on no tablet server opens its lookup port (tablet/lookup_port.py: that port has neither TLS nor
users), no Lookup answer names one and no client keeps any: every lookup goes over gRPC, with TLS and the
caller's identity. A real SecureCluster (ZooKeeper, gRPC over TLS, users)."""

from __future__ import annotations

import pytest

from kvlease.client.table import TableClient
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import Column
from tests.support.secure_cluster import SecureCluster

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]


@pytest.fixture
def sc(make_config, tmp_path):
    cluster = SecureCluster(make_config, tmp_path, tablets=1)
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_secure_cluster_has_no_lookup_port_and_its_lookups_go_over_tls(sc):
    assert all(server.lookups is None for server in sc.cluster.tablets.values())
    sc.cluster.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 1)
    with TableClient(sc.admin, "db.t", retry_total_s=10) as client:
        client.upsert([{"id": 1, "v": "v1"}])
        assert client.router.channels.lookup_ports is None
        assert client.lookup([1, 99]) == [{"id": 1, "v": "v1"}, None]
        answer = client._call_bucket(0, "Lookup", pb.LookupRequest(table_id=client.table.table_id, bucket=0),
                                     idempotent=True)
        assert answer.lookup_port == 0
