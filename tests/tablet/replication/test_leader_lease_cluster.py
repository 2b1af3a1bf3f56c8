"""Leader leases on an in-process cluster (a coordinator and three tablet servers on a real ZooKeeper): a
leader cut off from the coordinator but not from ZooKeeper (its pushes fail) while an operator moves its
leadership away keeps answering nothing old: the coordinator bumped its demotions node, so its lease is not
renewed, and its successor waits a lease's duration before it serves (docs/architecture.md, "Leader
leases")."""

from __future__ import annotations

import threading
import time

import grpc
import pyarrow as pa
import pytest

from kvlease.client.table import TableClient
from kvlease.common import config as cfg
from kvlease.common import errors, zkpaths
from kvlease.common.codec import batch_to_ipc, ipc_to_batch
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pbg
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]
QUICK_RETRIES = cfg.Config({"client.retry.max-wait": "100ms"}, env={})


@pytest.fixture
def cluster(make_config, tmp_path):
    c = LocalCluster(make_config, tmp_path, 3, tablet_overrides={"replica.max-lag": "1s",
                                                                "replica.fetch.wait-max": "200ms"})
    try:
        yield c
    finally:
        for tablet in list(c.tablets.values()):
            tablet.stop()
        c.admin.close()
        c.coordinator.stop()


def _leader(c, table):
    def led():  # the bucket's state once it has a live leader and a full ISR
        b = c.admin.get_table_assignment(table.table_id)[1][0]
        return b if b.leader_address and len(b.isr) == 3 else None
    return wait_until(led, 30, "a leader with a full ISR")


def _lookup(address: str, table_id: int):
    with grpc.insecure_channel(address) as channel:
        response = pbg.TabletServiceStub(channel).Lookup(pb.LookupRequest(
            table_id=table_id, bucket=0, keys=batch_to_ipc(pa.RecordBatch.from_pydict({"id": [1]}))), timeout=10)
    if response.error.code:
        return errors.ErrorCode(response.error.code)
    return ipc_to_batch(response.rows).to_pylist()[0]["v"]


def test_a_leader_the_coordinator_cannot_reach_stops_answering_when_its_leadership_moves(cluster):
    c = cluster
    table = c.admin.create_table("db.cut", SCHEMA, ["id"], 1, replication_factor=3)
    old = _leader(c, table)
    with TableClient(c.admin, table.path) as client:
        client.upsert([{"id": 1, "v": "old"}])
    cut_off = threading.Event()
    server = c.tablets[old.leader_id]
    take = server.replicas.update_leadership

    def unreachable(*args, **kwargs):  # the coordinator's pushes do not get through
        if cut_off.is_set():
            raise errors.NetworkError("cut off from the coordinator (test)")
        return take(*args, **kwargs)
    server.replicas.update_leadership = unreachable
    demotions = c.coordinator.zk
    version = demotions.exists(zkpaths.tablet_demotions(old.leader_id)).version
    assert _lookup(old.leader_address, table.table_id) == "old"

    old_epoch = server.replicas.replica(table.table_id, 0).role.leader_epoch
    cut_off.set()
    target = next(s for s in (1, 2, 3) if s != old.leader_id)
    started = time.monotonic()
    c.admin.elect_leader(table.path, 0, False, tablet=target)
    assert demotions.exists(zkpaths.tablet_demotions(old.leader_id)).version == version + 1
    with TableClient(c.admin, table.path, QUICK_RETRIES, retry_total_s=30) as writer:
        writer.upsert([{"id": 1, "v": "new"}])
    acked = time.monotonic()
    lease_s = server.lease.duration_s
    assert acked - started >= lease_s, "the new leader served before the old one's lease could have ended"
    answers = [_lookup(old.leader_address, table.table_id) for _ in range(5)]
    assert answers == [errors.ErrorCode.NOT_LEADER] * 5, answers  # still believes it leads: it has no lease
    assert server.replicas.replica(table.table_id, 0).leads  # (it was told nothing)

    # the next push gets through: it follows (and may lead again soon after: it is the preferred leader,
    # elected back once it rejoins the ISR)
    cut_off.clear()
    wait_until(lambda: server.replicas.replica(table.table_id, 0).role.leader_epoch != old_epoch, 30,
               "the old leader took its push")
    assert server.lease.valid() or server.lease.wait_valid(5)  # renewed on the push's new basis
    with TableClient(c.admin, table.path) as reader:
        assert reader.lookup([{"id": 1}])[0]["v"] == "new"
