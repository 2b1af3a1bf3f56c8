"""Tablet servers with a coordinator on a real ZooKeeper: writes, crashes, snapshots, retention."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from kvlease.common import errors
from kvlease.common.config import to_toml
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pbg
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column
from kvlease.client.admin import AdminClient
from kvlease.coordinator.server import CoordinatorServer
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.ops.local_cluster import free_ports
from kvlease.ops.local_cluster import dying_with_parent
from kvlease.common.logentry import decode_entry
from kvlease.common.codec import RowCodec, batch_to_ipc, ipc_to_batch
from kvlease.tablet.server import TabletServer
from kvlease.ops.wait import wait_until
from tests.support.paths import REPO

pytestmark = pytest.mark.zk
ROOT = REPO


class Cluster:
    def __init__(self, make_config, overrides=None):
        self.make_config = make_config
        self.overrides = dict(overrides or {})
        self.coordinator = CoordinatorServer(make_config(self.overrides)).start()
        assert self.coordinator.wait_active(15)
        self.admin = AdminClient([self.coordinator.address], retry_total_s=15)
        self.tablets: list[TabletServer] = []

    def tablet(self, server_id, data_dir):
        config = self.make_config({**self.overrides, "tablet.id": server_id, "tablet.data-dir": str(data_dir)})
        server = TabletServer(config).start()
        self.tablets.append(server)
        return server

    def close(self):
        for server in self.tablets:
            server.stop()
        self.admin.close()
        self.coordinator.stop()

    def leaders(self, table_id):
        return self.admin.get_table_assignment(table_id)[1]

    def stub(self, table_id, bucket):
        leader = wait_until(lambda: self.leaders(table_id)[bucket].leader_address, 10, "a leader")
        stub = pbg.TabletServiceStub(grpc.insecure_channel(leader))
        # the coordinator tells the leader asynchronously: wait until it leads the bucket
        wait_until(lambda: not stub.ListOffsets(pb.ListOffsetsRequest(table_id=table_id, buckets=[bucket]),
                                                timeout=5).offsets[0].error.code, 10, "the leader to lead")
        return stub


def put(stub, table, rows=None, delete_keys=None, bucket=0):
    codec = RowCodec(table)
    request = pb.PutKvRequest(table_id=table.table_id, bucket=bucket)
    if rows:
        request.upserts = batch_to_ipc(codec.to_batch(rows))
    if delete_keys:
        request.deletes = batch_to_ipc(codec.to_batch(delete_keys).select(list(table.primary_key)))
    response = stub.PutKv(request, timeout=10)
    if response.error.code:
        raise errors.error_for(response.error.code, response.error.message)
    return response.base_offset, response.next_offset


def lookup(stub, table, ids, bucket=0):
    codec = RowCodec(table)
    keys = codec.to_batch([{"id": i} for i in ids]).select(["id"])
    response = stub.Lookup(pb.LookupRequest(table_id=table.table_id, bucket=bucket, keys=batch_to_ipc(keys)),
                           timeout=10)
    if response.error.code:
        raise errors.error_for(response.error.code, response.error.message)
    rows = iter(ipc_to_batch(response.rows).to_pylist()) if response.rows else iter(())
    return [next(rows) if found else None for found in response.found]


def fetch_all(stub, table, from_offset=0, bucket=0):
    records = []
    while True:
        response = stub.FetchLog(pb.FetchLogRequest(table_id=table.table_id, bucket=bucket,
                                                    from_offset=from_offset, max_bytes=1 << 20), timeout=10)
        if response.error.code:
            raise errors.error_for(response.error.code, response.error.message)
        for raw in response.entries:
            entry = decode_entry(raw, from_offset=from_offset)
            records.extend(entry.batch.to_pylist())
            from_offset = entry.next_offset
        if from_offset >= response.log_end_offset:
            return records, response


@pytest.fixture
def cluster(make_config, tmp_path):  # tmp_path first: the servers stop before it is removed
    made = []

    def make(overrides=None):
        c = Cluster(make_config, overrides)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]


def test_writes_lookups_changelog_and_not_leader(cluster, tmp_path):
    c = cluster()
    c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.t", SCHEMA, ["id"], 1)
    stub = c.stub(table.table_id, 0)
    put(stub, table, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    put(stub, table, [{"id": 1, "v": "a2"}], delete_keys=[{"id": 2}, {"id": 99}])
    assert lookup(stub, table, [1, 2, 3]) == [{"id": 1, "v": "a2"}, None, None]
    records, response = fetch_all(stub, table)
    codec = RowCodec(table)
    kinds = [(r["offset"], r["change_type"]) for r in records]
    assert kinds == [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3)]  # +I +I -U +U -D
    before = codec.decode_values([records[2]["value"]]).to_pylist()
    assert before == [{"id": 1, "v": "a"}]
    assert response.log_end_offset == 5
    # every entry carries the epoch of the leadership it was appended under
    epoch = c.leaders(table.table_id)[0].leader_epoch
    raw = stub.FetchLog(pb.FetchLogRequest(table_id=table.table_id, bucket=0, from_offset=0, max_bytes=1 << 20),
                        timeout=10)
    assert epoch >= 0 and [decode_entry(e).leader_epoch for e in raw.entries] == [epoch, epoch]
    # a bad batch is rejected whole
    bad = pb.PutKvRequest(table_id=table.table_id, bucket=0, upserts=b"not arrow")
    assert stub.PutKv(bad, timeout=5).error.code == errors.ErrorCode.INVALID_ROW
    with pytest.raises(errors.NotLeaderError):
        lookup(stub, table, [1], bucket=7)


def _spawn_tablet(home: Path, values: dict) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(to_toml(values))
    log = open(home / "tablet.log", "ab")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(dying_with_parent([sys.executable, "-m", "kvlease.tablet", "--config", str(home / "config.toml")]),
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))


def test_a_previous_lifes_node_expiring_while_it_registers_does_not_stop_the_start(cluster, make_config, tmp_path,
                                                                                  monkeypatch):
    """Restart after kill -9: the old session's ephemeral node makes the create fail, then expires
    before the tablet server reads it (NoNodeError). It must register, not crash (a CI failure)."""
    from kazoo.client import KazooClient

    from kvlease.common import zkpaths
    from kvlease.common.zk import make_client

    c = cluster()
    config = make_config({"tablet.id": 7, "tablet.data-dir": str(tmp_path / "t7")})
    path = zkpaths.tablet_server(7)
    previous_life = make_client(config)
    previous_life.create(path, b'{"address": "127.0.0.1:1"}', ephemeral=True, makepath=True)
    real_get = KazooClient.get
    raced = []

    def get(self, node, *args, **kwargs):
        if node == path and not raced and self is not previous_life:
            raced.append(node)
            previous_life.stop()  # its node goes now: between the server's create and this read
            previous_life.close()
        return real_get(self, node, *args, **kwargs)

    monkeypatch.setattr(KazooClient, "get", get)
    try:
        server = TabletServer(config).start()
        c.tablets.append(server)
    finally:
        if previous_life.connected:
            previous_life.stop()
            previous_life.close()
    assert raced == [path]
    data, stat = real_get(c.coordinator.zk, path)
    assert stat.ephemeralOwner == server.zk.client_id[0] and server.address in data.decode()


@pytest.mark.slow
def test_kill_9_during_acknowledged_writes_loses_nothing(cluster, make_config, tmp_path):
    c = cluster({"log.flush.fsync": True})
    port = free_ports(1)[0]
    values = {k: v for k, v in make_config().as_dict().items()
              if k.startswith(("zookeeper.", "remote.")) or k == "log.flush.fsync"}
    values.update({"tablet.id": 1, "tablet.port": port, "tablet.data-dir": str(tmp_path / "data"),
                   "kv.snapshot.interval": "1h", "log.flush.fsync": True})
    proc = _spawn_tablet(tmp_path / "t1", values)
    try:
        table = c.admin.create_table("db.crash", SCHEMA, ["id"], 1)
        stub = c.stub(table.table_id, 0)
        acked: dict[int, str] = {}
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                rows = [{"id": i * 10 + j, "v": f"r{i}-{j}"} for j in range(10)]
                try:
                    put(stub, table, rows)
                except (grpc.RpcError, errors.KvLeaseError):
                    return
                acked.update({r["id"]: r["v"] for r in rows})
                i += 1

        thread = threading.Thread(target=writer)
        thread.start()
        wait_until(lambda: len(acked) >= 2000, 60, "acknowledged writes")
        proc.kill()
        proc.wait(timeout=10)
        stop.set()
        thread.join(timeout=30)
        proc = _spawn_tablet(tmp_path / "t1", values)
        stub = pbg.TabletServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

        def readable():
            try:
                return lookup(stub, table, [0]) is not None
            except (grpc.RpcError, errors.KvLeaseError):
                return False

        wait_until(readable, 30, "the restarted tablet server")
        ids = sorted(acked)
        found = lookup(stub, table, ids)
        assert [r and r["v"] for r in found] == [acked[i] for i in ids]
        # the changelog and the KV agree: replaying the changelog gives the KV content
        state = _replay_changelog(stub, table)
        kv = {row["id"]: row["v"] for row in lookup(stub, table, sorted(state)) if row}
        assert kv == state
        assert all(state[i] == acked[i] for i in acked)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _replay_changelog(stub, table) -> dict:
    """``id -> v`` of the rows the bucket's whole changelog leaves (inserts and updates set, deletes remove)."""
    records, _ = fetch_all(stub, table)
    codec = RowCodec(table)
    state = {}
    for r in records:
        if r["change_type"] in (0, 2):
            row = codec.decode_values([r["value"]]).to_pylist()[0]
            state[row["id"]] = row["v"]
        elif r["change_type"] == 3:
            state.pop(codec.decode_keys([r["key"]]).to_pylist()[0]["id"], None)
    return state


@pytest.mark.parametrize("remote", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_leased_snapshot_survives_retention_and_goes_at_release(cluster, tmp_path, request, remote):
    overrides = {"kv.snapshot.interval": "1h", "log.segment.bytes": "4kb", "log.retention": "0ms"}
    if remote == "s3":
        overrides.update(request.getfixturevalue("s3_overrides"))
    c = cluster(overrides)
    tablet = c.tablet(1, tmp_path / "t1")
    storage = open_storage(tablet.config["remote.data.dir"], tablet.config)
    table = c.admin.create_table("db.snap", SCHEMA, ["id"], 1)
    stub = c.stub(table.table_id, 0)

    def snapshot():
        r = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=table.table_id, wait=True), timeout=60)
        assert not r.error.code, r.error.message
        return r.snapshots[0]

    put(stub, table, [{"id": i, "v": "x" * 50} for i in range(500)])
    s1 = snapshot()
    files1 = {f.path for f in s1.files} | {s1.metadata_path}
    c.admin.acquire_lease("reader", {TableBucket(table.table_id, 0): s1.snapshot_id},
                          600_000)
    for round_ in range(3):  # two more snapshots: s1 falls out of retention, kept by the lease
        put(stub, table, [{"id": i, "v": f"y{round_}" * 20} for i in range(0, 500, 7)])
        last = snapshot()
    kept = {s.snapshot_id for s in c.admin.list_kv_snapshots(table.table_id)}
    assert s1.snapshot_id in kept and len(kept) == 3
    assert all(storage.exists(p) for p in files1)
    # the changelog is kept back to the leased snapshot's log offset
    offsets = stub.ListOffsets(pb.ListOffsetsRequest(table_id=table.table_id, buckets=[0]), timeout=5).offsets[0]
    assert offsets.earliest <= s1.log_offset
    records, _ = fetch_all(stub, table, from_offset=s1.log_offset)
    assert records and records[0]["offset"] == s1.log_offset

    c.admin.release_lease("reader", [TableBucket(table.table_id, 0)])
    kept_files = {f.path for s in c.admin.list_kv_snapshots(table.table_id) for f in s.handle.files}
    gone = files1 - kept_files
    assert gone, "snapshot 1 had private files"
    wait_until(lambda: not any(storage.exists(p) for p in gone), 10, "snapshot 1's files to be deleted")
    assert all(storage.exists(p) for p in kept_files)  # shared SSTs still used stay
    # with the lease gone, the next snapshot lets retention drop the old changelog
    put(stub, table, [{"id": 1, "v": "z"}])
    snapshot()
    offsets = stub.ListOffsets(pb.ListOffsetsRequest(table_id=table.table_id, buckets=[0]), timeout=5).offsets[0]
    assert offsets.earliest > s1.log_offset
    assert last.snapshot_id > s1.snapshot_id


class CountingAdmin:
    """The tablet's admin client, counting its ListKvSnapshots calls per table."""

    def __init__(self, admin) -> None:
        self.admin, self.listed = admin, []

    def list_kv_snapshots(self, table_id, *args, **kwargs):
        self.listed.append(table_id)
        return self.admin.list_kv_snapshots(table_id, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.admin, name)


def test_a_snapshot_round_asks_for_kept_snapshots_once_per_table(cluster, tmp_path):
    from kvlease.client.table import TableClient

    c = cluster({"kv.snapshot.interval": "1h", "log.segment.bytes": "4kb", "log.retention": "0ms"})
    tablet = c.tablet(1, tmp_path / "t1")
    tables = [c.admin.create_table("db.a", SCHEMA, ["id"], 3), c.admin.create_table("db.b", SCHEMA, ["id"], 2)]
    counting = CountingAdmin(tablet.replicas.admin)
    tablet.replicas.admin = counting

    def fill(round_):
        for table in tables:
            c.stub(table.table_id, 0)  # led
            with TableClient(c.admin, table.table_id) as client:
                for start in range(0, 600, 100):  # several 4 kB segments per bucket
                    client.upsert([{"id": i, "v": f"r{round_}-{i}" * 5} for i in range(start, start + 100)])

    def earliest(table):
        with TableClient(c.admin, table.table_id) as client:
            return {b: e for b, (e, _) in client.list_offsets().items()}

    fill(0)
    assert tablet.replicas.snapshot_changed() == 5  # every bucket of both tables
    assert sorted(counting.listed) == sorted(t.table_id for t in tables)
    # retention still applies to every bucket: each changelog lost its old segments
    assert all(offset > 0 for t in tables for offset in earliest(t).values())

    counting.listed.clear()
    assert tablet.replicas.snapshot_changed() == 0  # nothing changed: no snapshot, no listing
    assert counting.listed == []

    fill(1)
    with TableClient(c.admin, tables[0].table_id) as client:  # TriggerSnapshot of one table's 3 buckets
        assert len(client.trigger_snapshot(wait=True)) == 3
    assert counting.listed == [tables[0].table_id]


def test_snapshot_commits_check_the_log_end_over_one_kept_channel_closed_at_step_down(
        cluster, tmp_path, monkeypatch):
    from kvlease.client.transport import Channels
    from kvlease.coordinator import snapshot_checks

    made = []

    class SpyChannels(Channels):  # the checker's channels: every stub handed out (with its channel), every close
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.handed, self.closed = [], 0
            made.append(self)

        def stub(self, address, stub_class):
            stub = super().stub(address, stub_class)
            self.handed.append((address, self.get(address)))
            return stub

        def close(self):
            self.closed += 1
            super().close()

    monkeypatch.setattr(snapshot_checks, "Channels", SpyChannels)
    c = cluster()
    tablet = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.ch", SCHEMA, ["id"], 1)
    stub = c.stub(table.table_id, 0)
    log_ends = c.coordinator.serving_loop().controller.log_ends
    [spy] = made  # the active term's
    for round_ in range(3):
        put(stub, table, [{"id": round_, "v": "x"}])
        r = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=table.table_id, wait=True), timeout=60)
        assert not r.error.code, r.error.message
    assert [address for address, _ in spy.handed] == [tablet.address] * 3  # every commit was checked...
    assert len({id(channel) for _, channel in spy.handed}) == 1  # ...over the same channel
    assert log_ends.addresses == [tablet.address] and spy.closed == 0

    c.coordinator.stop()  # steps down: the term's channels go
    c.tablets.remove(tablet)
    tablet.stop()
    assert spy.closed == 1 and log_ends.addresses == []
    _, channel = spy.handed[0]
    with pytest.raises(ValueError):  # closed: no RPC can use it any more
        pbg.TabletServiceStub(channel).ListOffsets(pb.ListOffsetsRequest(table_id=table.table_id, buckets=[0]))
    handle = SnapshotHandle(TableBucket(table.table_id, 0), 9, 0, "")
    with pytest.raises(errors.NotCoordinatorError):
        log_ends.check(handle, tablet.address)
    assert log_ends.addresses == []  # and opened none again


def test_a_stopping_server_does_not_say_its_zookeeper_session_was_lost(cluster, tmp_path, caplog):
    """stop() ends the session itself: no warning that reads like a lost connection at every shutdown."""
    c = cluster()
    server = c.tablet(1, tmp_path / "t1")
    c.tablets.remove(server)
    with caplog.at_level(logging.INFO, logger="kvlease.tablet.server"):
        server.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "kvlease.tablet.server"]
    assert not [m for m in said if "session lost" in m], said
