"""A replica moved off a tablet server while it was down, or cut off from ZooKeeper (its ``removed`` push
never arrived): once it restarts, or registers again in a new session, and takes its first push, its stray
copy is deleted, and nothing else of it (tablet/replicas/stray_copies.py). A coordinator and three tablet servers in
this process, a real ZooKeeper, real RocksDB, gRPC on loopback."""

from __future__ import annotations

import os
import threading

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_replicated_buckets import (FAST, SCHEMA, bucket_state, crash, server_by_id,
                                                              three_servers, wait_in_sync)

pytestmark = pytest.mark.zk

#: A bucket left with one in-sync replica cannot hand its leadership over: the servers stop without waiting.
CONFIG = {**FAST, "tablet.controlled-shutdown.timeout": "1s"}


def two_tables_and_a_follower(c):
    """``db.moved`` (RF 2) and ``db.kept`` (RF 3), 10 rows each; the follower ``x`` of db.moved's bucket:
    ``(moved, kept, state of db.moved, x's id, x, x's bucket dir of db.moved)``."""
    moved = c.admin.create_table("db.moved", SCHEMA, ["id"], 1, replication_factor=2, min_insync_replicas=1)
    kept = c.admin.create_table("db.kept", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=1)
    before = wait_in_sync(c, moved.table_id, members=2)
    wait_in_sync(c, kept.table_id, members=3)
    for name in ("db.moved", "db.kept"):
        with TableClient(c.admin, name, retry_total_s=30) as client:
            client.upsert([{"id": i, "v": f"v{i}"} for i in range(10)])
    x_id = next(r for r in before.replicas if r != before.leader_id)
    x = server_by_id(c, x_id)
    return moved, kept, before, x_id, x, x.replicas.bucket_dir(moved.table_id, 0)


def test_a_copy_moved_off_while_its_server_was_down_is_deleted_when_it_returns(make_config, tmp_path):
    with three_servers(make_config, tmp_path, CONFIG) as c:
        moved, kept, before, x_id, x, moved_dir = two_tables_and_a_follower(c)
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


def _expire_session(server) -> None:
    """End ``server``'s ZooKeeper session as the ensemble does when it is cut off too long: another client
    on the same session id closes it (its ephemeral registration goes; the server sees LOST)."""
    lost = threading.Event()
    server.zk.add_listener(lambda state: state == KazooState.LOST and lost.set())
    twin = KazooClient(hosts=server.config["zookeeper.address"], client_id=server.zk.client_id, timeout=10)
    twin.start(timeout=10)
    twin.stop()
    twin.close()
    assert lost.wait(10), "the session did not expire"


def test_a_copy_moved_off_while_its_server_was_cut_off_from_zookeeper_is_deleted_once_it_registers_again(
        make_config, tmp_path):
    """No restart: the server lost its session, the bucket moved off it meanwhile; the first push after it
    registered again (a new session) removes the stray copy."""
    with three_servers(make_config, tmp_path, CONFIG) as c:
        moved, kept, before, x_id, x, moved_dir = two_tables_and_a_follower(c)
        held_marker = os.path.join(x.config["tablet.data-dir"], "held", f"{moved.table_id}-0")
        wait_until(lambda: os.path.exists(held_marker), 15, "the keeper to mark the bucket held")

        cut_off = threading.Event()
        register = x._register
        def blocked() -> None:  # noqa: E306 -- ZooKeeper unreachable: it cannot register until the cut ends
            if cut_off.is_set():
                raise errors.NetworkError("cut off from ZooKeeper (test)")
            register()
        x._register = blocked
        cut_off.set()
        _expire_session(x)
        wait_until(lambda: x_id not in [s.id for s in c.admin.list_tablet_servers()], 15, "the server to leave")

        new = next(s for s in (1, 2, 3) if s not in before.replicas)
        c.admin.reassign_bucket("db.moved", 0, [before.leader_id, new])
        wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
        assert os.path.isdir(moved_dir)  # the server was cut off: nobody told it

        cut_off.clear()  # it registers again, in a new session, and takes the push that follows
        wait_until(lambda: x_id in [s.id for s in c.admin.list_tablet_servers()], 15, "the server to register again")
        wait_until(lambda: not os.path.exists(moved_dir) and not os.path.exists(held_marker), 20,
                   "the server to delete its stray copy and forget it")
        wait_in_sync(c, kept.table_id, members=3)  # what it still holds is untouched and in sync again
        assert [r.table.table_id for r in x.replicas.all_replicas()] == [kept.table_id]
