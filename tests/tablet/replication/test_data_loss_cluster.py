"""Lost data on real servers: a coordinator and tablet servers in this process, a real ZooKeeper, real
RocksDB and gRPC on loopback. A wiped disk is never served empty; restore and unclean election bring a
bucket back with the loss recorded; a reader past a lost range fails with DATA_LOST."""

from __future__ import annotations

import json
import re
import shutil

import grpc
import pytest

from kvlease.client.lost_ranges import LostRanges
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pbg
from kvlease.common.wire import table_to_pb
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.tablet.replication.test_replicated_buckets import FAST, SCHEMA, bucket_state, crash, server_by_id
from tests.tablet.test_tablet_server import Cluster

pytestmark = pytest.mark.zk

SETTINGS = {**FAST, "kv.snapshot.interval": "1h"}  # snapshots and log-end reports: called by the test


@pytest.fixture
def cluster(make_config, tmp_path):  # tmp_path outlives the servers whose data dirs it holds
    c = Cluster(make_config, SETTINGS)
    try:
        yield c
    finally:
        c.close()


def one_replica_with_tail(c, server, path: str, tail: int = 5):
    """A one-replica table of one bucket on ``server``: rows 0..9 in its snapshot at log offset 10, then
    ``tail`` more rows (offsets 10.., in no snapshot). Its TableInfo."""
    table = c.admin.create_table(path, SCHEMA, ["id"], 1)
    with TableClient(c.admin, path) as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(10)])
        assert server.replicas.snapshot_changed() == 1  # snapshot at log offset 10
        client.upsert([{"id": i, "v": f"w{i}"} for i in range(10, 10 + tail)])
    return table


def lose_and_restore(c, tmp_path, table, new_ids, server_id: int = 1) -> None:
    """Tablet server ``server_id`` loses its disk (crashed, its data dir wiped, started again): the bucket is
    offline until restored with --accept-data-loss; then rows ``new_ids`` are written to the restored log
    (they take offsets the lost history had)."""
    _restart_wiped(c, server_id, tmp_path / f"t{server_id}")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline")
    c.admin.restore_bucket(table.path, 0, accept_data_loss=True)
    with TableClient(c.admin, table.path) as client:
        wait_until(lambda: _served(client), 20, "the restored bucket to serve")
        client.upsert([{"id": i, "v": "new"} for i in new_ids])


def _lookup_error(address: str, table_id: int) -> errors.KvLeaseError | None:
    with grpc.insecure_channel(address) as channel:
        response = pbg.TabletServiceStub(channel).ListOffsets(
            pb.ListOffsetsRequest(table_id=table_id, buckets=[0]), timeout=5)
    error = response.offsets[0].error
    return errors.error_for(error.code, error.message) if error.code else None


def _restart_wiped(c, server_id: int, data_dir) -> None:
    crash(c, server_by_id(c, server_id))
    shutil.rmtree(data_dir)
    c.tablet(server_id, data_dir)


def test_one_replica_bucket_with_a_wiped_disk_stays_offline_until_restored(cluster, tmp_path):
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, "db.one")  # offsets 10..14: in no snapshot
    assert server.log_ends.run_once() == 1
    seen = LostRanges(c.admin, table.table_id, table.path).check({0: 15}, {})  # a reader that read 0..14

    old_dir = server.dir_id
    _restart_wiped(c, 1, tmp_path / "t1")
    state = wait_until(lambda: (s := bucket_state(c, table.table_id)).offline_reason and s, 20, "offline")
    assert state.leader_id == -1 and "tablet server 1" in state.offline_reason and "new data dir" in state.offline_reason
    # a push queued for the old data dir (sent before the coordinator saw the new one) is refused
    stale = pb.UpdateLeadershipRequest(coordinator_epoch=c.coordinator.epoch, server_id=1, dir_id=old_dir,
                                       buckets=[pb.BucketLeadershipPb(table=table_to_pb(table), bucket=0,
                                                                      leader_epoch=1)])
    with grpc.insecure_channel(server_by_id(c, 1).address) as channel:
        answer = pbg.TabletServiceStub(channel).UpdateLeadership(stale, timeout=5)
    assert answer.error.code == errors.ErrorCode.INVALID_REQUEST and "data dir" in answer.error.message
    error = wait_until(lambda: isinstance(e := _lookup_error(server_by_id(c, 1).address, table.table_id),
                                          errors.LeaderNotAvailableError) and e, 10, "the push")
    assert "new data dir" in error.message  # told it holds the bucket, offline: never served empty
    with TableClient(c.admin, "db.one", retry_total_s=0.5) as client:
        with pytest.raises(errors.LeaderNotAvailableError, match="new data dir"):
            client.lookup([{"id": 1}])

    at = ("--bootstrap", c.coordinator.address)
    refused = assert_one_line_error(run("bucket", "restore", "db.one", "--bucket", "0", *at))
    assert re.search(r"loses 5 changelog offsets \(10\.\.14\).*--accept-data-loss", refused)
    restored = run("bucket", "restore", "db.one", "--bucket", "0", "--accept-data-loss", *at)
    assert restored.exit_code == 0, restored.output
    assert "restored from snapshot" in restored.output and "5 changelog offsets lost (10..14)" in restored.output
    first = c.admin.restore_bucket("db.one", 0, accept_data_loss=True)  # a retry answers the same record
    loss = first["loss"]
    assert (loss.kind, loss.from_offset, loss.last_known_end, loss.lost_offsets()) == ("restore", 10, 15, 5)

    with TableClient(c.admin, "db.one") as client:
        rows = wait_until(lambda: _served(client), 20, "the restored bucket to serve")
        assert rows == [{"id": i, "v": f"v{i}"} for i in range(10)] + [None] * 5
        client.upsert([{"id": 99, "v": "new"}])
        assert client.list_offsets()[0][1] == 11  # offset 10 is reused by a new change
    described = bucket_state(c, table.table_id)
    assert described.losses == (loss,) and described.offline_reason == ""
    doc = json.loads(run("table", "describe", "db.one", "--json", *at).stdout)
    assert [x["lost_offsets"] for x in doc["assignment"][0]["losses"]] == [5]
    assert "data losses" in run("table", "describe", "db.one", *at).output

    with pytest.raises(errors.DataLostError, match=r"offsets 10\.\.14 this query read were lost .* snapshot"):
        LostRanges(c.admin, table.table_id, table.path).check({0: 15}, seen)
    assert LostRanges(c.admin, table.table_id, table.path).check({0: 10}, seen) == {0: 1}  # adopted
    assert c.coordinator.metrics.data_losses.labels("restore")._value.get() == 1


def two_in_sync(c, tmp_path, path: str):
    """Tablet servers 1 and 2 and a one-bucket table of replication factor 2 on them, in sync:
    ``(table, leader id, follower id)``."""
    for server_id in (1, 2):
        c.tablet(server_id, tmp_path / f"t{server_id}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "two tablet servers")
    table = c.admin.create_table(path, SCHEMA, ["id"], 1, replication_factor=2)
    state = wait_until(lambda: len((s := bucket_state(c, table.table_id)).isr) == 2 and s, 20, "in sync")
    return table, state.leader_id, next(r for r in state.replicas if r != state.leader_id)


def _served(client):
    try:
        return client.lookup([{"id": i} for i in range(15)])
    except errors.RetriableError:
        return None


def test_wiped_last_isr_replica_is_not_elected_and_unclean_election_records_the_loss(cluster, tmp_path):
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, "db.two")
    with TableClient(c.admin, "db.two") as client:
        client.upsert([{"id": i, "v": "a"} for i in range(8)])
    # the follower falls out of the ISR (it is gone), the leader writes on alone, then loses its disk
    crash(c, server_by_id(c, follower))
    wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the follower out of the ISR")
    with TableClient(c.admin, "db.two") as client:
        client.upsert([{"id": i, "v": "b"} for i in range(8, 12)])
    server_by_id(c, leader).log_ends.run_once()
    _restart_wiped(c, leader, tmp_path / f"t{leader}")
    offline = wait_until(lambda: (s := bucket_state(c, table.table_id)).offline_reason and s, 20, "offline")
    assert offline.leader_id == -1 and offline.isr == ()  # the wiped replica is never in sync again
    c.tablet(follower, tmp_path / f"t{follower}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "both registered")
    assert bucket_state(c, table.table_id).leader_id == -1  # not elected: an operator decides

    at = ("--bootstrap", c.coordinator.address)
    assert "--unclean" in assert_one_line_error(run("bucket", "elect", "db.two", "--bucket", "0", *at))
    answer = run("bucket", "elect", "db.two", "--bucket", "0", "--unclean", "--tablet", str(follower), "--json", *at)
    elected = json.loads(answer.stdout)
    assert (elected["leader"], elected["isr"], elected["loss"]["kind"]) == (follower, [follower], "unclean")
    retried = c.admin.elect_leader("db.two", 0, unclean=True)  # its answer lost: the same record
    assert (retried["leader"], retried["loss"].leader_epoch) == (follower, elected["loss"]["leader_epoch"])
    done = wait_until(lambda: (s := bucket_state(c, table.table_id)).losses[-1].resolved and s, 20, "the takeover")
    loss = done.losses[-1]
    assert (loss.from_offset, loss.last_known_end, loss.lost_offsets()) == (8, 12, 4)
    with TableClient(c.admin, "db.two") as client:
        rows = wait_until(lambda: _served(client), 20, "the new leader to serve")
        assert [r and r["v"] for r in rows[:12]] == ["a"] * 8 + [None] * 4

