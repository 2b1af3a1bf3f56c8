"""A zombie leader's snapshot after an unclean election is refused and its upload deleted (CommitKvSnapshot's
leader epoch, coordinator/snapshot_checks.py ``check_epoch``). A coordinator and three tablet servers in this
process, a real ZooKeeper, real RocksDB, gRPC on loopback, file:// remote storage. The old leader is made a
zombie by hand: its ZooKeeper node is deleted (the coordinator takes it for gone) and it refuses every push
(it never hears it was deposed), so it goes on leading and snapshotting."""

from __future__ import annotations

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors, zkpaths
from kvlease.tablet.store.snapshot import upload_of
from kvlease.ops.wait import wait_until
from tests.support.snapshot_manifests import storage_of
from tests.tablet.replication.test_replicated_buckets import (FAST, SCHEMA, bucket_state, server_by_id, three_servers,
                                                              wait_in_sync)

pytestmark = pytest.mark.zk

CONFIG = {**FAST, "tablet.controlled-shutdown.timeout": "1s"}


def test_a_zombie_leaders_snapshot_of_the_lost_history_is_refused_and_deleted(make_config, tmp_path):
    with three_servers(make_config, tmp_path, CONFIG) as c:
        table = c.admin.create_table("db.zombie", SCHEMA, ["id"], 1, replication_factor=2, min_insync_replicas=1)
        before = wait_in_sync(c, table.table_id, members=2)
        old = server_by_id(c, before.leader_id)
        new = server_by_id(c, next(r for r in before.replicas if r != before.leader_id))
        with TableClient(c.admin, "db.zombie", retry_total_s=30) as client:
            client.upsert([{"id": i, "v": "both"} for i in range(5)])
            wait_until(lambda: new.replicas.replica(table.table_id, 0).store.high_watermark == 5, 15,
                       "the follower to apply")
            leading = old.replicas.replica(table.table_id, 0)
            first = old.replicas.snapshot(leading, force=True)  # of the history both have: kept throughout
            new.fetchers.stop()  # it falls behind: the leader drops it from the ISR (replica.max-lag 2 s)
            client.upsert([{"id": i, "v": "only on the old leader"} for i in range(5, 10)])
        assert bucket_state(c, table.table_id).isr == (old.server_id,)

        def deaf(*_args, **_kwargs):
            raise errors.NetworkError("this zombie hears no push")

        old.replicas.update_leadership = deaf
        old.zk.delete(zkpaths.tablet_server(old.server_id))  # taken for gone: the bucket is offline
        wait_until(lambda: bucket_state(c, table.table_id).leader_id == -1, 15, "the bucket to go offline")
        new.fetchers.resume()
        c.admin.elect_leader("db.zombie", 0, unclean=True)
        wait_until(lambda: (s := bucket_state(c, table.table_id)).losses and s.losses[-1].resolved, 15,
                   "the unclean leader to report its log end")
        with TableClient(c.admin, "db.zombie", retry_total_s=30) as client:  # its end passes the zombie's
            client.upsert([{"id": i, "v": "new history"} for i in range(100, 120)])

        zombie = old.replicas.replica(table.table_id, 0)
        assert zombie.leads and zombie.store.high_watermark == 10  # it still believes it leads
        snapshot_id = zombie.next_snapshot_id
        with pytest.raises(errors.FencedLeaderEpochError, match="holds a history the bucket no longer has"):
            old.replicas.snapshot(zombie, force=True)
        kept = [s.handle.snapshot_id for s in c.admin.list_kv_snapshots(table.table_id)]
        assert snapshot_id not in kept and first.snapshot_id in kept
        storage = storage_of(c.make_config(c.overrides))
        assert storage.list(f"kv/{table.table_id}/0/snap-{snapshot_id}") == []  # its upload is deleted
        assert all(storage.exists(path) for path in first.file_paths())  # the kept one's files stay (shared SSTs)
        assert not [p for p in storage.list(f"kv/{table.table_id}/0/shared")  # nor any SST it alone uploaded
                    if (upload_of(p) or (None,))[0] == snapshot_id]
