"""A replica's data found lost by its own tablet server (tablet/replicas/loss.py), on real servers: a coordinator
and tablet servers in this process, a real ZooKeeper, real RocksDB and gRPC on loopback. A leader whose files are
damaged at open reports it: another in-sync replica leads with every acknowledged write, or (one replica) the
bucket is offline naming the reason until `bucket restore`; a bucket dir gone is the same."""

from __future__ import annotations

import os
import shutil

import pytest

from kvlease.client.server_calls import ServerCalls
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_data_loss_cluster import (  # noqa: F401  (cluster: the fixture)
    _lookup_error, _served, cluster, one_replica_with_tail, two_in_sync)
from tests.tablet.replication.test_replicated_buckets import SCHEMA, bucket_state, crash, server_by_id

pytestmark = pytest.mark.zk




def _corrupt_rocksdb(bucket_dir) -> None:
    with open(os.path.join(bucket_dir, "kv", "CURRENT"), "w") as fh:
        fh.write("garbage")  # RocksDB: "Corruption: CURRENT file does not end with newline"


def _replaced(files, swap) -> bool:
    try:
        files.replace(swap)
        return True
    except errors.KvLeaseError:  # a follower's fetch uses the files right now
        return False


def test_a_leader_whose_files_are_damaged_at_open_hands_over_to_an_in_sync_replica(cluster, tmp_path):
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, "db.rep")
    with TableClient(c.admin, "db.rep") as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(20)])  # acknowledged: on both replicas
    damaged = server_by_id(c, leader)
    replica = damaged.replicas.replica(table.table_id, 0)
    bucket_dir = replica.store.dir
    # its files close and are damaged on disk; the next use (a follower's fetch, the keeper) opens them
    wait_until(lambda: _replaced(replica.store.files, lambda: _corrupt_rocksdb(bucket_dir)), 10, "the files closed")

    moved = wait_until(lambda: (s := bucket_state(c, table.table_id)).leader_id == follower and s, 20,
                       "the in-sync follower to lead")
    assert moved.isr == (follower,) and moved.offline_reason == ""
    with TableClient(c.admin, "db.rep") as client:
        rows = wait_until(lambda: _served(client), 20, "the new leader to serve")
        assert rows[:15] == [{"id": i, "v": f"v{i}"} for i in range(15)]  # no acknowledged write lost
        client.upsert([{"id": 100, "v": "after"}])
    # out of the ISR, its damaged files are moved aside; the replica rebuilds and rejoins the ISR
    wait_until(lambda: os.path.exists(os.path.join(bucket_dir, "damaged", "kv", "CURRENT")), 10, "moved aside")
    wait_until(lambda: len(bucket_state(c, table.table_id).isr) == 2, 30, "the lost replica back in sync")
    assert damaged.replicas.replica(table.table_id, 0).loss_work is None


def test_a_one_replica_bucket_with_damaged_files_is_offline_with_the_reason_until_restored(cluster, tmp_path):
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, "db.one", tail=3)
    bucket_dir = server.replicas.bucket_dir(table.table_id, 0)
    crash(c, server)
    _corrupt_rocksdb(bucket_dir)
    server = c.tablet(1, tmp_path / "t1")

    offline = wait_until(lambda: (s := bucket_state(c, table.table_id)).offline_reason and s, 20, "offline")
    assert offline.leader_id == -1 and "files are damaged" in offline.offline_reason
    assert "Corruption" in offline.offline_reason and "no other replica" in offline.offline_reason
    error = wait_until(lambda: isinstance(e := _lookup_error(server.address, table.table_id),
                                          errors.LeaderNotAvailableError) and e, 10, "the offline push")
    assert "files are damaged" in error.message
    with TableClient(c.admin, "db.one", retry_total_s=0.5) as client:
        with pytest.raises(errors.LeaderNotAvailableError, match="files are damaged"):
            client.lookup([{"id": 1}])
    damaged_current = os.path.join(bucket_dir, "damaged", "kv", "CURRENT")
    wait_until(lambda: os.path.exists(damaged_current), 10, "the damaged files moved aside once offline")
    resent = ServerCalls(c.admin.caller.call)  # as tablet server 1 sends it
    resent.report_replica_loss(1, table.table_id, 0, "resent after a lost answer")  # idempotent
    assert bucket_state(c, table.table_id) == offline

    loss = c.admin.restore_bucket("db.one", 0, accept_data_loss=True)["loss"]
    assert (loss.kind, loss.from_offset, loss.snapshot_id) == ("restore", 10, 1)
    with TableClient(c.admin, "db.one") as client:
        rows = wait_until(lambda: _served(client), 20, "the restored bucket to serve")
        assert rows[:13] == [{"id": i, "v": f"v{i}"} for i in range(10)] + [None] * 3
    assert open(damaged_current).read() == "garbage"  # the restore kept them for inspection


def test_a_bucket_dir_gone_from_a_data_dir_that_held_it_is_a_lost_replica(cluster, tmp_path):
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.gone", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "db.gone") as client:
        client.upsert([{"id": 1, "v": "a"}])
    bucket_dir = server.replicas.bucket_dir(table.table_id, 0)
    wait_until(lambda: os.path.exists(tmp_path / "t1" / "held" / f"{table.table_id}-0"), 10, "recorded as held")
    crash(c, server)
    shutil.rmtree(bucket_dir)
    c.tablet(1, tmp_path / "t1")  # the same data dir (its id): only this bucket is gone
    offline = wait_until(lambda: (s := bucket_state(c, table.table_id)).offline_reason and s, 20, "offline")
    assert offline.leader_id == -1 and "bucket directory" in offline.offline_reason and "is gone" in offline.offline_reason
    with TableClient(c.admin, "db.gone", retry_total_s=0.5) as client:  # never served empty
        with pytest.raises(errors.LeaderNotAvailableError, match="is gone"):
            client.lookup([{"id": 1}])


def test_snapshots_of_a_lost_history_are_dropped_after_an_unclean_election(cluster, tmp_path):
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, "db.hist")
    tb = TableBucket(table.table_id, 0)
    with TableClient(c.admin, "db.hist") as client:
        client.upsert([{"id": i, "v": "a"} for i in range(8)])  # offsets 0..7, on both replicas
    assert server_by_id(c, leader).replicas.snapshot_changed() == 1  # snapshot 1 at log offset 8
    crash(c, server_by_id(c, follower))
    wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the follower out of the ISR")
    with TableClient(c.admin, "db.hist") as client:
        client.upsert([{"id": i, "v": "b"} for i in range(8, 12)])  # offsets 8..11: only on the leader
    storage = server_by_id(c, leader).replicas.storage
    assert server_by_id(c, leader).replicas.snapshot_changed() == 1  # snapshot 2 at log offset 12
    lost = max((i.handle for i in c.admin.list_kv_snapshots(table.table_id)), key=lambda h: h.snapshot_id)
    assert (lost.snapshot_id, lost.log_offset) == (2, 12)
    assert not c.admin.acquire_lease("reader", {tb: 2}, 60_000).unavailable  # a reader reads snapshot 2
    crash(c, server_by_id(c, leader))
    wait_until(lambda: bucket_state(c, table.table_id).leader_id == -1, 20, "offline")
    c.tablet(follower, tmp_path / f"t{follower}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 1, 15, "the follower back")

    elected = c.admin.elect_leader("db.hist", 0, unclean=True, tablet=follower)
    assert elected["loss"].newest_snapshot_id == 2
    done = wait_until(lambda: (s := bucket_state(c, table.table_id)).losses[-1].resolved and s, 20, "the takeover")
    assert done.losses[-1].from_offset == 8
    # snapshot 2 holds offsets the new leader reuses: no longer kept; its lease still reads its files
    assert [i.handle.snapshot_id for i in c.admin.list_kv_snapshots(table.table_id)] == [1]
    assert c.admin.get_latest_kv_snapshots(table.table_id)[tb].handle.snapshot_id == 1
    assert storage.exists(lost.metadata_path)
    assert c.admin.acquire_lease("other", {tb: 2}, 60_000).unavailable == {tb: 2}  # not leased anew

    # the old leader comes back with a wiped disk: rebuilt from snapshot 1, not from the lost snapshot 2
    shutil.rmtree(tmp_path / f"t{leader}")
    rebuilt = c.tablet(leader, tmp_path / f"t{leader}")
    wait_until(lambda: len(bucket_state(c, table.table_id).isr) == 2, 30, "the rebuilt replica in sync")
    assert rebuilt.fetchers.rebuilder.rebuilt == 1
    c.admin.elect_leader("db.hist", 0, unclean=False, tablet=leader)  # the rebuilt replica leads: its data
    with TableClient(c.admin, "db.hist") as client:
        rows = wait_until(lambda: _served(client), 20, "the rebuilt replica to serve")
        assert [r and r["v"] for r in rows[:12]] == ["a"] * 8 + [None] * 4
        client.upsert([{"id": 50, "v": "c"}])
    assert rebuilt.replicas.snapshot_changed() == 1  # a new snapshot commits, with an id never used before
    assert [i.handle.snapshot_id for i in c.admin.list_kv_snapshots(table.table_id)] == [1, 3]

    c.admin.drop_lease("reader")  # the last lease of snapshot 2 ends: its files go
    wait_until(lambda: not storage.exists(lost.metadata_path), 10, "the lost snapshot's files deleted")
