"""The table client: bucket splitting, routing and error mapping (fake tablet servers), then
round trips against a real coordinator and real tablet servers in-process on ZooKeeper.

The unit tests replace the client's gRPC stubs with :class:`FakeTablet` objects
that answer like a tablet server (a dict per bucket); the ``zk`` tests run
CoordinatorServer + TabletServers in this process over real gRPC on loopback.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import pyarrow as pa
import pytest

from common import errors
from common.proto import coordinator_pb2 as cpb
from common.proto import tablet_pb2 as pb
from common.proto import tablet_pb2_grpc as pb_grpc
from common.tables import Column, TableInfo
from client.admin import BucketLeader
from client.table import CommittedSnapshot, TableClient
from common.codec import RowCodec, batch_to_ipc, bucket_of, ipc_to_batch

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 4)
COMPOSITE = TableInfo(8, "db", "c", (Column("a", "INT"), Column("b", "STRING"), Column("x", "DOUBLE")), ("a", "b"), 3)


# -- fakes -------------------------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name


@dataclass
class FakeTablet:
    """One tablet server: leads ``buckets``; ``fail`` holds wire errors or gRPC codes to answer next."""

    address: str
    table: TableInfo
    buckets: set[int]
    rows: dict[int, dict[bytes, dict]] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)
    fail: list = field(default_factory=list)

    def _check(self, method: str, bucket: int):
        self.calls.append((method, bucket))
        if self.fail:
            failure = self.fail.pop(0)
            if isinstance(failure, grpc.StatusCode):
                raise FakeRpcError(failure)
            return cpb.ErrorPb(code=int(failure), message=f"fake {failure.name}")
        if bucket >= 0 and bucket not in self.buckets:
            return cpb.ErrorPb(code=int(errors.ErrorCode.NOT_LEADER), message=f"not leader of {bucket}")
        return None

    def PutKv(self, request, timeout=None):
        error = self._check("PutKv", request.bucket)
        if error:
            return pb.PutKvResponse(error=error)
        codec = RowCodec(self.table)
        store = self.rows.setdefault(request.bucket, {})
        n = 0
        if request.upserts:
            batch = codec.validate(ipc_to_batch(request.upserts))
            for key, row in zip(codec.encode_keys(batch), batch.to_pylist()):
                assert bucket_of(key, self.table.buckets) == request.bucket
                store[key] = row
                n += 1
        if request.deletes:
            for key in codec.encode_keys(ipc_to_batch(request.deletes)):
                assert bucket_of(key, self.table.buckets) == request.bucket
                n += store.pop(key, None) is not None
        return pb.PutKvResponse(base_offset=0, next_offset=n)

    def Lookup(self, request, timeout=None):
        error = self._check("Lookup", request.bucket)
        if error:
            return pb.LookupResponse(error=error)
        codec = RowCodec(self.table)
        store = self.rows.get(request.bucket, {})
        rows = [store.get(k) for k in codec.encode_keys(ipc_to_batch(request.keys))]
        found = [r for r in rows if r is not None]
        return pb.LookupResponse(rows=batch_to_ipc(pa.RecordBatch.from_pylist(found, schema=codec.schema)),
                                 found=[r is not None for r in rows])

    def ListOffsets(self, request, timeout=None):
        error = self._check("ListOffsets", -1)
        if error:
            return pb.ListOffsetsResponse(error=error)
        return pb.ListOffsetsResponse(offsets=[
            pb.BucketOffsetsPb(bucket=b, earliest=0, latest=len(self.rows.get(b, {}))) if b in self.buckets else
            pb.BucketOffsetsPb(bucket=b, error=cpb.ErrorPb(code=int(errors.ErrorCode.NOT_LEADER)))
            for b in request.buckets])

    def TriggerSnapshot(self, request, timeout=None):
        error = self._check("TriggerSnapshot", -1)
        if error:
            return pb.TriggerSnapshotResponse(error=error)
        return pb.TriggerSnapshotResponse(snapshots=[
            cpb.KvSnapshotPb(bucket=cpb.TableBucketPb(table_id=self.table.table_id, bucket=b), snapshot_id=1,
                             log_offset=len(self.rows.get(b, {}))) for b in request.buckets])


class FakeAdmin:
    """The assignment: ``leaders[bucket] = address`` ('' = not live); counts refreshes."""

    def __init__(self, table: TableInfo, leaders: dict[int, str]) -> None:
        self.table = table
        self.leaders = dict(leaders)
        self.refreshes = 0

    def get_table(self, path):
        if path != self.table.path:
            raise errors.TableNotExistError(f"table {path} does not exist")
        return self.table

    def get_table_assignment(self, table_id):
        self.refreshes += 1
        return self.table, {b: BucketLeader(b, 1 if a else -1, a, 0) for b, a in self.leaders.items()}


def fake_client(table: TableInfo, tablets: list[FakeTablet], leaders: dict[int, str], **kwargs):
    admin = FakeAdmin(table, leaders)
    sleeps: list[float] = []
    client = TableClient(admin, table.path, sleep=sleeps.append, **kwargs)
    by_address = {t.address: t for t in tablets}
    client.router.stub = lambda address: by_address[address]
    return client, admin, sleeps


@pytest.fixture
def two_tablets():
    a = FakeTablet("a:1", TABLE, {0, 2})
    b = FakeTablet("b:1", TABLE, {1, 3})
    client, admin, sleeps = fake_client(TABLE, [a, b], {0: "a:1", 1: "b:1", 2: "a:1", 3: "b:1"})
    yield client, admin, a, b, sleeps
    client.close()


# -- unit: splitting, round trip on fakes ------------------------------------------------------------


@pytest.mark.unit
def test_split_puts_every_row_in_its_bucket_and_keeps_order(two_tablets):
    client = two_tablets[0]
    batch = client.codec.to_batch([{"id": i, "v": str(i)} for i in range(500)])
    parts = client.split(batch)
    keys = client.codec.encode_keys(batch)
    seen = np.concatenate([indices for _, _, indices in parts])
    assert sorted(seen.tolist()) == list(range(500))
    for bucket, rows, indices in parts:
        assert rows.column("id").to_pylist() == indices.tolist()  # id == original index
        assert all(bucket_of(keys[i], 4) == bucket for i in indices.tolist())
        assert list(indices) == sorted(indices)  # stable


@pytest.mark.unit
def test_upsert_lookup_delete_on_fakes(two_tablets):
    client, admin, a, b, _ = two_tablets
    written = client.upsert([{"id": i, "v": f"v{i}"} for i in range(100)])
    assert sorted(written) == [0, 1, 2, 3] and sum(n for _, n in written.values()) == 100
    assert {m for m, _ in a.calls} == {"PutKv"} and {bk for _, bk in a.calls} <= {0, 2}
    assert client.lookup([5, 1000, 17, (3,), {"id": 99}]) == [
        {"id": 5, "v": "v5"}, None, {"id": 17, "v": "v17"}, {"id": 3, "v": "v3"}, {"id": 99, "v": "v99"}]
    deleted = client.delete([5, 6, 1000])
    assert sum(n for _, n in deleted.values()) == 2
    batch = client.lookup_batch(pa.record_batch({"id": pa.array([5, 7], pa.int64())}))
    assert batch.schema == client.codec.schema
    assert batch.to_pylist() == [{"id": None, "v": None}, {"id": 7, "v": "v7"}]
    assert client.list_offsets() == {0: (0, len(a.rows[0])), 1: (0, len(b.rows[1])), 2: (0, len(a.rows[2])),
                                     3: (0, len(b.rows[3]))}
    assert client.trigger_snapshot() == [CommittedSnapshot(bkt, 1, len((a.rows | b.rows)[bkt])) for bkt in range(4)]
    assert admin.refreshes == 1


@pytest.mark.unit
def test_composite_keys_and_big_batches_are_chunked(monkeypatch):
    import client.table as tc

    tablet = FakeTablet("a:1", COMPOSITE, {0, 1, 2})
    client, _, _ = fake_client(COMPOSITE, [tablet], {0: "a:1", 1: "a:1", 2: "a:1"})
    monkeypatch.setattr(tc, "MAX_REQUEST_BYTES", 2000)
    client.upsert([{"a": i, "b": f"s{i},x", "x": i / 2} for i in range(300)])
    assert sum(1 for m, _ in tablet.calls if m == "PutKv") > 3  # several requests per bucket
    assert client.lookup([(7, "s7,x"), {"a": 8, "b": "s8,x"}, (7, "nope")]) == [
        {"a": 7, "b": "s7,x", "x": 3.5}, {"a": 8, "b": "s8,x", "x": 4.0}, None]
    with pytest.raises(errors.InvalidRowError, match="expected 2 key value"):
        client.lookup([(7,)])
    with pytest.raises(errors.InvalidRowError, match="give a tuple or a dict"):
        client.delete([7])


@pytest.mark.unit
def test_bad_rows_are_rejected_before_sending(two_tablets):
    client, _, a, b, _ = two_tablets
    with pytest.raises(errors.InvalidRowError, match=r"row 1, column 'id': expected BIGINT"):
        client.upsert([{"id": 1, "v": "x"}, {"id": "two", "v": "y"}])
    with pytest.raises(errors.InvalidRowError, match=r"row 0, column 'nope': unknown column"):
        client.upsert([{"id": 1, "nope": 2}])
    with pytest.raises(errors.InvalidRowError, match="primary key is null"):
        client.upsert(pa.record_batch({"id": pa.array([1, None], pa.int64()), "v": pa.array(["a", "b"])}))
    with pytest.raises(errors.InvalidRowError, match="expected BIGINT"):
        client.delete(pa.record_batch({"id": pa.array([1], pa.int32())}))
    assert a.calls == [] and b.calls == []


# -- unit: routing and error mapping --------------------------------------------------------------------


@pytest.mark.unit
def test_not_leader_refreshes_the_assignment_and_retries_at_the_new_leader(two_tablets):
    client, admin, a, b, sleeps = two_tablets
    bucket = client.split(client.key_batch([1]))[0][0]
    old, new = (a, b) if bucket in a.buckets else (b, a)
    old.buckets.discard(bucket)
    new.buckets.add(bucket)
    admin.leaders[bucket] = new.address
    client.upsert([{"id": 1, "v": "x"}])
    assert ("PutKv", bucket) in old.calls and ("PutKv", bucket) in new.calls
    assert admin.refreshes == 2 and len(sleeps) == 1


@pytest.mark.unit
def test_leader_not_available_is_retried_then_raised_typed():
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3})
    client, admin, _ = fake_client(TABLE, [tablet], {0: "", 1: "a:1", 2: "a:1", 3: "a:1"}, retry_total_s=0.5)
    sleeps = []
    client.retry = client.retry.but(sleep=lambda s: (sleeps.append(s), time.sleep(s)))
    key = next(i for i in range(100) if client.split(client.key_batch([i]))[0][0] == 0)
    with pytest.raises(errors.LeaderNotAvailableError, match="bucket 0 of table db.t"):
        client.lookup([key])
    assert len(sleeps) >= 1 and admin.refreshes == 1 + len(sleeps)  # refreshed before every retry
    assert tablet.calls == []
    # the other buckets are fine, and bucket 0 works once its leader is back
    other = next(i for i in range(100) if client.split(client.key_batch([i]))[0][0] == 1)
    assert client.lookup([other]) == [None]
    admin.leaders[0] = "a:1"
    assert client.lookup([key]) == [None]


@pytest.mark.unit
def test_the_retry_budget_is_bounded():
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3})
    client, admin, _ = fake_client(TABLE, [tablet], {b: "" for b in range(4)}, retry_total_s=0.3)
    client.retry = client.retry.but(sleep=time.sleep)
    start = time.monotonic()
    with pytest.raises(errors.LeaderNotAvailableError):
        client.upsert([{"id": 1}])
    assert time.monotonic() - start < 3.0


@pytest.mark.unit
def test_unavailable_server_refreshes_and_retries(two_tablets):
    client, admin, a, b, _ = two_tablets
    a.fail = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
    b.fail = [grpc.StatusCode.UNAVAILABLE]
    client.upsert([{"id": i} for i in range(20)])
    assert admin.refreshes >= 2
    assert sum(len(r) for r in a.rows.values()) + sum(len(r) for r in b.rows.values()) == 20


@pytest.mark.unit
@pytest.mark.parametrize("failure, expected", [
    (errors.ErrorCode.INVALID_ROW, errors.InvalidRowError),
    (errors.ErrorCode.TABLE_NOT_EXIST, errors.TableNotExistError),
    (errors.ErrorCode.REQUEST_TIMED_OUT, errors.OutcomeUnknownError),
    (errors.ErrorCode.UNKNOWN, errors.UnknownServerError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.OutcomeUnknownError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.InvalidRequestError),
    (grpc.StatusCode.INTERNAL, errors.UnknownServerError),
])
def test_errors_are_typed_and_not_retried(failure, expected):
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3}, fail=[failure])
    client, admin, sleeps = fake_client(TABLE, [tablet], {b: "a:1" for b in range(4)})
    with pytest.raises(expected):
        client.upsert([{"id": 1}])
    assert sleeps == [] and len(tablet.calls) == 1


@pytest.mark.unit
def test_a_timed_out_lookup_is_retried():
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3}, fail=[grpc.StatusCode.DEADLINE_EXCEEDED])
    client, _, sleeps = fake_client(TABLE, [tablet], {b: "a:1" for b in range(4)})
    assert client.lookup([1]) == [None]
    assert len(sleeps) == 1


@pytest.mark.unit
def test_a_failed_bucket_reports_the_buckets_written(two_tablets):
    client, _, a, b, _ = two_tablets
    a.fail = [errors.ErrorCode.INVALID_ROW]  # the first request a gets
    rows = [{"id": i} for i in range(50)]
    with pytest.raises(errors.InvalidRowError) as info:
        client.upsert(rows)
    written = info.value.details["written"]
    assert set(written) >= b.buckets and info.value.details["bucket"] in a.buckets


@pytest.mark.unit
def test_list_offsets_checks_bucket_numbers(two_tablets):
    client = two_tablets[0]
    with pytest.raises(errors.BucketOutOfRangeError):
        client.list_offsets([4])
    assert client.list_offsets([1]) == {1: (0, 0)}


# -- zk: a real coordinator and real tablet servers in-process -------------------------------------------


class LocalCluster:
    """One coordinator and tablet servers (ids 1..N) in this process; tablets can stop and restart."""

    def __init__(self, make_config, base_dir, tablets: int) -> None:
        from client.admin import AdminClient
        from coordinator.server import CoordinatorServer

        self.make_config = make_config
        self.base_dir = base_dir
        self.coordinator = CoordinatorServer(make_config()).start()
        self.tablets = {}
        assert self.coordinator.wait_active(30), "no active coordinator"
        self.admin = AdminClient([self.coordinator.address], retry_total_s=10)
        for i in range(1, tablets + 1):
            self.start_tablet(i)

    def tablet_config(self, i: int):
        return self.make_config({"tablet.id": i, "tablet.port": 0, "tablet.data-dir": str(self.base_dir / f"t{i}"),
                                 "log.flush.fsync": False, "kv.snapshot.interval": "1h"})

    def start_tablet(self, i: int):
        from tablet.server import TabletServer

        self.tablets[i] = TabletServer(self.tablet_config(i)).start()
        self.wait_for(lambda: i in {s.id for s in self.admin.list_tablet_servers()}, f"tablet {i} registered")
        return self.tablets[i]

    def stop_tablet(self, i: int) -> None:
        self.tablets.pop(i).stop()
        self.wait_for(lambda: i not in {s.id for s in self.admin.list_tablet_servers()}, f"tablet {i} gone")

    @staticmethod
    def wait_for(predicate, what: str, timeout_s: float = 30.0):
        deadline = time.monotonic() + timeout_s
        while not (value := predicate()):
            assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
            time.sleep(0.05)
        return value

    def create_table(self, path: str, columns, primary_key, buckets: int) -> TableInfo:
        info = self.admin.create_table(path, columns, primary_key, buckets)

        def led():  # every bucket has a live leader
            _, leaders = self.admin.get_table_assignment(info.table_id)
            return len(leaders) == buckets and all(b.leader_address for b in leaders.values())
        self.wait_for(led, f"{path}: every bucket led")
        return info

    def close(self) -> None:
        for server in self.tablets.values():
            server.stop()
        self.admin.close()
        self.coordinator.stop()


@pytest.fixture
def local_cluster(make_config, tmp_path):
    clusters = []

    def make(tablets: int = 2) -> LocalCluster:
        clusters.append(LocalCluster(make_config, tmp_path, tablets))
        return clusters[-1]

    yield make
    for cluster in clusters:
        cluster.close()


ROWS_COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


def test_round_trip_over_several_buckets(local_cluster):
    cluster = local_cluster(2)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 6)
    with TableClient(cluster.admin, "db.t") as client:
        assert len(set(client.leaders().values())) == 2
        written = client.upsert([{"id": i, "v": f"v{i}"} for i in range(2000)])
        assert sorted(written) == list(range(6))
        assert sum(end - base for base, end in written.values()) == 2000  # one +I each
        rows = client.lookup(list(range(-5, 2005)))
        assert rows[:5] == [None] * 5 and rows[-5:] == [None] * 5
        assert rows[5:2005] == [{"id": i, "v": f"v{i}"} for i in range(2000)]
        client.upsert(pa.record_batch({"v": pa.array(["new"] * 10), "id": pa.array(range(10), pa.int64())}))
        deleted = client.delete(list(range(5, 15)) + [99999])
        assert sum(end - base for base, end in deleted.values()) == 10
        assert client.lookup([0, 4, 5, 14, 15]) == [{"id": 0, "v": "new"}, {"id": 4, "v": "new"}, None, None,
                                                    {"id": 15, "v": "v15"}]
        offsets = client.list_offsets()
        assert sorted(offsets) == list(range(6)) and all(earliest == 0 for earliest, _ in offsets.values())
        assert sum(latest for _, latest in offsets.values()) == 2000 + 2 * 10 + 10
        committed = client.trigger_snapshot(wait=True)
        assert [s.bucket for s in committed] == list(range(6))
        assert all(s.log_offset == offsets[s.bucket][1] for s in committed)
        listed = {(s.bucket.bucket, s.snapshot_id) for s in cluster.admin.list_kv_snapshots(client.table.table_id)}
        assert {(s.bucket, s.snapshot_id) for s in committed} <= listed
        assert client.trigger_snapshot(wait=True) == []  # nothing changed since


def test_bad_rows_are_rejected_by_the_client_and_by_the_server(local_cluster):
    cluster = local_cluster(1)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 2)
    with TableClient(cluster.admin, "db.t") as client:
        client.upsert([{"id": 1, "v": "one"}])
        before = client.list_offsets()
        with pytest.raises(errors.InvalidRowError, match=r"row 1, column 'id': expected BIGINT"):
            client.upsert([{"id": 2, "v": "two"}, {"id": "3", "v": "three"}])
        # the same kinds of bad batch, sent straight to the server
        address = client.leaders()[0]
        bad_batches = [
            pa.record_batch({"id": pa.array([2, 3], pa.int32()), "v": pa.array(["a", "b"])}),  # wrong type
            pa.record_batch({"id": pa.array([2, None], pa.int64()), "v": pa.array(["a", "b"])}),  # null key
            pa.record_batch({"id": pa.array([2], pa.int64()), "zzz": pa.array(["a"])}),  # unknown column
        ]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.TabletServiceStub(channel)
            for batch in bad_batches:
                response = stub.PutKv(pb.PutKvRequest(table_id=client.table.table_id, bucket=0,
                                                      upserts=batch_to_ipc(batch)), timeout=10)
                assert response.error.code == errors.ErrorCode.INVALID_ROW, response
            response = stub.PutKv(pb.PutKvRequest(table_id=client.table.table_id, bucket=0, upserts=b"not arrow"),
                                  timeout=10)
            assert response.error.code == errors.ErrorCode.INVALID_ROW
        assert client.list_offsets() == before
        assert client.lookup([1, 2, 3]) == [{"id": 1, "v": "one"}, None, None]


def test_fetch_log_shows_every_change_with_before_images(local_cluster):
    cluster = local_cluster(1)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 1)
    with TableClient(cluster.admin, "db.t") as client:
        assert client.fetch_log(0, 0) == ([], 0)
        client.upsert([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
        client.upsert([{"id": 1, "v": "A"}])
        client.delete([2, 3])
        records, end = client.fetch_log(0, 0)
        assert end == 5
        assert records == [
            {"offset": 0, "change_type": "+I", "row": {"id": 1, "v": "a"}},
            {"offset": 1, "change_type": "+I", "row": {"id": 2, "v": "b"}},
            {"offset": 2, "change_type": "-U", "row": {"id": 1, "v": "a"}},
            {"offset": 3, "change_type": "+U", "row": {"id": 1, "v": "A"}},
            {"offset": 4, "change_type": "-D", "row": {"id": 2, "v": "b"}},
        ]
        assert client.fetch_log(0, 3)[0] == records[3:]  # from the middle of an entry
        first, _ = client.fetch_log(0, 0, max_bytes=1)  # at least one entry, however small max_bytes
        assert first and first[0]["offset"] == 0
        assert client.fetch_log(0, 5) == ([], 5)
        batch, _ = client.fetch_log_batch(0, 2)
        assert batch.schema.names == ["offset", "change_type", "id", "v"]
        assert client.list_offsets() == {0: (0, 5)}
        with pytest.raises(errors.InvalidRequestError):
            client.fetch_log(0, 99)


def test_a_stopped_leader_is_a_typed_error_and_a_restarted_one_serves_again(local_cluster):
    cluster = local_cluster(2)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 4)
    with TableClient(cluster.admin, "db.t", retry_total_s=1.5) as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(400)])
        _, leaders = cluster.admin.get_table_assignment(client.table.table_id)
        on_1 = {b for b, leader in leaders.items() if leader.leader_id == 1}
        assert on_1 and len(on_1) < 4
        keys_on_1 = [i for i in range(400) if client.split(client.key_batch([i]))[0][0] in on_1]
        keys_elsewhere = [i for i in range(400) if i not in set(keys_on_1)]
        old_address = cluster.tablets[1].address

        cluster.stop_tablet(1)
        start = time.monotonic()
        with pytest.raises(errors.LeaderNotAvailableError):
            client.lookup(keys_on_1[:3])
        assert time.monotonic() - start < 10
        with pytest.raises(errors.LeaderNotAvailableError):
            client.upsert([{"id": keys_on_1[0], "v": "lost?"}])
        assert client.lookup(keys_elsewhere[:3]) == [{"id": i, "v": f"v{i}"} for i in keys_elsewhere[:3]]

        cluster.start_tablet(1)  # same data dir, a new port: the client finds it by refreshing
        assert cluster.tablets[1].address != old_address
        rows = client.lookup(list(range(400)))
        assert rows == [{"id": i, "v": f"v{i}"} for i in range(400)]
        client.upsert([{"id": keys_on_1[0], "v": "back"}])
        assert client.lookup([keys_on_1[0]]) == [{"id": keys_on_1[0], "v": "back"}]


def test_a_request_waits_out_a_restart_within_its_budget(local_cluster):
    cluster = local_cluster(1)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 2)
    with TableClient(cluster.admin, "db.t", retry_total_s=30) as client:
        client.upsert([{"id": 1, "v": "x"}])
        cluster.stop_tablet(1)
        result = {}
        thread = threading.Thread(target=lambda: result.update(rows=client.lookup([1, 2])))
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()  # still retrying
        cluster.start_tablet(1)
        thread.join(30)
        assert result["rows"] == [{"id": 1, "v": "x"}, None]
