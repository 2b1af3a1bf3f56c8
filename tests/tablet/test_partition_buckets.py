"""A tablet server holds, serves, snapshots and replicates the buckets of a partitioned table's partitions.

Real tablet servers on the test's ZooKeeper and gRPC on loopback, and no coordinator: the test writes the
ZooKeeper nodes the coordinator would (its epoch, ``/tables/{id}`` of tables and partitions:
``coordinator/catalog.py``) and pushes leadership with ``UpdateLeadership`` as it does, each partition's
buckets with the partition's view of its table. The coordinator's snapshot calls are answered by a stand-in
(:class:`SnapshotCoordinator`, set as each server's admin client), which records the handles committed:
the coordinator itself refuses a set ``partition_id`` until it serves partitions.
"""

from __future__ import annotations

import os

import grpc
import pytest

from kvlease.client.server_calls import ServerCalls
from kvlease.client.admin_types import SnapshotInfo
from kvlease.common import errors, zkpaths
from kvlease.common.bucketing import bucket_of
from kvlease.common.codec import RowCodec, batch_to_ipc, ipc_to_batch
from kvlease.common.errors import ErrorCode
from kvlease.common.model import TableBucket
from kvlease.common.proto import coordinator_pb2 as cpb
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pbg
from kvlease.common.tables import Column, TableInfo
from kvlease.common.wire import table_to_pb
from kvlease.common.zk import dumps, make_client
from kvlease.ops.wait import wait_until
from kvlease.tablet.replicas import snapshots as snapshots_module
from kvlease.tablet.server import TabletServer

EPOCH = 1  # the coordinator epoch ZooKeeper has and the pushes carry
COLUMNS = (Column("id", "BIGINT"), Column("day", "STRING"), Column("v", "STRING"))
EVENTS = TableInfo(3, "db", "events", COLUMNS, ("id", "day"), 2, partition_key=("day",))
P1, P2 = EVENTS.of_partition(4, "20261127"), EVENTS.of_partition(5, "20261128")
OTHER = TableInfo(6, "db", "other", COLUMNS, ("id", "day"), 1, partition_key=("day",)).of_partition(7, "20261127")
PLAIN = TableInfo(8, "db", "plain", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
ELSEWHERE = 9  # a partition of EVENTS ZooKeeper has, on no server of this test
NOWHERE = 99  # no table or partition has this id
FAST = {"kv.snapshot.interval": "1h", "replica.fetch.wait-max": "100ms"}


class SnapshotCoordinator:
    """Stands in for the coordinator's snapshot calls (commit, latest, list): it keeps what is committed and
    answers as the coordinator does: a table's id alone with every partition's snapshots, with a partition's
    id with that partition's. It records the ``(table_id, partition_id)`` of each latest-snapshots ask."""

    def __init__(self) -> None:
        self.committed: list = []
        self.latest_asked: list[tuple[int, int | None]] = []
        self.kept_asked: list[tuple[int, int | None]] = []

    def commit_kv_snapshot(self, handle, *, leader_epoch=None, server_id=None) -> None:
        self.committed.append(handle)

    def list_kv_snapshots(self, table_id: int, partition_id: int | None = None) -> list[SnapshotInfo]:
        self.kept_asked.append((table_id, partition_id))
        return self._listed(table_id, partition_id)

    def _listed(self, table_id: int, partition_id: int | None) -> list[SnapshotInfo]:
        return [SnapshotInfo(h) for h in self.committed if h.bucket.table_id == table_id
                and partition_id in (None, h.bucket.partition_id)]

    def get_latest_kv_snapshots(self, table_id: int, partition_id: int | None = None) -> dict:
        self.latest_asked.append((table_id, partition_id))
        listed = sorted(self._listed(table_id, partition_id), key=lambda i: i.snapshot_id)
        return {info.bucket: info for info in listed}


class Tablet:
    """A tablet server the test pushes buckets to, and a stub of it."""

    def __init__(self, make_config, data_dir, server_id: int) -> None:
        self.data_dir = data_dir
        self.server = TabletServer(make_config({**FAST, "tablet.id": server_id,
                                                "tablet.data-dir": str(data_dir)})).start()
        self.coordinator = SnapshotCoordinator()
        self.server.replicas.admin = self.server.fetchers.rebuilder.admin = self.coordinator
        self.channel = grpc.insecure_channel(self.server.address)
        self.stub = pbg.TabletServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.server.stop()

    def push(self, *buckets: pb.BucketLeadershipPb, dropped=()) -> pb.UpdateLeadershipResponse:
        """Hold exactly ``buckets`` (:func:`led` each), with the leader lease resting on this server's session."""
        server = self.server
        demotions = server.zk.exists(zkpaths.tablet_demotions(server.server_id)).version
        return self.stub.UpdateLeadership(pb.UpdateLeadershipRequest(
            coordinator_epoch=EPOCH, server_id=server.server_id, buckets=list(buckets), dropped_tables=list(dropped),
            session_id=server.zk.client_id[0], demotions=demotions), timeout=10)

    def held(self) -> list[tuple[int, int]]:
        return sorted(self.server.replicas._replicas)


def led(view: TableInfo, bucket: int, **fields) -> pb.BucketLeadershipPb:
    """A bucket led alone by the server it is pushed to, named as the coordinator names a partition's bucket."""
    return pb.BucketLeadershipPb(table=table_to_pb(view), bucket=bucket, leader_epoch=1, **fields)


@pytest.fixture
def zk(make_config):
    """The test's ZooKeeper, with the nodes the coordinator keeps: its epoch; EVENTS, its partitions 4, 5 and
    9; OTHER and its partition 7; PLAIN."""
    client = make_client(make_config())
    try:
        client.create(zkpaths.EPOCH, dumps({"epoch": EPOCH}), makepath=True)
        for table in (EVENTS, TableInfo(6, "db", "other", COLUMNS, ("id", "day"), 1, partition_key=("day",)), PLAIN):
            client.create(zkpaths.table(table.table_id), dumps(table.to_json()), makepath=True)
        for table_id, partition_id, name in ((3, 4, P1.partition_name), (3, 5, P2.partition_name), (6, 7, "20261127"),
                                             (3, ELSEWHERE, "20261129")):
            client.create(zkpaths.table(partition_id), dumps({"table_id": table_id, "partition_id": partition_id,
                                                              "partition_name": name, "created_ms": 0}))
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def tablets(make_config, zk, tmp_path):  # tmp_path first: the servers stop before it is removed
    made: list[Tablet] = []

    def make(server_id: int = 1) -> Tablet:
        made.append(Tablet(make_config, tmp_path / f"t{server_id}", server_id))
        return made[-1]

    yield make
    for tablet in made:
        tablet.close()


@pytest.fixture
def tablet(tablets):
    """Tablet server 1 leading both buckets of partitions 4 and 5 of EVENTS, OTHER's partition 7 and PLAIN."""
    t = tablets(1)
    assert not t.push(led(P1, 0), led(P1, 1), led(P2, 0), led(P2, 1), led(OTHER, 0), led(PLAIN, 0)).error.code
    wait_until(t.server.lease.valid, 10, "the leader lease")
    return t


def rows(view: TableInfo, ids, tag: str) -> list[dict]:
    return [{"id": i, "day": view.partition_name, "v": f"{tag}{i}"} for i in ids]


def by_bucket(view: TableInfo, rows_: list[dict]) -> dict[int, list[dict]]:
    """``rows_`` by the bucket (of ``view``'s partition) their keys hash to."""
    codec = RowCodec(view)
    keys = codec.encode_keys(codec.to_batch(rows_))
    split: dict[int, list[dict]] = {}
    for key, row in zip(keys, rows_):
        split.setdefault(bucket_of(key, view.buckets), []).append(row)
    return split


def put(tablet: Tablet, view: TableInfo, bucket: int, rows_: list[dict], **naming) -> pb.PutKvResponse:
    """PutKv of ``rows_`` into a bucket named by ``naming`` (default: the view's table and partition ids)."""
    naming = naming or {"table_id": view.table_id, "partition_id": view.partition_id}
    upserts = batch_to_ipc(RowCodec(view).to_batch(rows_))
    return tablet.stub.PutKv(pb.PutKvRequest(bucket=bucket, upserts=upserts, **naming), timeout=10)


def lookup(tablet: Tablet, view: TableInfo, bucket: int, keys: list[dict], **naming) -> list[dict | None]:
    naming = naming or {"table_id": view.table_id, "partition_id": view.partition_id}
    batch = RowCodec(view).to_batch(keys).select(list(view.primary_key))
    response = tablet.stub.Lookup(pb.LookupRequest(bucket=bucket, keys=batch_to_ipc(batch), **naming), timeout=10)
    if response.error.code:
        raise errors.error_for(response.error.code, response.error.message)
    found = iter(ipc_to_batch(response.rows).to_pylist()) if response.rows else iter(())
    return [next(found) if hit else None for hit in response.found]


def log_ends(tablet: Tablet) -> dict[tuple[int, int], int]:
    """Every bucket's changelog end (ListOffsets of its table and partition)."""
    ends = {}
    for view in (P1, P2, OTHER):
        response = tablet.stub.ListOffsets(pb.ListOffsetsRequest(
            table_id=view.table_id, partition_id=view.partition_id, buckets=range(view.buckets)), timeout=10)
        assert not response.error.code, response.error
        for o in response.offsets:
            assert not o.error.code and o.partition_id == view.partition_id, o
            ends[(view.partition_id, o.bucket)] = o.latest
    return ends


# -- serving two partitions' buckets of the same numbers -------------------------------------------------------

def test_two_partitions_buckets_of_the_same_numbers_keep_their_rows_apart(tablet):
    ids = range(20)
    written = {}
    for view, tag in ((P1, "a"), (P2, "b")):  # the same ids in both: only the partition column tells them apart
        for bucket, part in sorted(by_bucket(view, rows(view, ids, tag)).items()):
            response = put(tablet, view, bucket, part)
            assert not response.error.code, response.error
            written[(view.partition_id, bucket)] = part
    assert {b for _p, b in written} == {0, 1}  # each partition's rows went to both of its buckets

    for (partition_id, bucket), part in written.items():
        view, other = (P1, P2) if partition_id == P1.partition_id else (P2, P1)
        assert lookup(tablet, view, bucket, part) == part
        # the other partition's bucket of the same number has none of them
        assert lookup(tablet, other, bucket, part) == [None] * len(part)
    assert log_ends(tablet) == {**{key: len(part) for key, part in written.items()}, (7, 0): 0}  # a record a row

    data = tablet.data_dir
    wait_until(lambda: all((data / str(p) / str(b) / "log").is_dir() for p in (4, 5) for b in (0, 1)), 10,
               "the partitions' bucket dirs")
    assert not (data / str(EVENTS.table_id)).exists()  # a partitioned table has no buckets of its own
    wait_until(lambda: {"4-0", "4-1", "5-0", "5-1"} <= set(os.listdir(data / "held")), 10, "the held markers")


def test_an_unpartitioned_table_beside_partitions_works_as_before(tablet):
    response = tablet.stub.PutKv(pb.PutKvRequest(table_id=PLAIN.table_id, bucket=0, upserts=batch_to_ipc(
        RowCodec(PLAIN).to_batch([{"id": 1, "v": "x"}]))), timeout=10)
    assert not response.error.code and response.next_offset == 1
    assert lookup(tablet, PLAIN, 0, [{"id": 1}], table_id=PLAIN.table_id) == [{"id": 1, "v": "x"}]
    assert (tablet.data_dir / str(PLAIN.table_id) / "0").is_dir()


# -- requests naming no partition held -----------------------------------------------------------------------

REFUSED = [  # how the request names bucket 0; the error code; words of its message
    ({"table_id": 3}, ErrorCode.PARTITION_NOT_EXISTS, "table 3 is partitioned: a request for one of its buckets "
                                                      "must name the partition"),
    ({"table_id": 4}, ErrorCode.TABLE_NOT_EXIST, "table id 4 does not exist: it is the id of a partition of table 3"),
    ({"table_id": 3, "partition_id": 7}, ErrorCode.PARTITION_NOT_EXISTS,
     "partition 7 of table 3 does not exist: id 7 is of table 6"),
    ({"table_id": 6, "partition_id": 4}, ErrorCode.PARTITION_NOT_EXISTS,
     "partition 4 of table 6 does not exist: id 4 is of table 3"),
    ({"table_id": 8, "partition_id": 4}, ErrorCode.INVALID_REQUEST, "table 8 is not partitioned"),
    ({"table_id": 3, "partition_id": NOWHERE}, ErrorCode.PARTITION_NOT_EXISTS,
     "partition 99 of table 3 does not exist (never created, or dropped)"),
    # ZooKeeper has it: a client's stale routing (or a push on its way) — it asks the coordinator again, retries
    ({"table_id": 3, "partition_id": ELSEWHERE}, ErrorCode.NOT_LEADER, "holds no bucket of partition 9 of table 3"),
]


@pytest.mark.parametrize("naming, code, words", REFUSED)
def test_a_write_naming_no_partition_held_of_its_table_is_refused_clearly_and_writes_nothing(tablet, naming, code,
                                                                                             words):
    kept = by_bucket(P1, rows(P1, range(20), "a"))[0][:1]  # rows of bucket 0 (of P1, as EVENTS hashes)
    assert not put(tablet, P1, 0, kept).error.code
    before = log_ends(tablet)
    row = by_bucket(P1, rows(P1, range(100, 120), "z"))[0][:1]
    response = put(tablet, P1, 0, row, **naming)
    assert response.error.code == code, response.error
    assert words in response.error.message and "\n" not in response.error.message
    assert log_ends(tablet) == before  # nothing appended anywhere
    assert lookup(tablet, P1, 0, row + kept) == [None, *kept]
    assert not (tablet.data_dir / str(NOWHERE)).exists() and not (tablet.data_dir / str(ELSEWHERE)).exists()


@pytest.mark.parametrize("rpc", ["Lookup", "FetchLog", "ListOffsets", "TriggerSnapshot", "ScanKv", "ScanKvStream"])
def test_every_read_naming_no_partition_is_refused_for_a_partitioned_table(tablet, rpc):
    key = batch_to_ipc(RowCodec(P1).to_batch(rows(P1, [1], "a")).select(["id", "day"]))
    scan = pb.BucketScanReqPb(table_id=3, bucket=0)
    request = {"Lookup": pb.LookupRequest(table_id=3, bucket=0, keys=key),
               "FetchLog": pb.FetchLogRequest(table_id=3, bucket=0, max_bytes=1 << 20),
               "ListOffsets": pb.ListOffsetsRequest(table_id=3, buckets=[0]),
               "TriggerSnapshot": pb.TriggerSnapshotRequest(table_id=3, wait=True),
               "ScanKv": pb.ScanKvRequest(bucket_scan_req=scan, batch_size_bytes=1 << 20),
               "ScanKvStream": pb.ScanKvStreamRequest(bucket_scan_req=scan, batch_size_bytes=1 << 20)}[rpc]
    answer = getattr(tablet.stub, rpc)(request, timeout=10)
    response = list(answer)[-1] if rpc == "ScanKvStream" else answer
    assert response.error.code == ErrorCode.PARTITION_NOT_EXISTS, response.error
    assert "table 3 is partitioned" in response.error.message
    assert tablet.coordinator.committed == [] and tablet.server.scans.counts()[0] == 0


def test_a_scan_of_a_partition_bucket_reads_that_partition_only(tablet):
    part = by_bucket(P2, rows(P2, range(20), "b"))[1]
    assert not put(tablet, P2, 1, part).error.code
    assert not put(tablet, P1, 1, by_bucket(P1, rows(P1, range(20), "a"))[1]).error.code
    responses = list(tablet.stub.ScanKvStream(pb.ScanKvStreamRequest(bucket_scan_req=pb.BucketScanReqPb(
        table_id=3, partition_id=5, bucket=1), batch_size_bytes=1 << 20), timeout=10))
    assert not responses[-1].error.code, responses[-1].error
    values = [v for r in responses if r.records for v in ipc_to_batch(r.records).column("value").to_pylist()]
    scanned = RowCodec(P2).decode_values(values).to_pylist()
    assert sorted(scanned, key=lambda r: r["id"]) == sorted(part, key=lambda r: r["id"])


# -- snapshots -----------------------------------------------------------------------------------------------

def test_a_snapshot_of_a_partition_bucket_commits_a_handle_naming_its_partition(tablet):
    for view, tag in ((P1, "a"), (P2, "b")):
        assert not put(tablet, view, 0, by_bucket(view, rows(view, range(20), tag))[0]).error.code
    response = tablet.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=3, partition_id=4, buckets=[0],
                                                                     wait=True), timeout=30)
    assert not response.error.code, response.error
    [snapshot] = response.snapshots
    assert (snapshot.bucket.table_id, snapshot.bucket.partition_id, snapshot.bucket.bucket) == (3, 4, 0)
    [handle] = tablet.coordinator.committed
    assert handle.bucket == TableBucket(3, 0, 4)
    assert handle.log_offset == len(by_bucket(P1, rows(P1, range(20), "a"))[0])  # a record a row written
    storage = tablet.server.storage
    assert handle.metadata_path.startswith("kv/3/p4/0/") and storage.exists(handle.metadata_path)
    assert all(f.path.startswith("kv/3/p4/0/") for f in handle.files) and handle.files
    assert not storage.list("kv/3/p5/")  # the other partition's bucket 0 was not snapshotted

    again = tablet.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=3, partition_id=5, wait=True), timeout=30)
    assert not again.error.code, again.error
    assert sorted((s.bucket.partition_id, s.bucket.bucket) for s in again.snapshots) == [(5, 0)]  # 1 is empty
    assert [h.bucket for h in tablet.coordinator.committed] == [TableBucket(3, 0, 4), TableBucket(3, 0, 5)]
    assert tablet.coordinator.committed[1].snapshot_id == 1  # each partition's bucket counts its own snapshots
    # each bucket learned its latest snapshot asking for its partition's only, not every partition's of table 3
    asked = set(tablet.coordinator.latest_asked)
    assert {(3, 4), (3, 5)} <= asked and (3, None) not in asked
    unchanged = tablet.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=3, partition_id=4, buckets=[0],
                                                                      wait=True), timeout=30)
    assert [u.bucket.partition_id for u in unchanged.unchanged] == [4] and len(tablet.coordinator.committed) == 2


def test_changelog_retention_asks_for_the_kept_snapshots_of_the_partitions_it_checks_only(tablet, monkeypatch):
    coordinator, replicas = tablet.coordinator, tablet.server.replicas
    assert not put(tablet, P1, 0, by_bucket(P1, rows(P1, range(20), "a"))[0]).error.code
    response = tablet.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=3, partition_id=4, buckets=[0],
                                                                     wait=True), timeout=30)
    assert not response.error.code and len(coordinator.committed) == 1
    assert coordinator.kept_asked == [(3, 4)]  # the committed bucket's partition's: not every partition's of 3

    coordinator.kept_asked.clear()
    assert not put(tablet, P2, 0, by_bucket(P2, rows(P2, range(20), "b"))[0]).error.code
    assert replicas.snapshot_changed() == 1  # P2's bucket 0; the first round checks every bucket held
    # P1's bucket 0 is unchanged but has a changelog; the buckets with an empty one (OTHER, PLAIN, bucket 1 of
    # each partition) are not asked for
    assert sorted(coordinator.kept_asked) == [(3, 4), (3, 5)]

    coordinator.kept_asked.clear()
    assert replicas.snapshot_changed() == 0 and coordinator.kept_asked == []  # nothing changed, none due

    monkeypatch.setattr(snapshots_module, "PARTITION_LISTINGS_MAX", 1)  # more partitions than that: one listing
    monkeypatch.setattr(replicas.snapshots, "_every_bucket_at", 0.0)  # the interval is over
    assert replicas.snapshot_changed() == 0 and coordinator.kept_asked == [(3, None)]


# -- pushes, drops and the tablet server's own calls -----------------------------------------------------------

def test_a_dropped_partition_is_deleted_once_zookeeper_has_no_node_of_it(tablet, zk):
    everything = [led(P1, 0), led(P1, 1), led(P2, 0), led(P2, 1), led(OTHER, 0), led(PLAIN, 0)]
    but_p2 = [b for b in everything if b.table.partition_id != 5]
    for view, tag in ((P1, "a"), (P2, "b")):
        assert not put(tablet, view, 0, by_bucket(view, rows(view, range(20), tag))[0]).error.code
    data = tablet.data_dir
    wait_until(lambda: (data / "5" / "0").is_dir() and (data / "held" / "5-0").exists(), 10, "partition 5's dir")
    assert not tablet.push(*but_p2, dropped=[5]).error.code  # ZooKeeper still has /tables/5: its data stays
    assert (5, 0) not in tablet.held() and (data / "5" / "0").is_dir()
    assert not tablet.push(*everything).error.code  # held again, over the same files
    assert lookup(tablet, P2, 0, by_bucket(P2, rows(P2, range(20), "b"))[0][:1])[0]["v"].startswith("b")

    zk.delete(zkpaths.table(5))  # the coordinator dropped the partition (then its table's id is dropped too)
    assert not tablet.push(*but_p2, dropped=[3]).error.code  # the table's id drops the partitions of it held
    assert not (data / "5").exists() and not (data / "held" / "5-0").exists()
    assert (data / "4" / "0").is_dir()  # its table's other partition, still held and in ZooKeeper, stays
    assert lookup(tablet, P1, 0, by_bucket(P1, rows(P1, range(20), "a"))[0][:1])[0] is not None
    response = put(tablet, P2, 0, rows(P2, [1], "b"))
    assert response.error.code == ErrorCode.PARTITION_NOT_EXISTS and "partition 5 of table 3" in response.error.message


def test_a_push_naming_a_partition_wrongly_is_refused_whole(tablet):
    before = tablet.held()
    response = tablet.push(led(P1, 0, partition_id=5), led(P2, 0))
    assert response.error.code == ErrorCode.INVALID_REQUEST, response.error
    assert "partition_id 5, but its table view is of partition 4" in response.error.message
    assert tablet.push(led(EVENTS, 0)).error.code == ErrorCode.INVALID_REQUEST  # the table's own buckets
    assert tablet.held() == before


def test_a_followers_fetches_and_the_leaders_reports_name_the_partition(tablets):
    leader, follower = tablets(1), tablets(2)
    replicated = TableInfo(**{**EVENTS.__dict__, "replication_factor": 2}).of_partition(4, "20261127")
    address = leader.server.address

    def role():
        return pb.BucketLeadershipPb(table=table_to_pb(replicated), bucket=0, leader_epoch=1, leader=1,
                                     leader_address=address, replicas=[1, 2], isr=[1, 2], bucket_epoch=1)
    for t in (leader, follower):
        assert not t.push(role()).error.code
    wait_until(leader.server.lease.valid, 10, "the leader lease")
    part = by_bucket(replicated, rows(replicated, range(20), "r"))[0]
    # acknowledged once the follower holds it: its fetch named partition 4 of table 3, else nothing was found
    response = put(leader, replicated, 0, part)
    assert not response.error.code, response.error
    store = follower.server.replicas.replica(4, 0).store
    wait_until(lambda: store.high_watermark == response.next_offset, 10, "the follower to apply the write")
    assert follower.data_dir.joinpath("4", "0").is_dir() and not follower.data_dir.joinpath("3").exists()

    reported = []
    leader.server.log_ends.server_calls = ServerCalls(lambda method, request, **_: reported.append(request))
    assert leader.server.log_ends.run_once() == 1
    [end] = reported[0].buckets
    assert (end.table_id, end.partition_id, end.bucket, end.log_end) == (3, 4, 0, response.next_offset)


@pytest.mark.unit
def test_the_coordinator_calls_of_a_tablet_server_carry_the_partition():
    sent = []

    def call(method, request, **_):
        sent.append(request)
        return {"AlterIsr": cpb.AlterIsrResponse(isr=[1], leader=1, leader_epoch=2, bucket_epoch=3),
                "ResignLeadership": cpb.ResignLeadershipResponse(buckets=[cpb.ResignedBucketPb()])}.get(method)

    calls = ServerCalls(call)
    calls.alter_isr(1, 3, 0, 2, 3, [1], partition_id=4)
    [resigned] = calls.resign_leadership(1, [(3, 0, 2, "EIO", 4)])
    calls.report_replica_loss(1, 3, 0, "EIO", partition_id=4)
    calls.confirm_restore(1, 3, 0, 2, partition_id=4)
    calls.report_log_ends(1, [(3, 0, 2, 10, 4)])
    named = [sent[0], sent[1].buckets[0], sent[2], sent[3], sent[4].buckets[0]]
    assert [(m.table_id, m.partition_id, m.bucket) for m in named] == [(3, 4, 0)] * 5
    assert resigned.partition_id == 4
    calls.report_log_ends(1, [(3, 0, 2, 10)])  # an unpartitioned table's bucket: partition_id unset
    assert not sent[-1].buckets[0].HasField("partition_id")
