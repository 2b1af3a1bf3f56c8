"""Replicas that still owe a bucket's restore, on real servers (a coordinator and tablet servers in this
process, a real ZooKeeper, real RocksDB, gRPC on loopback): an unclean election never makes one lead (it
would serve its data from before the restore), nor a follower that carried it out and is empty
(coordinator/data_loss_plan.py ``unclean_candidates``); `bucket restore` brings such a bucket back instead; a
replica moved off the bucket no longer owes it (coordinator/assignment.py)."""

from __future__ import annotations

import re
import threading

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors, zkpaths
from kvlease.common.zk import loads
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.tablet.replication.test_data_loss_cluster import _restart_wiped, cluster, two_in_sync  # noqa: F401
from tests.tablet.replication.test_replicated_buckets import SCHEMA, bucket_state, crash, server_by_id

pytestmark = pytest.mark.zk

SNAPSHOT = [{"id": i, "v": f"v{i}"} for i in range(10)]  # the rows of the snapshot at log offset 10


def _stored(c, table_id: int) -> dict:
    return loads(c.coordinator.zk.get(zkpaths.table_assignment(table_id))[0])["buckets"]["0"]


def _rows(client, ids):
    try:
        return client.lookup([{"id": i} for i in ids])
    except errors.RetriableError:
        return None


def _restored_while_the_follower_is_down(c, tmp_path, path: str):
    """Two replicas in sync hold rows 0..9 (a snapshot at log offset 10) and 10..14; the follower stops; the
    leader writes 15..19 alone, loses its disk and the bucket is restored onto it with --accept-data-loss
    (offsets 10..19 lost): the follower, down, owes the restore. ``(table, leader id, follower id, loss)``
    once the leader confirmed it carried the restore out."""
    table, leader, follower = two_in_sync(c, tmp_path, path)
    with TableClient(c.admin, path) as client:
        client.upsert(SNAPSHOT)
        assert server_by_id(c, leader).replicas.snapshot_changed() == 1
        client.upsert([{"id": i, "v": f"w{i}"} for i in range(10, 15)])  # committed: on the follower too
    crash(c, server_by_id(c, follower))
    wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the follower out of the ISR")
    with TableClient(c.admin, path) as client:
        client.upsert([{"id": i, "v": f"x{i}"} for i in range(15, 20)])
    assert server_by_id(c, leader).log_ends.run_once() == 1
    _restart_wiped(c, leader, tmp_path / f"t{leader}")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline for lost data")
    loss = c.admin.restore_bucket(path, 0, accept_data_loss=True)["loss"]
    wait_until(lambda: _stored(c, table.table_id)["losses"][-1]["owed_by"] == [follower], 20,
               "the leader to carry out the restore")
    return table, leader, follower, loss


def test_an_unclean_election_never_makes_a_replica_that_owes_the_restore_lead_and_restore_takes_over(cluster,
                                                                                                        tmp_path,
                                                                                                        monkeypatch):
    c = cluster
    table, leader, follower, loss = _restored_while_the_follower_is_down(c, tmp_path, "db.owing")
    with TableClient(c.admin, "db.owing") as client:
        rows = wait_until(lambda: _rows(client, range(20)), 20, "the restored bucket to serve")
        assert rows == SNAPSHOT + [None] * 10
        client.upsert([{"id": 50, "v": "new"}])  # offset 10 again

    held, taken = threading.Event(), threading.Event()
    held.set()
    settle = ReplicaManager.settle_loss

    def held_off(replicas, replica):  # the follower's keeper does not get to the restore while ``held``
        if replicas.server_id == follower and held.is_set():
            return taken.set()
        return settle(replicas, replica)

    monkeypatch.setattr(ReplicaManager, "settle_loss", held_off)  # (before it starts: its first push owes it)
    c.tablet(follower, tmp_path / f"t{follower}")  # rows 0..14 from before the restore on its disk
    crash(c, server_by_id(c, leader))  # the only in-sync replica: offline, waiting for it
    wait_until(lambda: (s := bucket_state(c, table.table_id)).leader_id == -1 and s.isr == (leader,), 20, "offline")
    assert taken.wait(15)  # the follower took the push: it owes the restore

    at = ("--bootstrap", c.coordinator.address)
    refused = assert_one_line_error(run("bucket", "elect", "db.owing", "--bucket", "0", "--unclean", *at))
    assert re.search(rf"every live replica \[{follower}\] has not carried out the bucket's restore of leader epoch "
                     rf"{loss.leader_epoch} yet.*start its in-sync replica\(s\) \[{leader}\] again.*bucket restore "
                     r"--accept-data-loss", refused)
    named = assert_one_line_error(run("bucket", "elect", "db.owing", "--bucket", "0", "--unclean", "--tablet",
                                      str(follower), *at))
    assert f"tablet server {follower} has not carried out" in named and "bucket restore --accept-data-loss" in named
    state = bucket_state(c, table.table_id)
    assert (state.leader_id, state.losses) == (-1, (loss,))  # nothing accepted, nothing changed

    held.clear()  # it carries the restore out: its data dropped, it holds nothing
    wait_until(lambda: (s := _stored(c, table.table_id)).get("lost") == [follower] and s["losses"][-1]["owed_by"]
               == [], 20, "the follower to confirm the restore")
    with pytest.raises(errors.InvalidRequestError, match=rf"every live replica \[{follower}\] lost its data.*bucket "
                                                         "restore --accept-data-loss"):
        c.admin.elect_leader("db.owing", 0, unclean=True)

    again = c.admin.restore_bucket("db.owing", 0, accept_data_loss=True)  # the latest snapshot, a new record
    assert (again["leader"], again["loss"].leader_epoch > loss.leader_epoch) == (follower, True)
    retried = c.admin.restore_bucket("db.owing", 0, accept_data_loss=True)  # its answer lost: the same record
    assert (retried["leader"], retried["loss"]) == (follower, again["loss"])
    with TableClient(c.admin, "db.owing") as client:
        rows = wait_until(lambda: _rows(client, [*range(20), 50]), 20, "the bucket restored again to serve")
    assert rows == SNAPSHOT + [None] * 11  # never its rows from before the first restore (w10..w14)
    assert len(bucket_state(c, table.table_id).losses) == 2


def test_a_replica_moved_off_a_restored_bucket_no_longer_owes_the_restore(cluster, tmp_path):
    c = cluster
    table, leader, follower, _loss = _restored_while_the_follower_is_down(c, tmp_path, "db.moved")
    c.tablet(3, tmp_path / "t3")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "tablet server 3")
    c.admin.reassign_bucket("db.moved", 0, [leader, 3])  # the follower, still down, is moved off
    stored = wait_until(lambda: (s := _stored(c, table.table_id))["replicas"] == [leader, 3] and s, 30,
                        "the move to complete")
    assert stored["losses"][-1]["owed_by"] == []  # in the write that took it off the replicas
    assert "reassign" not in stored
    with TableClient(c.admin, "db.moved") as client:
        rows = wait_until(lambda: _rows(client, range(15)), 20, "the bucket to serve")
    assert rows == SNAPSHOT + [None] * 5


def test_a_replica_owing_the_restore_follows_a_later_unclean_leader_and_owes_nothing_once_in_sync(cluster,
                                                                                                     tmp_path):
    """Three replicas: the restore leader's follower rebuilt; the third, down, owes the restore. The leader
    dies while its follower lags: an unclean election makes the follower lead (the third, owing it, is never
    chosen). The third returns with its rows from before the restore: it follows the new leader, drops them
    (truncated where the logs diverge) and, once in the ISR, owes nothing; leading, it serves the new rows."""
    c = cluster
    for server_id in (1, 2, 3):
        c.tablet(server_id, tmp_path / f"t{server_id}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 3, 15, "three tablet servers")
    table = c.admin.create_table("db.later", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=1)
    state = wait_until(lambda: len((s := bucket_state(c, table.table_id)).isr) == 3 and s, 20, "in sync")
    leader = state.leader_id
    rebuilt, owing = [r for r in state.replicas if r != leader]
    with TableClient(c.admin, "db.later") as client:
        client.upsert(SNAPSHOT)
        assert server_by_id(c, leader).replicas.snapshot_changed() == 1
        client.upsert([{"id": i, "v": f"w{i}"} for i in range(10, 15)])  # on every replica: lost by the restore
    for server_id in (rebuilt, owing):
        crash(c, server_by_id(c, server_id))
    wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the others out of the ISR")
    _restart_wiped(c, leader, tmp_path / f"t{leader}")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline for lost data")
    c.tablet(rebuilt, tmp_path / f"t{rebuilt}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "two tablet servers")
    c.admin.restore_bucket("db.later", 0, accept_data_loss=True, tablet=leader)
    wait_until(lambda: set(bucket_state(c, table.table_id).isr) == {leader, rebuilt}, 30, "the follower rebuilt")
    assert _stored(c, table.table_id)["losses"][-1]["owed_by"] == [owing]
    with TableClient(c.admin, "db.later") as client:
        client.upsert([{"id": i, "v": f"n{i}"} for i in range(10, 13)])  # offsets 10..12 again
    crash(c, server_by_id(c, rebuilt))
    wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the follower out of the ISR")
    crash(c, server_by_id(c, leader))
    c.tablet(rebuilt, tmp_path / f"t{rebuilt}")
    wait_until(lambda: [s.id for s in c.admin.list_tablet_servers()] == [rebuilt], 20, "only the follower live")
    assert c.admin.elect_leader("db.later", 0, unclean=True)["leader"] == rebuilt

    c.tablet(owing, tmp_path / f"t{owing}")  # rows 0..14 from before the restore on its disk
    wait_until(lambda: owing in bucket_state(c, table.table_id).isr, 30, "the owing replica in the ISR")
    assert _stored(c, table.table_id)["losses"][0]["owed_by"] == []  # in the write that added it to the ISR
    crash(c, server_by_id(c, rebuilt))
    wait_until(lambda: bucket_state(c, table.table_id).leader_id == owing, 20, "a clean election of it")
    with TableClient(c.admin, "db.later") as client:
        rows = wait_until(lambda: _rows(client, range(15)), 20, "the bucket to serve")
    assert rows == SNAPSHOT + [{"id": i, "v": f"n{i}"} for i in range(10, 13)] + [None] * 2  # never w10..w14
