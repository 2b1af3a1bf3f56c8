"""A restore is owed by every replica of the restored bucket until that replica carried it out, whatever
epochs pass and whether its server restarts in between; one carried out is never repeated
(tablet/replicas/lost_data.py, coordinator/data_loss_plan.py ``restore_confirmed``). A coordinator and tablet servers in
this process, a real ZooKeeper, real RocksDB, gRPC on loopback."""

from __future__ import annotations

import json
import os
import threading

import pytest

from kvlease.client.server_calls import ServerCalls
from kvlease.client.table import TableClient
from kvlease.common import errors, zkpaths
from kvlease.tablet.replicas import lost_data
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_data_loss_cluster import (SETTINGS, _restart_wiped, cluster,  # noqa: F401
                                                             one_replica_with_tail)
from tests.tablet.replication.test_replicated_buckets import bucket_state, crash, server_by_id

pytestmark = pytest.mark.zk

RESTORED = [{"id": i, "v": f"v{i}"} for i in range(10)] + [None] * 5  # the snapshot's rows; 10..14 were lost


def _rows(client, count: int = 15):
    try:
        return client.lookup([{"id": i} for i in range(count)])
    except errors.RetriableError:
        return None


def _replica(server, table_id):
    try:
        return server.replicas.replica(table_id, 0)
    except errors.KvLeaseError:
        return None


def _stored_loss(c, table_id) -> tuple[dict, int]:
    """The bucket's latest loss as the coordinator stored it in ZooKeeper, and the node's version."""
    data, stat = c.coordinator.zk.get(zkpaths.table_assignment(table_id))
    return json.loads(data)["buckets"]["0"]["losses"][-1], stat.version


def test_a_restore_its_server_took_but_had_not_started_when_it_crashed_is_carried_out_after_the_restart(cluster,
                                                                                                        tmp_path):
    """The server takes the restore's push and crashes before it wrote its restore marker: it comes back to
    a push of a higher leader epoch (its re-registration), no marker and nothing pending, and must still
    restore instead of serving its local state (here: the empty bucket of its wiped disk)."""
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, "db.owed")  # snapshot at offset 10, offsets 10..14 in none
    assert server.log_ends.run_once() == 1
    _restart_wiped(c, 1, tmp_path / "t1")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline")

    wiped = server_by_id(c, 1)
    taken = threading.Event()
    wiped.replicas.settle_loss = lambda replica: taken.set()  # the keeper never gets to the restore
    loss = c.admin.restore_bucket("db.owed", 0, accept_data_loss=True)["loss"]
    wait_until(lambda: (r := _replica(wiped, table.table_id)) and r.loss_work == lost_data.RESTORE, 15,
               "the restore's push")
    assert taken.wait(15)
    marker = os.path.join(wiped.replicas.bucket_dir(table.table_id, 0), lost_data.RESTORE_FILE)
    assert not os.path.exists(marker)  # nothing of the restore is on disk yet
    assert _stored_loss(c, table.table_id)[0]["owed_by"] == [1]
    crash(c, wiped)

    back = c.tablet(1, tmp_path / "t1")  # the same data dir: the same data dir id, no marker
    with TableClient(c.admin, "db.owed") as client:
        rows = wait_until(lambda: _rows(client), 20, "the bucket to serve again")
        assert rows == RESTORED  # restored, not served empty
    assert back.replicas.replica(table.table_id, 0).role.leader_epoch > loss.leader_epoch  # the push it took
    stored, version = wait_until(lambda: (s := _stored_loss(c, table.table_id))[0]["owed_by"] == [] and s, 15,
                                 "the restore's confirmation")

    resent = ServerCalls(c.admin.caller.call)  # as tablet server 1 sends it
    resent.confirm_restore(1, table.table_id, 0, loss.leader_epoch)  # a resent confirmation changes nothing
    assert _stored_loss(c, table.table_id) == (stored, version)

    with TableClient(c.admin, "db.owed") as client:  # never restored again: new writes survive a restart
        client.upsert([{"id": 99, "v": "after"}])
    crash(c, back)
    c.tablet(1, tmp_path / "t1")
    with TableClient(c.admin, "db.owed") as client:
        rows = wait_until(lambda: _rows(client, 100), 20, "the bucket to serve after the second restart")
        assert rows[:15] == RESTORED and rows[99] == {"id": 99, "v": "after"}
