"""One-replica (RF 1) buckets moved on real servers (``kvlease bucket reassign`` / ``cluster decommission``): a
coordinator and three tablet servers in this process, a real ZooKeeper, real RocksDB, gRPC on loopback and
file:// remote storage. The bucket gets a second replica for the move (both replicas replicated), the new one
rebuilds from the remote snapshot (or fetches the log from 0 without one), then it is the only replica again:
every acknowledged write is on it, the old server deletes its copy, and its next snapshot commits."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_reassign import Writer
from tests.tablet.replication.test_rebuild import RETENTION, rows_of, snapshot_and_retain, write
from tests.tablet.replication.test_replicated_buckets import SCHEMA, bucket_state, crash, server_by_id, three_servers

pytestmark = pytest.mark.zk

EARLIER = 1_000_000  # the ids written before a move (the writer under the move counts from 0)


@pytest.fixture
def cluster(make_config, tmp_path):
    with three_servers(make_config, tmp_path, RETENTION) as c:
        yield c


def leader_of(c, table_id, bucket=0):
    state = wait_until(lambda: bucket_state(c, table_id, bucket).leader_address and bucket_state(c, table_id, bucket),
                       15, "a leader")
    return server_by_id(c, state.leader_id)


def move_under_writes(c, path: str, table_id: int, target: int) -> Writer:
    """Reassign bucket 0 of ``path`` to ``target`` while an idempotent writer writes; its writer once the move
    completed and more writes were acknowledged after it."""
    with TableClient(c.admin, path, retry_total_s=30) as client:
        writer = Writer(client)
        writer.start()
        try:
            wait_until(lambda: len(writer.acked) >= 30 or writer.error, 15, "writes before the move")
            move = c.admin.reassign_bucket(path, 0, [target])
            assert move["target"] == [target] and move["state"] in ("moving", "done")
            assert c.admin.reassign_bucket(path, 0, [target])["target"] == [target]  # resent: the same move
            wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
            acked_at_move = len(writer.acked)
            wait_until(lambda: len(writer.acked) >= acked_at_move + 20 or writer.error, 15, "writes after the move")
        finally:
            writer.stop.set()
            writer.join(30)
    assert writer.error is None, writer.error
    return writer


def assert_moved(c, path: str, table_id: int, old, target: int, writer: Writer, earlier: range) -> None:
    after = bucket_state(c, table_id)
    assert list(after.replicas) == [target] and after.leader_id == target and after.reassign_target is None
    replica = server_by_id(c, target).replicas.replica(table_id, 0)
    assert not replica.replicated and replica.leads  # one replica again
    with TableClient(c.admin, path, retry_total_s=30) as client:
        found = client.lookup([{"id": i} for i in sorted(writer.acked)] + [{"id": EARLIER + i} for i in earlier])
    assert all(row is not None for row in found)
    assert len(rows_of(replica.store)) >= len(writer.acked) + len(earlier)
    gone_dir = old.replicas.bucket_dir(table_id, 0)
    wait_until(lambda: not os.path.exists(gone_dir), 15, "the old server to delete its copy")
    assert all(r.table.table_id != table_id for r in old.replicas.all_replicas())


def test_a_one_replica_bucket_with_a_snapshot_moves_under_writes(cluster):
    c = cluster
    table = c.admin.create_table("db.single", SCHEMA, ["id"], 1, replication_factor=1)
    old = leader_of(c, table.table_id)
    with TableClient(c.admin, "db.single", retry_total_s=30) as client:
        write(client, EARLIER, 100, "a")
        handle = snapshot_and_retain(old, table.table_id)
        assert old.replicas.replica(table.table_id, 0).store.list_offsets()[0] > 0  # the log head is gone
        write(client, EARLIER + 100, 40, "b")  # the tail after the snapshot
    target = next(s for s in (1, 2, 3) if s != old.server_id)
    writer = move_under_writes(c, "db.single", table.table_id, target)
    assert_moved(c, "db.single", table.table_id, old, target, writer, range(140))
    new = server_by_id(c, target)
    assert new.fetchers.rebuilder.rebuilt == 1  # from the remote snapshot: the old log did not reach back to 0
    after = snapshot_and_retain(new, table.table_id)  # its changelog retention and snapshots go on
    assert after.snapshot_id > handle.snapshot_id and after.log_offset > handle.log_offset
    with TableClient(c.admin, "db.single", retry_total_s=30) as client:
        write(client, EARLIER + 200, 20, "c")
    snapshot_and_retain(new, table.table_id)  # the snapshot it was rebuilt from is no longer kept
    assert new.replicas.replica(table.table_id, 0).store.list_offsets()[0] > handle.log_offset


def test_a_one_replica_bucket_without_a_snapshot_is_copied_from_the_log(cluster):
    c = cluster
    table = c.admin.create_table("db.fresh", SCHEMA, ["id"], 1, replication_factor=1)
    old = leader_of(c, table.table_id)
    with TableClient(c.admin, "db.fresh", retry_total_s=30) as client:
        write(client, EARLIER, 20, "a")
    target = next(s for s in (1, 2, 3) if s != old.server_id)
    writer = move_under_writes(c, "db.fresh", table.table_id, target)
    assert_moved(c, "db.fresh", table.table_id, old, target, writer, range(20))
    new = server_by_id(c, target)
    assert new.fetchers.rebuilder.rebuilt == 0
    assert new.replicas.replica(table.table_id, 0).store.list_offsets()[0] == 0  # fetched from offset 0
    assert snapshot_and_retain(new, table.table_id).snapshot_id >= 1


def test_decommission_moves_one_replica_and_replicated_buckets_off_a_server(cluster):
    c = cluster
    one = c.admin.create_table("db.one", SCHEMA, ["id"], 3, replication_factor=1)
    two = c.admin.create_table("db.two", SCHEMA, ["id"], 2, replication_factor=2, min_insync_replicas=1)
    for path in ("db.one", "db.two"):
        with TableClient(c.admin, path, retry_total_s=30) as client:
            write(client, 0, 60, path)
    held = {s: [(t.table_id, b) for t in (one, two) for b, a in c.admin.get_table_assignment(t.table_id)[1].items()
                if s in a.replicas] for s in (1, 2, 3)}
    server = next(s for s in (1, 2, 3) if any(t == one.table_id for t, _b in held[s])
                  and any(t == two.table_id for t, _b in held[s]))
    moves = c.admin.decommission_tablet(server)
    assert sorted((m["table"], m["bucket"]) for m in moves) == sorted(
        ("db.one" if t == one.table_id else "db.two", b) for t, b in held[server])
    wait_until(lambda: not c.admin.list_reassignments(), 30, "the moves to complete")
    assert c.admin.decommission_tablet(server) == []
    for table in (one, two):
        assert all(server not in a.replicas for a in c.admin.get_table_assignment(table.table_id)[1].values())
    gone = server_by_id(c, server)
    wait_until(lambda: not any(os.path.exists(gone.replicas.bucket_dir(t, b)) for t, b in held[server]), 15,
               "the server to delete its copies")
    assert not gone.replicas.all_replicas()
    for path in ("db.one", "db.two"):
        with TableClient(c.admin, path, retry_total_s=30) as client:
            assert all(row is not None for row in client.lookup([{"id": i} for i in range(60)]))


def test_the_old_leader_lost_before_the_new_replica_caught_up_takes_the_bucket_offline_until_it_returns(
        cluster, tmp_path):
    c = cluster
    table = c.admin.create_table("db.waits", SCHEMA, ["id"], 1, replication_factor=1)
    old = leader_of(c, table.table_id)
    with TableClient(c.admin, "db.waits", retry_total_s=30) as client:
        write(client, EARLIER, 60, "a")
    snapshot_and_retain(old, table.table_id)  # the new replica has to rebuild from it
    target = next(s for s in (1, 2, 3) if s != old.server_id)
    rebuilder = server_by_id(c, target).fetchers.rebuilder
    gate, rebuild = threading.Event(), rebuilder.rebuild

    def held_rebuild(*args, **kwargs):  # the new replica cannot catch up until the gate opens
        gate.wait(30)
        return rebuild(*args, **kwargs)

    rebuilder.rebuild = held_rebuild
    try:
        c.admin.reassign_bucket("db.waits", 0, [target])
        crash(c, old)
        offline = wait_until(lambda: (s := bucket_state(c, table.table_id)).leader_id == -1 and s, 15,
                             "the bucket to go offline")
        assert list(offline.isr) == [old.server_id] and list(offline.reassign_target) == [target]  # the copy waits
        with TableClient(c.admin, "db.waits", retry_total_s=1) as client:
            with pytest.raises(errors.LeaderNotAvailableError):
                client.lookup([{"id": EARLIER}])
        back = c.tablet(old.server_id, tmp_path / f"t{old.server_id}")
        wait_until(lambda: bucket_state(c, table.table_id).leader_id == old.server_id, 15, "the old leader back")
    finally:
        gate.set()
    wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
    after = bucket_state(c, table.table_id)
    assert list(after.replicas) == [target] and after.leader_id == target
    with TableClient(c.admin, "db.waits", retry_total_s=30) as client:
        assert all(row is not None for row in client.lookup([{"id": EARLIER + i} for i in range(60)]))
    wait_until(lambda: not os.path.exists(back.replicas.bucket_dir(table.table_id, 0)), 15,
               "the old server to delete its copy")


def test_the_old_leaders_disk_lost_mid_move_takes_the_bucket_offline_until_restored_then_the_move_completes(
        cluster, tmp_path):
    """Replicas (new, old), the old one leading, the new one still rebuilding, and the old one's disk is
    wiped: never served from an empty or partial copy. Offline with the loss reason until `bucket restore
    --accept-data-loss`: the new replica leads the restored snapshot, the move completes onto it, and the
    loss record stays with the bucket."""
    c = cluster
    table = c.admin.create_table("db.wiped", SCHEMA, ["id"], 1, replication_factor=1)
    old = leader_of(c, table.table_id)
    with TableClient(c.admin, "db.wiped", retry_total_s=30) as client:
        write(client, EARLIER, 60, "a")
        snapshot_and_retain(old, table.table_id)  # log offset 60: what a restore brings back
        write(client, EARLIER + 60, 20, "b")  # in no snapshot: lost with the disk
    assert old.log_ends.run_once() == 1
    target = next(s for s in (1, 2, 3) if s != old.server_id)
    rebuilder = server_by_id(c, target).fetchers.rebuilder
    gate, rebuild = threading.Event(), rebuilder.rebuild
    rebuilder.rebuild = lambda *args, **kwargs: (gate.wait(30), rebuild(*args, **kwargs))[1]  # never catches up
    try:
        c.admin.reassign_bucket("db.wiped", 0, [target])
        wait_until(lambda: list(bucket_state(c, table.table_id).replicas) == [target, old.server_id], 15, "phase 1")
        crash(c, old)
        shutil.rmtree(tmp_path / f"t{old.server_id}")
        c.tablet(old.server_id, tmp_path / f"t{old.server_id}")  # a new data dir: its replica's data is lost
        offline = wait_until(lambda: (s := bucket_state(c, table.table_id)).offline_reason and s, 20, "offline")
        assert offline.leader_id == -1 and offline.isr == () and list(offline.reassign_target) == [target]
        assert f"data lost on tablet server {old.server_id}" in offline.offline_reason
        with TableClient(c.admin, "db.wiped", retry_total_s=1) as client:
            with pytest.raises(errors.LeaderNotAvailableError, match="new data dir"):
                client.lookup([{"id": EARLIER}])
        restored = c.admin.restore_bucket("db.wiped", 0, accept_data_loss=True)
        assert (restored["leader"], restored["loss"].from_offset, restored["loss"].lost_offsets()) == (target, 60, 20)
    finally:
        gate.set()
    wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
    after = bucket_state(c, table.table_id)
    assert (list(after.replicas), after.leader_id) == ([target], target)
    assert [loss.kind for loss in after.losses] == ["restore"]  # the move's completion keeps the record
    with TableClient(c.admin, "db.wiped", retry_total_s=30) as client:
        rows = wait_until(lambda: _rows(client, range(EARLIER, EARLIER + 80)), 20, "the restored bucket to serve")
    assert all(row is not None for row in rows[:60]) and rows[60:] == [None] * 20  # the snapshot, not empty
    wait_until(lambda: not os.path.exists(server_by_id(c, old.server_id).replicas.bucket_dir(table.table_id, 0)),
               15, "the old server to delete its copy")


def test_a_copy_that_caught_up_before_the_old_leaders_disk_was_lost_is_kept_by_an_unclean_election(cluster, tmp_path):
    """The same loss after the new replica caught up (its leader's AlterIsr had not added it yet): `bucket
    elect --unclean` lets it lead with what it copied; the move completes once it reported its log end (the
    loss resolved: nothing lost), not before (it would serve at a later epoch without ever reporting it)."""
    c = cluster
    table = c.admin.create_table("db.copied", SCHEMA, ["id"], 1, replication_factor=1)
    old = leader_of(c, table.table_id)
    with TableClient(c.admin, "db.copied", retry_total_s=30) as client:
        write(client, EARLIER, 40, "a")
    assert old.log_ends.run_once() == 1
    old.isr_keeper.stop()  # the new replica catches up but never joins the ISR
    target = next(s for s in (1, 2, 3) if s != old.server_id)
    c.admin.reassign_bucket("db.copied", 0, [target])
    copy = wait_until(lambda: _replica(server_by_id(c, target), table.table_id), 15, "the new replica")
    wait_until(lambda: copy.store.high_watermark == 40, 15, "the new replica to catch up")
    crash(c, old)
    shutil.rmtree(tmp_path / f"t{old.server_id}")
    c.tablet(old.server_id, tmp_path / f"t{old.server_id}")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline for lost data")
    elected = c.admin.elect_leader("db.copied", 0, unclean=True)
    assert elected["leader"] == target and elected["loss"].kind == "unclean"
    wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
    after = bucket_state(c, table.table_id)
    assert (list(after.replicas), after.leader_id) == ([target], target)
    assert after.losses[-1].resolved and after.losses[-1].lost_offsets() == 0  # it reported its log end first
    with TableClient(c.admin, "db.copied", retry_total_s=30) as client:
        assert all(row is not None for row in client.lookup([{"id": EARLIER + i} for i in range(40)]))


def _replica(server, table_id):
    try:
        return server.replicas.replica(table_id, 0)
    except errors.KvLeaseError:
        return None


def _rows(client, ids):
    try:
        return client.lookup([{"id": i} for i in ids])
    except errors.RetriableError:
        return None
