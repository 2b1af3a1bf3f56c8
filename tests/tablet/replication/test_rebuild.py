"""Rebuilding a follower from the bucket's remote snapshot (docs/bucket-store.md, "Replication";
docs/architecture.md, "Losing and moving replicas"): a coordinator and three tablet servers in this process,
a real ZooKeeper, real RocksDB, gRPC on loopback and file:// remote storage. The leader's log head is removed by a snapshot and changelog retention
while a follower is down; the follower comes back with a wiped data dir, stale data, or damaged files; a
rebuilt follower promoted to leader still knows the idempotent writers' batches its snapshot holds."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time

import grpc
import pytest

from kvlease.client.table import TableClient
from kvlease.client.transport import Channels
from kvlease.common.arrow_ipc import batch_to_ipc
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.tablet.replication.rebuild_progress import progress
from kvlease.tablet.replication import tail_prefetch
from kvlease.tablet.replication.tail_prefetch import TailPrefetch
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_replicated_buckets import (FAST, SCHEMA, bucket_state, crash, server_by_id,
                                                              three_servers, wait_in_sync)

pytestmark = pytest.mark.zk

RETENTION = {**FAST, "log.segment.bytes": "4kb", "log.retention": "0ms", "kv.snapshot.interval": "1h"}


@pytest.fixture
def cluster(make_config, tmp_path):
    with three_servers(make_config, tmp_path, RETENTION) as c:
        yield c


def write(client, start: int, count: int, tag: str) -> None:
    for i in range(start, start + count, 10):
        client.upsert([{"id": j, "v": f"{tag}-{j}-" + "x" * 60} for j in range(i, i + 10)])


def rows_of(store) -> dict[bytes, bytes]:
    with store.snapshot() as snapshot:
        return dict(store.iter_rows(snapshot))


def snapshot_and_retain(leader, table_id: int):
    """A snapshot of bucket 0 on its leader, then its changelog retention: returns the snapshot's handle."""
    replica = leader.replicas.replica(table_id, 0)
    handle = leader.replicas.snapshot(replica, force=True)
    assert handle is not None
    return handle


def lose_follower(c, table_id: int):
    """Crash a follower of bucket 0: returns (its id, the leader server)."""
    state = wait_in_sync(c, table_id)
    follower = server_by_id(c, next(r for r in state.replicas if r != state.leader_id))
    crash(c, follower)
    wait_until(lambda: len(bucket_state(c, table_id).isr) == 2, 20, "the ISR to shrink")
    return follower.server_id, server_by_id(c, state.leader_id)


def come_back_wiped(c, tmp_path, server_id: int, table_id: int, wipe: bool = True):
    if wipe:
        shutil.rmtree(tmp_path / f"t{server_id}")
    back = c.tablet(server_id, tmp_path / f"t{server_id}")
    wait_in_sync(c, table_id)
    return back, back.replicas.replica(table_id, 0).store


@pytest.mark.parametrize("wipe", [True, False], ids=["wiped", "stale"])
def test_a_follower_behind_the_leaders_log_start_is_rebuilt_from_the_snapshot(cluster, tmp_path, wipe):
    """Wiped: no local data; stale: its data ends below the leader's log start."""
    c = cluster
    table = c.admin.create_table("db.rebuild", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
    with TableClient(c.admin, "db.rebuild", retry_total_s=30) as client:
        wait_in_sync(c, table.table_id)
        write(client, 0, 100, "a")
        server_id, leader = lose_follower(c, table.table_id)
        write(client, 50, 150, "b")
        handle = snapshot_and_retain(leader, table.table_id)
        leader_store = leader.replicas.replica(table.table_id, 0).store
        log_start, _ = leader_store.list_offsets()
        assert 0 < log_start <= handle.log_offset  # the log head is gone: fetching from 0 cannot work
        write(client, 180, 60, "c")  # the tail after the snapshot
        client.delete([{"id": 3}])
        back, store = come_back_wiped(c, tmp_path, server_id, table.table_id, wipe)
        end = leader_store.high_watermark
        wait_until(lambda: store.high_watermark >= end, 20, "the rebuilt follower to catch up")
        assert back.fetchers.rebuilder.rebuilt == 1
        # the tail after the snapshot was fetched while the snapshot downloaded, appended with its install
        assert 0 < back.fetchers.rebuilder.tail_records <= end - handle.log_offset
        done = progress(back.replicas, back.fetchers.rebuilder)
        assert done.rebuilt == 1 and done.bytes_downloaded == sum(f.size for f in handle.files)
        assert not [lease for lease in c.admin.list_leases() if lease.lease_id.startswith("rebuild-")]
        assert store.list_offsets()[0] == handle.log_offset  # its log starts at the snapshot
        assert rows_of(store) == rows_of(leader_store)
        assert len(rows_of(store)) == 239
        client.upsert([{"id": 1000, "v": "after"}])  # it keeps following
        wait_until(lambda: store.high_watermark == leader_store.high_watermark, 10, "the follower to apply")
        assert rows_of(store) == rows_of(leader_store)


@pytest.mark.parametrize("damage", ["none", "missing", "corrupt"])
def test_the_oldest_kept_snapshot_is_used_and_a_damaged_one_skipped_for_a_newer(cluster, tmp_path, caplog, damage):
    """The oldest kept snapshot: the rebuilt replica's log then reaches back as far as its leader's (any kept
    snapshot may be leased and read with its changelog from whichever replica leads next). Corrupt: one byte
    flipped, the size unchanged: only the manifest's CRC-32 tells."""
    c = cluster
    table = c.admin.create_table("db.skip", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
    with TableClient(c.admin, "db.skip", retry_total_s=30) as client:
        wait_in_sync(c, table.table_id)
        server_id, leader = lose_follower(c, table.table_id)
        write(client, 0, 100, "a")
        older = snapshot_and_retain(leader, table.table_id)
        write(client, 100, 100, "b")
        newer = snapshot_and_retain(leader, table.table_id)
        leader_store = leader.replicas.replica(table.table_id, 0).store
        assert 0 < leader_store.list_offsets()[0] <= older.log_offset < newer.log_offset
        private = sorted((f for f in older.files if "/shared/" not in f.path), key=lambda f: -f.size)
        if damage == "missing":
            leader.storage.delete(private[0].path)
        elif damage == "corrupt":
            data = bytearray(leader.storage.read(private[0].path))
            data[len(data) // 2] ^= 0xFF
            leader.storage.put(private[0].path, bytes(data))
        with caplog.at_level(logging.WARNING, logger="kvlease.tablet.replication.rebuild"):
            back, store = come_back_wiped(c, tmp_path, server_id, table.table_id)
            wait_until(lambda: store.high_watermark >= leader_store.high_watermark, 20, "the follower to catch up")
        if damage == "none":
            assert store.list_offsets()[0] == older.log_offset
            assert "cannot be used" not in caplog.text
        else:
            assert store.list_offsets()[0] == newer.log_offset
            assert f"snapshot {older.snapshot_id} (log offset {older.log_offset}) cannot be used" in caplog.text
            assert ("CRC-32" if damage == "corrupt" else "does not exist") in caplog.text
        assert rows_of(store) == rows_of(leader_store)


def test_a_follower_whose_files_are_damaged_is_rebuilt_and_its_files_moved_aside(cluster, tmp_path, caplog):
    c = cluster
    table = c.admin.create_table("db.damaged", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
    with TableClient(c.admin, "db.damaged", retry_total_s=30) as client:
        wait_in_sync(c, table.table_id)
        write(client, 0, 100, "a")
        server_id, leader = lose_follower(c, table.table_id)
        handle = snapshot_and_retain(leader, table.table_id)
        write(client, 100, 50, "b")
        bucket_dir = tmp_path / f"t{server_id}" / str(table.table_id) / "0"
        (bucket_dir / "kv" / "CURRENT").write_text("garbage\n")  # RocksDB: "Corruption: CURRENT file corrupted"
        with caplog.at_level(logging.INFO):
            back, store = come_back_wiped(c, tmp_path, server_id, table.table_id, wipe=False)
        leader_store = leader.replicas.replica(table.table_id, 0).store
        wait_until(lambda: store.high_watermark >= leader_store.high_watermark, 20, "the follower to catch up")
        assert "its local files are damaged" in caplog.text and "(damaged) rebuilt from snapshot" in caplog.text
        assert (bucket_dir / "damaged" / "kv" / "CURRENT").read_text() == "garbage\n"  # kept for inspection
        assert store.list_offsets()[0] == handle.log_offset
        assert rows_of(store) == rows_of(leader_store)


def put_kv(server, table_id: int, rows_batch, writer_id: int, sequence: int) -> pb.PutKvResponse:
    with grpc.insecure_channel(server.address) as channel:
        return pb_grpc.TabletServiceStub(channel).PutKv(pb.PutKvRequest(
            table_id=table_id, bucket=0, upserts=batch_to_ipc(rows_batch), writer_id=writer_id, sequence=sequence),
            timeout=10)


def test_a_rebuilt_follower_promoted_to_leader_answers_a_resent_batch_as_a_duplicate(cluster, tmp_path):
    """The acknowledged batch is below the snapshot: only the manifest's writers carry it to the rebuilt replica."""
    c = cluster
    table = c.admin.create_table("db.resend", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=1)
    with TableClient(c.admin, "db.resend", retry_total_s=30) as client:
        state = wait_in_sync(c, table.table_id)
        leader = server_by_id(c, state.leader_id)
        first = put_kv(leader, table.table_id, client._row_batch([{"id": 500, "v": "original"}]), 77, 0)
        assert first.error.code == 0
        write(client, 0, 50, "a")
        server_id, _ = lose_follower(c, table.table_id)
        handle = snapshot_and_retain(leader, table.table_id)
        assert handle.log_offset > first.base_offset
        back, store = come_back_wiped(c, tmp_path, server_id, table.table_id)
        assert back.fetchers.rebuilder.rebuilt == 1 and store.list_offsets()[0] == handle.log_offset
        other = next(s for s in c.tablets if s.server_id not in (server_id, leader.server_id))
        crash(c, other)
        wait_until(lambda: set(bucket_state(c, table.table_id).isr) == {leader.server_id, server_id}, 20,
                   "the ISR without the third server")
        crash(c, leader)
        wait_until(lambda: bucket_state(c, table.table_id).leader_id == server_id, 20, "the rebuilt replica to lead")
        wait_until(lambda: back.replicas.replica(table.table_id, 0).leads, 10, "the push that makes it lead")
        again = wait_until(lambda: (r := put_kv(back, table.table_id, client._row_batch([{"id": 500, "v": "twice"}]),
                                                77, 0)).error.code == 0 and r, 20, "the new leader to answer")
        assert (again.base_offset, again.next_offset) == (first.base_offset, first.next_offset)
        assert client.lookup([{"id": 500}])[0]["v"] == "original"


def test_a_follower_diverging_below_what_it_applied_is_rebuilt(cluster, tmp_path, caplog):
    """Its epoch checkpoint claims an epoch its leader never had from offset 0: the leader's answer puts the
    divergence at the start of its log, below the records it applied (truncating cannot take them back)."""
    c = cluster
    table = c.admin.create_table("db.diverged", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
    with TableClient(c.admin, "db.diverged", retry_total_s=30) as client:
        wait_in_sync(c, table.table_id)
        write(client, 0, 100, "a")
        server_id, leader = lose_follower(c, table.table_id)
        handle = snapshot_and_retain(leader, table.table_id)
        write(client, 100, 20, "b")
        epochs = tmp_path / f"t{server_id}" / str(table.table_id) / "0" / "leader-epochs.json"
        doc = json.loads(epochs.read_text())
        epochs.write_text(json.dumps({**doc, "epochs": [[50, 0]]}))
        with caplog.at_level(logging.INFO):
            back, store = come_back_wiped(c, tmp_path, server_id, table.table_id, wipe=False)
        leader_store = leader.replicas.replica(table.table_id, 0).store
        wait_until(lambda: store.high_watermark >= leader_store.high_watermark, 20, "the follower to catch up")
        assert "below the" in caplog.text and "(diverged) rebuilt from snapshot" in caplog.text
        assert store.list_offsets()[0] == handle.log_offset
        assert rows_of(store) == rows_of(leader_store)


def test_a_leader_that_becomes_a_follower_keeps_its_data_and_is_not_rebuilt(cluster):
    """A bucket's first leader opened it with no files (a new table): that is no reason to rebuild it from a
    snapshot once it follows (it did, discarding its changelog: seen in the tablet-failover drill)."""
    c = cluster
    table = c.admin.create_table("db.moved", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
    with TableClient(c.admin, "db.moved", retry_total_s=30) as client:
        state = wait_in_sync(c, table.table_id)
        write(client, 0, 50, "a")
        first = server_by_id(c, state.leader_id)
        snapshot_and_retain(first, table.table_id)  # a snapshot a rebuild could take
        other = next(r for r in state.isr if r != state.leader_id)
        c.admin.elect_leader("db.moved", 0, unclean=False, tablet=other)
        wait_until(lambda: not first.replicas.replica(table.table_id, 0).leads, 10, "the push that deposes it")
        write(client, 50, 20, "b")
        wait_in_sync(c, table.table_id)
        store = first.replicas.replica(table.table_id, 0).store
        assert first.fetchers.rebuilder.rebuilt == 0  # its own files and changelog go on
        leader_store = server_by_id(c, other).replicas.replica(table.table_id, 0).store
        wait_until(lambda: store.high_watermark >= leader_store.high_watermark, 10, "the follower to apply")
        assert rows_of(store) == rows_of(leader_store)


def test_the_tail_prefetch_reads_the_leaders_committed_log_byte_for_byte_and_stops_quietly_on_an_error(cluster,
                                                                                                      monkeypatch):
    """What a rebuild appends after its install is exactly the leader's committed log from the snapshot's offset on
    (the fetcher's own bytes); an offset the leader's log no longer holds, or a server that does not lead the
    bucket, ends the prefetch with nothing (the fetcher then fetches the tail itself), not with an error."""
    c = cluster
    table = c.admin.create_table("db.prefetch", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
    with TableClient(c.admin, "db.prefetch", retry_total_s=30) as client:
        state = wait_in_sync(c, table.table_id)
        leader = server_by_id(c, state.leader_id)
        other = server_by_id(c, next(r for r in state.replicas if r != state.leader_id))
        write(client, 0, 100, "a")
        handle = snapshot_and_retain(leader, table.table_id)
        write(client, 100, 50, "b")
        client.delete([{"id": 7}])
        store = leader.replicas.replica(table.table_id, 0).store
        channels = Channels()
        try:
            def prefetch(address: str, offset: int, max_bytes: int = 300):
                tail = TailPrefetch(channels, address, table.table_id, 0, None, offset, max_bytes=max_bytes,
                                    max_total_bytes=1 << 30, stop=threading.Event()).start()
                wait_until(lambda: tail.next_offset >= store.high_watermark or not tail._thread.is_alive(), 10,
                           "the prefetch to catch up")
                return tail.finish()

            entries, hw = prefetch(leader.address, handle.log_offset)
            assert hw == store.high_watermark and len(entries) > 2  # many calls of 300 bytes
            assert entries == store.fetch_log(handle.log_offset, 1 << 30)[0]  # committed, byte for byte
            log_start, _ = store.list_offsets()
            assert log_start > 0  # retention removed the log's head
            assert prefetch(leader.address, log_start - 1) == ([], 0)  # below the leader's log start
            assert prefetch(other.address, handle.log_offset) == ([], 0)  # not the leader
            # caught up, it long-polls: rows committed meanwhile come at once, and finish() cancels the poll in
            # flight instead of waiting for its end
            monkeypatch.setattr(tail_prefetch, "IDLE_WAIT_MS", 20_000)
            tail = TailPrefetch(channels, leader.address, table.table_id, 0, None, handle.log_offset,
                                max_bytes=1 << 20, max_total_bytes=1 << 30, stop=threading.Event()).start()
            wait_until(lambda: tail.next_offset >= store.high_watermark, 10, "the prefetch to catch up")
            write(client, 300, 5, "d")
            wait_until(lambda: tail.next_offset >= store.high_watermark, 10, "the long poll to bring the new rows")
            started = time.monotonic()
            entries, _hw = tail.finish()
            assert time.monotonic() - started < 5  # not the long poll's 20 s
            assert entries == store.fetch_log(handle.log_offset, 1 << 30)[0]
        finally:
            channels.close()
