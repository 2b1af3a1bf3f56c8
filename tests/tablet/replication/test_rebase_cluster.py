"""Followers re-base their RocksDB on the latest remote snapshot (tablet/replication/rebase.py; docs/snapshots.md,
"Incremental after a failover"): a coordinator and three tablet servers in this process, a real ZooKeeper, real
RocksDB, gRPC on loopback and file:// remote storage (the first case on the local moto S3 server too). After a
leader's kill the new leader's first snapshot uploads about the data changed since the last snapshot, not the table;
its readers see exactly the leader's rows; a follower killed in the middle of a re-base comes back with the same rows
and log; a re-base whose snapshot lost a file changes nothing."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil

import pytest

from kvlease.client.snapshot_read import read_snapshot
from kvlease.client.table import TableClient
from kvlease.common import errors, kvsnapshot
from kvlease.ops.wait import wait_until
from kvlease.tablet.store import kv_rebase
from tests.tablet.replication.test_replicated_buckets import (FAST, SCHEMA, bucket_state, crash, server_by_id,
                                                              three_servers, wait_in_sync)

pytestmark = pytest.mark.zk

ROWS = 30_000
CHANGED = 600
DELETED = 60
PRIVATE_BYTES = 32 << 10  # a snapshot's private files (OPTIONS-*, MANIFEST-*, CURRENT, ...) and its manifest


def write(client, ids, tag: str) -> None:
    ids = list(ids)
    for i in range(0, len(ids), 1000):
        client.upsert([{"id": j, "v": f"{tag}-{secrets.token_hex(32)}"} for j in ids[i:i + 1000]])


def rows_of(store) -> dict[bytes, bytes]:
    with store.snapshot() as snapshot:
        return dict(store.iter_rows(snapshot))


def snapshot_rows(storage, handle, target) -> dict[bytes, bytes]:
    """The rows a snapshot reader (Spark's bootstrap, a restore) sees: the snapshot downloaded and opened."""
    kvsnapshot.download(storage, handle, str(target))
    db = kvsnapshot.open_read_only(str(target))
    try:
        return {bytes(k): bytes(v) for k, v in db.items()}
    finally:
        db.close()


def changed_bytes(old: dict[bytes, bytes], new: dict[bytes, bytes]) -> int:
    """The bytes of the rows written or deleted between two states (keys and values; a deleted row's key)."""
    return (sum(len(k) + len(v) for k, v in new.items() if old.get(k) != v)
            + sum(len(k) for k in old.keys() - new.keys()))


def followers(c, table_id):
    state = wait_in_sync(c, table_id)
    return server_by_id(c, state.leader_id), [server_by_id(c, r) for r in state.replicas if r != state.leader_id]


@contextlib.contextmanager
def rf3_table(c, path: str, min_insync: int = 2):
    """A new one-bucket table of replication factor 3, a client of it, its leader and its two followers."""
    table = c.admin.create_table(path, SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=min_insync)
    with TableClient(c.admin, path, retry_total_s=60) as client:
        leader, others = followers(c, table.table_id)
        yield table, client, leader, others


def wait_rebased(servers, table_id: int, snapshot_id: int) -> None:
    for server in servers:
        replica = server.replicas.replica(table_id, 0)
        wait_until(lambda: server.fetchers.rebaser.based_on(replica) == snapshot_id, 30,
                   f"server {server.server_id} to re-base on snapshot {snapshot_id}")


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def any_remote(request, make_config):
    """``make_config`` on ``file://``, or on the local moto S3 server."""
    if request.param == "file":
        return make_config
    s3 = request.getfixturevalue("s3_overrides")
    return lambda overrides=None, /, **more: make_config({**s3, **(overrides or {})}, **more)


def test_the_first_snapshot_after_a_failover_uploads_about_the_changed_data(any_remote, tmp_path):
    config = {**FAST, "kv.snapshot.interval": "1h", "replica.rebase.interval": "200ms"}
    with three_servers(any_remote, tmp_path, config) as c:
        with rf3_table(c, "db.rebase") as (table, client, leader, others):
            write(client, range(ROWS), "a")
            first = leader.replicas.snapshot(leader.replicas.replica(table.table_id, 0), force=True)
            full = sum(f.size for f in first.files)
            wait_rebased(others, table.table_id, first.snapshot_id)
            for server in others:
                last = server.fetchers.rebaser.last
                assert last is not None and last.snapshot_id == first.snapshot_id
                assert last.downloaded_bytes + last.linked_bytes == full
            assert not c.admin.list_leases()  # a re-base takes no lease
            old = rows_of(leader.replicas.replica(table.table_id, 0).store)
            write(client, range(0, ROWS, ROWS // CHANGED), "b")
            client.delete([{"id": i} for i in range(1, DELETED * 7, 7)])
            before = rows_of(leader.replicas.replica(table.table_id, 0).store)
            changed = changed_bytes(old, before)
            assert 0 < changed < full / 20
            wait_in_sync(c, table.table_id)
            crash(c, leader)
            wait_until(lambda: bucket_state(c, table.table_id).leader_id in {s.server_id for s in others}, 20,
                       "a new leader")
            new = server_by_id(c, bucket_state(c, table.table_id).leader_id)
            replica = new.replicas.replica(table.table_id, 0)
            wait_until(lambda: replica.leads, 10, "the push that makes it lead")
            second = wait_until(lambda: _snapshot(new, replica), 20, "the new leader's first snapshot")
            stats = replica.uploader.last_stats
            assert stats.snapshot_id == second.snapshot_id
            assert stats.new_shared_bytes <= 2 * changed, (stats, changed, full)
            assert stats.uploaded_bytes <= 2 * changed + PRIVATE_BYTES, (stats, changed, full)
            assert stats.uploaded_bytes < full / 10
            assert rows_of(replica.store) == before
            assert snapshot_rows(new.storage, second, tmp_path / "read") == before
            assert len(before) == ROWS - DELETED
            table_rows = read_snapshot(c.admin, second).to_pylist()  # client/snapshot_read.py
            assert len(table_rows) == ROWS - DELETED and {r["id"] for r in table_rows} == (
                set(range(ROWS)) - set(range(1, DELETED * 7, 7)))
            assert table_rows == sorted(table_rows, key=lambda r: r["id"])
            probe = [3, 8, 50, ROWS - 1, ROWS + 5, 1, 7 * (DELETED - 1) + 1]  # present, changed, absent, deleted
            by_id = {r["id"]: r for r in table_rows}
            assert client.lookup([{"id": i} for i in probe]) == [by_id.get(i) for i in probe]


def _snapshot(server, replica):
    try:
        return server.replicas.snapshot(replica, force=True)
    except Exception:  # not serving yet (its leader lease wait)
        return None


@pytest.mark.parametrize("point", ["before-intent", "mid-swap"])
def test_a_follower_killed_during_a_rebase_comes_back_with_its_rows_and_log(make_config, tmp_path, monkeypatch,
                                                                            point):
    config = {**FAST, "kv.snapshot.interval": "1h", "replica.rebase.interval": "1h"}  # re-based by the test
    with three_servers(make_config, tmp_path, config) as c:
        with rf3_table(c, "db.crash") as (table, client, leader, (follower, _)):
            write(client, range(3000), "a")
            handle = leader.replicas.snapshot(leader.replicas.replica(table.table_id, 0), force=True)
            write(client, range(0, 3000, 10), "b")
            leader_store = leader.replicas.replica(table.table_id, 0).store
            wait_in_sync(c, table.table_id)
            store = follower.replicas.replica(table.table_id, 0).store
            wait_until(lambda: store.high_watermark == leader_store.high_watermark, 10, "the follower to apply")
            offsets = store.list_offsets()
            if point == "before-intent":
                monkeypatch.setattr(kv_rebase, "write_durably", _killed)
            else:
                real = os.rename
                monkeypatch.setattr(kv_rebase.os, "rename", lambda a, b: (real(a, b), _killed())
                                    if b.endswith(f"{kv_rebase.OLD}/kv") else real(a, b))
            rebaser, replica = follower.fetchers.rebaser, follower.replicas.replica(table.table_id, 0)
            with pytest.raises(OSError, match="killed"):
                rebaser.consider(replica, handle.snapshot_id, force=True)
            monkeypatch.undo()
            crash(c, follower)
            bucket_dir = tmp_path / f"t{follower.server_id}" / str(table.table_id) / "0"
            back = c.tablet(follower.server_id, tmp_path / f"t{follower.server_id}")
            wait_in_sync(c, table.table_id)
            store = back.replicas.replica(table.table_id, 0).store
            wait_until(lambda: store.high_watermark == leader_store.high_watermark, 20, "the follower to catch up")
            assert store.list_offsets() == offsets  # its log is the same
            assert rows_of(store) == rows_of(leader_store)
            assert not {kv_rebase.INTENT, kv_rebase.STAGED, kv_rebase.OLD} & set(os.listdir(bucket_dir))
            replica = back.replicas.replica(table.table_id, 0)
            stats = back.fetchers.rebaser.consider(replica, handle.snapshot_id, force=True)
            assert stats is not None or point == "mid-swap"  # mid-swap: it finished on the snapshot already
            assert rows_of(store) == rows_of(leader_store)
            assert not (bucket_dir / "rebase-download").exists()


def _killed(*_args, **_kwargs):
    raise OSError("killed")


def test_a_rebuilt_follower_that_leads_next_uploads_only_what_changed_without_a_rebase(make_config, tmp_path):
    """A rebuild installs the snapshot's own files, so with re-bases off (`0ms`) a follower rebuilt from the latest
    snapshot already keeps the new leader's first snapshot incremental (docs/snapshots.md)."""
    config = {**FAST, "kv.snapshot.interval": "1h", "replica.rebase.interval": "0ms"}
    with three_servers(make_config, tmp_path, config) as c:
        with rf3_table(c, "db.rebuilt", min_insync=1) as (table, client, leader, (wiped, other)):
            assert wiped.fetchers.rebaser is None
            write(client, range(10_000), "a")
            crash(c, wiped)
            first = leader.replicas.snapshot(leader.replicas.replica(table.table_id, 0), force=True)
            old = rows_of(leader.replicas.replica(table.table_id, 0).store)
            write(client, range(0, 10_000, 50), "b")
            expected = rows_of(leader.replicas.replica(table.table_id, 0).store)
            shutil.rmtree(tmp_path / f"t{wiped.server_id}")
            back = c.tablet(wiped.server_id, tmp_path / f"t{wiped.server_id}")
            wait_in_sync(c, table.table_id)
            assert back.fetchers.rebuilder.rebuilt == 1
            crash(c, other)
            wait_until(lambda: set(bucket_state(c, table.table_id).isr) == {leader.server_id, back.server_id}, 20,
                       "the ISR without the third server")
            crash(c, leader)
            wait_until(lambda: bucket_state(c, table.table_id).leader_id == back.server_id, 20,
                       "the rebuilt one to lead")
            replica = back.replicas.replica(table.table_id, 0)
            wait_until(lambda: replica.leads, 10, "the push that makes it lead")
            second = wait_until(lambda: _snapshot(back, replica), 20, "the new leader's first snapshot")
            stats = replica.uploader.last_stats
            assert stats.snapshot_id == second.snapshot_id
            assert stats.uploaded_bytes <= 2 * changed_bytes(old, expected) + PRIVATE_BYTES, (stats, first)
            assert snapshot_rows(back.storage, second, tmp_path / "read") == expected


def test_a_rebase_whose_snapshot_lost_a_file_leaves_rocksdb_as_it_was_and_the_next_snapshot_rebases(
        make_config, tmp_path):
    config = {**FAST, "kv.snapshot.interval": "1h", "replica.rebase.interval": "1h"}  # re-based by the test
    with three_servers(make_config, tmp_path, config) as c:
        with rf3_table(c, "db.lost") as (table, client, leader, (follower, _)):
            write(client, range(3000), "a")
            leader_replica = leader.replicas.replica(table.table_id, 0)
            first = leader.replicas.snapshot(leader_replica, force=True)
            shared = sorted((f for f in first.files if "/shared/" in f.path), key=lambda f: -f.size)
            leader.storage.delete(shared[0].path)  # behind the cluster's back
            write(client, range(0, 3000, 7), "b")
            wait_in_sync(c, table.table_id)
            replica = follower.replicas.replica(table.table_id, 0)
            wait_until(lambda: replica.store.high_watermark == leader_replica.store.high_watermark, 10, "the apply")
            kv = tmp_path / f"t{follower.server_id}" / str(table.table_id) / "0" / "kv"
            own = {p.name for p in kv.iterdir()}
            with pytest.raises(errors.StorageError):
                follower.fetchers.rebaser.consider(replica, first.snapshot_id, force=True)
            assert {p.name for p in kv.iterdir()} == own  # its RocksDB was not touched
            assert rows_of(replica.store) == rows_of(leader_replica.store)
            second = leader.replicas.snapshot(leader_replica, force=True)  # uploads the lost file again
            stats = follower.fetchers.rebaser.consider(replica, second.snapshot_id, force=True)
            assert stats is not None and stats.snapshot_id == second.snapshot_id
            ssts = {f.path.rsplit("/", 1)[-1].split("-")[0] + ".sst" for f in second.files if "/shared/" in f.path}
            assert ssts <= {p.name for p in kv.iterdir()}
            write(client, range(0, 3000, 11), "c")
            wait_until(lambda: replica.store.high_watermark == leader_replica.store.high_watermark, 10, "the apply")
            assert rows_of(replica.store) == rows_of(leader_replica.store)
