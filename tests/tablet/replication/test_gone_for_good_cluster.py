"""A one-replica bucket whose tablet server is gone for good, on real servers (a coordinator and tablet servers in
this process, a real ZooKeeper, real RocksDB, gRPC on loopback): decommission refuses and names the way out,
`bucket restore --accept-data-loss --tablet N` brings the latest snapshot back on another server with the loss
recorded, and the old server started again (same data dir) deletes its copy instead of serving it."""

from __future__ import annotations

import json
import os
import re
import threading

import pytest
from kazoo.exceptions import KazooException

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import errors, zkpaths
from kvlease.coordinator.server import CoordinatorServer
from kvlease.tablet.replicas import lost_data
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.tablet.replication.test_data_loss_cluster import SETTINGS, cluster, one_replica_with_tail  # noqa: F401
from tests.tablet.replication.test_replicated_buckets import SCHEMA, bucket_state, crash, server_by_id
from tests.tablet.replication.test_stray_copies_cluster import _expire_session

pytestmark = pytest.mark.zk



def _rows(client, count: int):
    try:
        return client.lookup([{"id": i} for i in range(count)])
    except errors.RetriableError:
        return None


def test_bucket_of_a_server_gone_for_good_is_restored_elsewhere_and_the_old_copy_never_returns(cluster, tmp_path):
    c = cluster
    gone = c.tablet(1, tmp_path / "t1")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 1, 15, "tablet server 1")
    table = one_replica_with_tail(c, gone, "db.gone")  # offsets 10..14: in no snapshot
    assert gone.log_ends.run_once() == 1
    old_copy = gone.replicas.bucket_dir(table.table_id, 0)
    c.tablet(2, tmp_path / "t2")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "tablet server 2")
    crash(c, gone)  # and it is not started again until the bucket lives elsewhere
    wait_until(lambda: [s.id for s in c.admin.list_tablet_servers()] == [2], 20, "server 1 to leave")
    assert bucket_state(c, table.table_id).leader_address == ""  # its leader 1 is not live: not served
    assert os.path.isdir(old_copy)

    at = ("--bootstrap", c.coordinator.address)
    refused = assert_one_line_error(run("cluster", "decommission", "--tablet", "1", *at))
    assert "bucket restore db.gone --bucket 0 --accept-data-loss --tablet N" in refused
    asked = assert_one_line_error(run("bucket", "restore", "db.gone", "--bucket", "0", "--tablet", "2", *at))
    assert re.search(r"none of its replicas \[1\] is live\. Restoring it onto tablet server 2 .*loses 5 changelog "
                     r"offsets \(10\.\.14\).*--accept-data-loss", asked)
    assert bucket_state(c, table.table_id).replicas == (1,)  # asking changed nothing
    answer = run("bucket", "restore", "db.gone", "--bucket", "0", "--accept-data-loss", "--tablet", "2", "--json", *at)
    assert answer.exit_code == 0, answer.output
    restored = json.loads(answer.stdout)
    assert (restored["leader"], restored["replicas"], restored["loss"]["lost_offsets"]) == (2, [2], 5)
    retried = c.admin.restore_bucket("db.gone", 0, accept_data_loss=True)  # its answer lost: the same record
    assert (retried["leader"], retried["loss"].leader_epoch) == (2, restored["loss"]["leader_epoch"])

    with TableClient(c.admin, "db.gone") as client:
        rows = wait_until(lambda: _rows(client, 15), 20, "the restored bucket to serve on server 2")
        assert rows == [{"id": i, "v": f"v{i}"} for i in range(10)] + [None] * 5
        client.upsert([{"id": 99, "v": "new"}])
        assert client.list_offsets()[0][1] == 11  # offset 10 is reused by a new change

    back = c.tablet(1, tmp_path / "t1")  # the same data dir, still holding the old copy
    wait_until(lambda: not os.path.exists(old_copy), 20, "the returning server to delete its stray copy")
    assert back.replicas.all_replicas() == []
    with pytest.raises(errors.NotLeaderError):
        back.replicas.replica(table.table_id, 0)
    state = bucket_state(c, table.table_id)
    assert (state.leader_id, state.replicas, len(state.losses)) == (2, (2,), 1)
    with TableClient(c.admin, "db.gone") as client:
        rows = client.lookup([{"id": i} for i in (0, 12, 99)])
        assert rows == [{"id": 0, "v": "v0"}, None, {"id": 99, "v": "new"}]


def test_replicated_bucket_all_of_whose_servers_are_gone_is_restored_with_its_replication_factor(cluster, tmp_path):
    c = cluster
    for server_id in (1, 2):
        c.tablet(server_id, tmp_path / f"t{server_id}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "tablet servers 1 and 2")
    table = c.admin.create_table("db.both", SCHEMA, ["id"], 1, replication_factor=2, min_insync_replicas=1)
    wait_until(lambda: len(bucket_state(c, table.table_id).isr) == 2, 20, "both replicas in sync")
    leader = server_by_id(c, bucket_state(c, table.table_id).leader_id)
    with TableClient(c.admin, "db.both") as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(6)])
        assert leader.replicas.snapshot_changed() == 1  # snapshot at log offset 6
        client.upsert([{"id": i, "v": f"w{i}"} for i in range(6, 9)])
    assert leader.log_ends.run_once() == 1
    for server_id in (3, 4):
        c.tablet(server_id, tmp_path / f"t{server_id}")
    for server_id in (1, 2):
        crash(c, server_by_id(c, server_id))
    wait_until(lambda: [s.id for s in c.admin.list_tablet_servers()] == [3, 4], 20, "servers 1 and 2 to leave")

    restored = c.admin.restore_bucket("db.both", 0, accept_data_loss=True)
    assert (restored["leader"], restored["replicas"], restored["loss"].lost_offsets()) == (3, [3, 4], 3)
    state = wait_until(lambda: len((s := bucket_state(c, table.table_id)).isr) == 2 and s, 30,
                       "the new follower to rebuild from the restored leader and join the ISR")
    assert (state.leader_id, state.replicas) == (3, (3, 4))
    with TableClient(c.admin, "db.both") as client:
        rows = wait_until(lambda: _rows(client, 9), 20, "the restored bucket to serve")
        assert rows == [{"id": i, "v": f"v{i}"} for i in range(6)] + [None] * 3
        client.upsert([{"id": 50, "v": "new"}])
    follower = server_by_id(c, 4).replicas.replica(table.table_id, 0).store
    wait_until(lambda: follower.high_watermark == 7, 15, "the follower to apply the new change")
    node = json.loads(c.coordinator.zk.get(zkpaths.table_assignment(table.table_id))[0])
    assert node["buckets"]["0"]["losses"][-1]["owed_by"] == []  # each replica confirmed it before serving/fetching


def test_a_restore_not_carried_out_when_a_failover_raises_the_epoch_is_still_carried_out(cluster, make_config,
                                                                                           tmp_path):
    """The new coordinator's first push raises a one-replica bucket's leader epoch past the restore's (its
    server registered again while no coordinator was active); the restoring server had not run the restore
    yet: it still installs the snapshot instead of serving empty."""
    c = cluster
    gone = c.tablet(1, tmp_path / "t1")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 1, 15, "tablet server 1")
    table = c.admin.create_table("db.failover", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "db.failover") as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(4)])
        assert gone.replicas.snapshot_changed() == 1
    target = c.tablet(2, tmp_path / "t2")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "tablet server 2")
    crash(c, gone)
    wait_until(lambda: [s.id for s in c.admin.list_tablet_servers()] == [2], 20, "server 1 to leave")

    go = threading.Event()
    settle = target.replicas.settle_loss
    target.replicas.settle_loss = lambda replica: (go.wait(30), settle(replica))  # the keeper waits
    try:
        loss = c.admin.restore_bucket("db.failover", 0, accept_data_loss=True)["loss"]
        replica = wait_until(lambda: _replica(target, table.table_id), 15, "the restore's push")
        assert replica.loss_work == lost_data.RESTORE

        c.coordinator.stop()  # while no coordinator is active the server re-registers in a new session: the
        _expire_session(target)  # next coordinator sees it restarted and raises its one-replica bucket's epoch
        wait_until(lambda: _registered(target), 20, "it registered again")
        standby = CoordinatorServer(make_config(SETTINGS)).start()
        c.coordinator = standby
        assert standby.wait_active(20)
        c.admin.close()
        c.admin = AdminClient([standby.address], retry_total_s=15)
        wait_until(lambda: (r := _replica(target, table.table_id)) and r.role.leader_epoch > loss.leader_epoch, 20,
                   "the new coordinator's push of a higher leader epoch")
        assert _replica(target, table.table_id).loss_work == lost_data.RESTORE  # still to be carried out
    finally:
        go.set()
    with TableClient(c.admin, "db.failover") as client:
        rows = wait_until(lambda: _rows(client, 4), 20, "the restored bucket to serve")
        assert rows == [{"id": i, "v": f"v{i}"} for i in range(4)]


def _registered(server) -> bool:
    try:
        return server.zk.exists(zkpaths.tablet_server(server.server_id)) is not None
    except KazooException:  # its session is being replaced
        return False


def _replica(server, table_id):
    try:
        return server.replicas.replica(table_id, 0)
    except errors.KvLeaseError:
        return None
