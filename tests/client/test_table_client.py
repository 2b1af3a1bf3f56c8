"""The table client: bucket splitting, routing and error mapping, on fake tablet servers.

The tests replace the router's gRPC stubs with :class:`FakeTablet` objects
that answer like a tablet server (a dict per bucket). The same client
against real servers: ``test_table_client_cluster.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import pyarrow as pa
import pytest

from kvlease.common import errors, lookup_wire
from kvlease.common.proto import coordinator_pb2 as cpb
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import Column, TableInfo
from kvlease.client.admin import BucketLeader
from kvlease.client.table import CommittedSnapshot, TableClient
from kvlease.common.codec import RowCodec, batch_to_ipc, bucket_of, ipc_to_batch
from kvlease.common.logentry import ChangeType, decode_entry, encode_payload, frame_header, record_batch
from tests.tablet.log.test_changelog_timestamps import frame_v1

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
    writers: list[tuple[int, int]] = field(default_factory=list)  # PutKv's (writer_id, sequence), in order
    log: dict[int, list[bytes]] = field(default_factory=dict)  # framed changelog entries per bucket
    timestamps: bool = True  # answers ListOffsets by timestamp (False: a server from before it)

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
        self.writers.append((request.writer_id, request.sequence))
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
        if request.key_offsets:  # packed (client/point_lookup.py): stored values answered
            keys = lookup_wire.unpack(request.key_data, request.key_offsets, "keys").to_pylist()
            rows = [store.get(k) for k in keys]
            found = [r for r in rows if r is not None]
            values = pa.array(codec.encode_values(pa.RecordBatch.from_pylist(found, schema=codec.schema)) if found
                              else [], pa.binary())
            data, offsets = lookup_wire.pack(values)
            return pb.LookupResponse(values=data, value_offsets=offsets, schema_id=self.table.schema_id,
                                     found_mask=lookup_wire.pack_mask(np.array([r is not None for r in rows])))
        rows = [store.get(k) for k in codec.encode_keys(ipc_to_batch(request.keys))]
        found = [r for r in rows if r is not None]
        return pb.LookupResponse(rows=batch_to_ipc(pa.RecordBatch.from_pylist(found, schema=codec.schema)),
                                 found=[r is not None for r in rows])

    def ListOffsets(self, request, timeout=None):
        error = self._check("ListOffsets", -1)
        if error:
            return pb.ListOffsetsResponse(error=error)
        found = request.timestamp + 1000 if request.HasField("timestamp") and self.timestamps else None
        return pb.ListOffsetsResponse(offsets=[
            pb.BucketOffsetsPb(bucket=b, earliest=0, latest=len(self.rows.get(b, {})), timestamp_offset=found)
            if b in self.buckets else
            pb.BucketOffsetsPb(bucket=b, error=cpb.ErrorPb(code=int(errors.ErrorCode.NOT_LEADER)))
            for b in request.buckets])

    def FetchLog(self, request, timeout=None):
        error = self._check("FetchLog", request.bucket)
        if error:
            return pb.FetchLogResponse(error=error)
        entries = self.log.get(request.bucket, [])
        return pb.FetchLogResponse(entries=entries, log_start_offset=0,
                                   log_end_offset=sum(decode_entry(e).count for e in entries))

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
    import kvlease.client.table_writes as tc

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
    with pytest.raises(errors.InvalidRowError, match=r"expected BIGINT \(int64\), got uint64 \(values could be lost"):
        client.delete(pa.record_batch({"id": pa.array([1], pa.uint64())}))  # (an int32 is a safe widening)
    assert a.calls == [] and b.calls == []


@pytest.mark.unit
@pytest.mark.parametrize("call", ["upsert", "delete", "lookup", "lookup_batch"])
@pytest.mark.parametrize("bad", [None, 5, "abc", b"ab", {"id": 1, "v": "x"}])
def test_one_value_or_row_where_a_list_belongs_is_refused_before_sending(two_tablets, call, bad):
    client, _, a, b, _ = two_tablets  # a str or a dict was taken apart into characters or column names
    with pytest.raises(errors.InvalidRowError, match=rf"must be a list of .*got {type(bad).__name__} .*put a single"):
        getattr(client, call)(bad)
    assert a.calls == [] and b.calls == []


@pytest.mark.unit
def test_scanner_arguments_of_the_wrong_type_are_typed_errors(two_tablets):
    client = two_tablets[0]
    with pytest.raises(errors.BucketOutOfRangeError, match=r"buckets 0..3, not 'x'"):
        client.scanner("x")
    with pytest.raises(errors.BucketOutOfRangeError, match=r"not True"):
        client.scanner(True)
    with pytest.raises(errors.InvalidScanRequestError, match=r"start_after_key must be bytes .* got str 'abc'"):
        client.scanner(0, start_after_key="abc")
    with pytest.raises(errors.InvalidScanRequestError, match=r"batch_size_bytes must be an int > 0, got '1'"):
        client.scanner(0, batch_size_bytes="1")
    with client.scanner(0, start_after_key=bytearray(b"k")) as scanner:  # nothing sent before the first poll
        assert scanner.start_after_key == b"k" and type(scanner.start_after_key) is bytes


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
    client.retry = client.retry.but(sleep=lambda s: (sleeps.append(s), time.sleep(s)))  # the budget: real time
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
@pytest.mark.parametrize("call", ["upsert", "lookup"])
def test_a_call_the_server_cancelled_as_it_stopped_is_retried(call):
    """A gRPC server that stops answers CANCELLED to the calls reaching it at that moment (seen in the
    disk-loss and rolling-restart drills: a write and a scan failed with UnknownServerError): the call is
    retried (writes are idempotent), not failed."""
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3}, fail=[grpc.StatusCode.CANCELLED])
    client, _, sleeps = fake_client(TABLE, [tablet], {b: "a:1" for b in range(4)})
    if call == "upsert":
        client.upsert([{"id": 1, "v": "x"}])
        assert client.lookup([1])[0]["v"] == "x"
    else:
        assert client.lookup([1]) == [None]
    assert len(sleeps) == 1


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


# -- changelog append times --------------------------------------------------------------------------


def changelog_records(codec: RowCodec, rows: list[dict]) -> pa.RecordBatch:
    batch = codec.to_batch(rows)
    keys, values = codec.encode(batch)
    return record_batch([ChangeType.INSERT] * len(rows), keys, values)


@pytest.mark.unit
def test_fetch_log_gives_each_record_its_entry_time_and_none_for_v1_entries():
    # a table with a column named like a record column: the client picks the table's columns by position
    table = TableInfo(11, "db", "ts", (Column("id", "BIGINT"), Column("timestamp", "STRING")), ("id",), 1)
    tablet = FakeTablet("a:1", table, {0})
    codec = RowCodec(table)
    old = changelog_records(codec, [{"id": 1, "timestamp": "one"}, {"id": 2, "timestamp": "two"}])
    new = changelog_records(codec, [{"id": 3, "timestamp": "three"}])
    payload = encode_payload(new)
    tablet.log[0] = [frame_v1(0, old), frame_header(2, 1, payload, 1_700_000_000_007) + payload.to_pybytes()]
    client, _, _ = fake_client(table, [tablet], {0: "a:1"})
    with client:
        batch, end = client.fetch_log_batch(0, 0)
        assert end == 3
        assert batch.schema.names == ["offset", "change_type", "timestamp", "id", "timestamp"]
        assert batch.schema.field(2).type == pa.int64() and batch.schema.field(2).nullable
        assert batch.column(2).to_pylist() == [None, None, 1_700_000_000_007]
        records, _ = client.fetch_log(0, 1)
        assert records == [
            {"offset": 1, "change_type": "+I", "timestamp": None, "row": {"id": 2, "timestamp": "two"}},
            {"offset": 2, "change_type": "+I", "timestamp": 1_700_000_000_007, "row": {"id": 3, "timestamp": "three"}}]
        tablet.log[0] = []
        empty, _ = client.fetch_log_batch(0, 0)
        assert empty.num_rows == 0 and empty.schema.names == batch.schema.names


@pytest.mark.unit
def test_list_offsets_by_timestamp(two_tablets):
    client, _, a, b, _ = two_tablets
    assert client.list_offsets(timestamp=5) == {0: 1005, 1: 1005, 2: 1005, 3: 1005}
    assert client.list_offsets([2], timestamp=np.int64(7)) == {2: 1007}
    assert client.list_offsets([1]) == {1: (0, 0)}  # without a timestamp: unchanged
    assert {m for m, _ in a.calls + b.calls} == {"ListOffsets"}


@pytest.mark.unit
@pytest.mark.parametrize("bad", [-1, "5", 1.5, True])
def test_list_offsets_refuses_a_bad_timestamp_before_sending(two_tablets, bad):
    client, _, a, b, _ = two_tablets
    with pytest.raises(errors.InvalidRequestError, match="timestamp"):
        client.list_offsets(timestamp=bad)
    assert a.calls == b.calls == []


@pytest.mark.unit
def test_list_offsets_by_timestamp_on_a_server_without_it_is_a_clear_error(two_tablets):
    client, _, a, _, sleeps = two_tablets
    a.timestamps = False
    with pytest.raises(errors.UnknownServerError, match="does not support ListOffsets by timestamp"):
        client.list_offsets([0], timestamp=5)
    assert sleeps == []  # not retried
