"""A bucket's replicas moved under writes (``kvlease bucket reassign``, coordinator/moves.py): a coordinator and
three tablet servers in this process, a real ZooKeeper, real RocksDB, gRPC on loopback. The new replica copies
the bucket and joins the ISR, the leader hands over, the old replicas delete their copy; every acknowledged
write is on the new replicas."""

from __future__ import annotations

import os
import threading

import pytest

from kvlease.client.table import TableClient
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_rebuild import rows_of
from tests.tablet.replication.test_replicated_buckets import (FAST, SCHEMA, bucket_state, server_by_id, three_servers,
                                                              wait_in_sync)

pytestmark = pytest.mark.zk


@pytest.fixture
def cluster(make_config, tmp_path):
    with three_servers(make_config, tmp_path, FAST) as c:
        yield c


class Writer(threading.Thread):
    """Upserts batches of 5 rows until stopped; ``acked``: the ids of every acknowledged batch."""

    def __init__(self, client: TableClient) -> None:
        super().__init__(name="reassign-writer", daemon=True)
        self.client = client
        self.acked: set[int] = set()
        self.stop = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        i = 0
        try:
            while not self.stop.is_set():
                ids = range(i, i + 5)
                self.client.upsert([{"id": j, "v": f"v{j}"} for j in ids])
                self.acked.update(ids)
                i += 5
        except Exception as exc:  # the test fails on it
            self.error = exc


def test_a_move_under_writes_keeps_every_acknowledged_row_and_deletes_the_old_copy(cluster):
    c = cluster
    table = c.admin.create_table("db.moved", SCHEMA, ["id"], 1, replication_factor=2, min_insync_replicas=2)
    before = wait_in_sync(c, table.table_id, members=2)
    new = next(s for s in (1, 2, 3) if s not in before.replicas)
    follower = next(r for r in before.replicas if r != before.leader_id)
    target = [new, follower]  # the leader leaves: it hands over to the new replica
    old_leader = server_by_id(c, before.leader_id)
    with TableClient(c.admin, "db.moved", retry_total_s=30) as client:
        writer = Writer(client)
        writer.start()
        try:
            wait_until(lambda: len(writer.acked) >= 50 or writer.error, 15, "writes before the move")
            move = c.admin.reassign_bucket("db.moved", 0, target)
            assert move["state"] in ("moving", "done") and move["target"] == target
            assert c.admin.reassign_bucket("db.moved", 0, target)["target"] == target  # resent: the same move
            wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
            acked_at_move = len(writer.acked)
            wait_until(lambda: len(writer.acked) >= acked_at_move + 25 or writer.error, 15, "writes after the move")
        finally:
            writer.stop.set()
            writer.join(30)
        assert writer.error is None, writer.error
    after = bucket_state(c, table.table_id)
    assert list(after.replicas) == target and after.leader_id == new and after.reassign_target is None
    wait_until(lambda: len(bucket_state(c, table.table_id).isr) == 2, 20, "both new replicas in sync")
    stores = [server_by_id(c, s).replicas.replica(table.table_id, 0).store for s in target]
    wait_until(lambda: stores[1].high_watermark == stores[0].high_watermark, 20, "the follower to apply")
    rows = rows_of(stores[0])
    assert rows == rows_of(stores[1])
    assert len(rows) >= len(writer.acked)  # a last batch whose answer the stop cut off may be in too
    with TableClient(c.admin, "db.moved", retry_total_s=30) as client:
        found = client.lookup([{"id": i} for i in sorted(writer.acked)])
    assert all(row is not None for row in found)
    gone_dir = old_leader.replicas.bucket_dir(table.table_id, 0)
    wait_until(lambda: not os.path.exists(gone_dir), 15, "the old leader to delete its copy")
    assert all(r.table.table_id != table.table_id for r in old_leader.replicas.all_replicas())
