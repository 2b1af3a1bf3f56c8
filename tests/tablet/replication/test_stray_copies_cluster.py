"""A replica moved off a tablet server while it was down (its ``removed`` push never arrived): once it
restarts and takes its first push, its stray copy is deleted, and nothing else of it (tablet/stray_copies.py).
A coordinator and three tablet servers in this process, a real ZooKeeper, real RocksDB, gRPC on loopback."""

from __future__ import annotations

import os

import pytest

from client.table import TableClient
from tests.support.procs import wait_until
from tests.tablet.replication.test_replicated_buckets import (FAST, SCHEMA, bucket_state, crash, server_by_id,
                                                              three_servers, wait_in_sync)

pytestmark = pytest.mark.zk

#: A bucket left with one in-sync replica cannot hand its leadership over: the servers stop without waiting.
CONFIG = {**FAST, "tablet.controlled-shutdown.timeout": "1s"}


def test_a_copy_moved_off_while_its_server_was_down_is_deleted_when_it_returns(make_config, tmp_path):
    with three_servers(make_config, tmp_path, CONFIG) as c:
        moved = c.admin.create_table("db.moved", SCHEMA, ["id"], 1, replication_factor=2, min_insync_replicas=1)
        kept = c.admin.create_table("db.kept", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=1)
        before = wait_in_sync(c, moved.table_id, members=2)
        wait_in_sync(c, kept.table_id, members=3)
        for name in ("db.moved", "db.kept"):
            with TableClient(c.admin, name, retry_total_s=30) as client:
                client.upsert([{"id": i, "v": f"v{i}"} for i in range(10)])
        x_id = next(r for r in before.replicas if r != before.leader_id)
        x = server_by_id(c, x_id)
        moved_dir = x.replicas.bucket_dir(moved.table_id, 0)
        kept_dir = x.replicas.bucket_dir(kept.table_id, 0)
        for store in (x.replicas.replica(moved.table_id, 0).store, x.replicas.replica(kept.table_id, 0).store):
            wait_until(lambda: store.high_watermark == 10, 15, f"server {x_id} to apply the writes")
        held_marker = os.path.join(x.config["tablet.data-dir"], "held", f"{moved.table_id}-0")
        wait_until(lambda: os.path.exists(held_marker), 15, "the keeper to mark the bucket held")
        assert os.path.isdir(moved_dir)
        crash(c, x)

        new = next(s for s in (1, 2, 3) if s not in before.replicas)
        c.admin.reassign_bucket("db.moved", 0, [before.leader_id, new])
        wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
        assert sorted(bucket_state(c, moved.table_id).replicas) == sorted([before.leader_id, new])
        assert os.path.isdir(moved_dir)  # the server was down: nobody told it

        back = c.tablet(x_id, tmp_path / f"t{x_id}")
        wait_until(lambda: not os.path.exists(moved_dir) and not os.path.exists(held_marker), 20,
                   "the returning server to delete its stray copy and forget it")
        assert os.path.isdir(kept_dir)  # a bucket it still holds, of another table, is untouched
        wait_in_sync(c, kept.table_id, members=3)
        store = back.replicas.replica(kept.table_id, 0).store
        wait_until(lambda: store.high_watermark == 10, 15, "the kept bucket to serve its rows again")
        assert [r.table.table_id for r in back.replicas.all_replicas()] == [kept.table_id]
