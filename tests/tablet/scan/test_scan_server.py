"""Live KV scans on a real tablet server + coordinator on ZooKeeper (in-process, real gRPC)."""

from __future__ import annotations

import os
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from prometheus_client import generate_latest

from kvlease.common.errors import ErrorCode
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.model import TableBucket
from kvlease.tablet.scan import batch as scan_batch
from kvlease.common.codec import RowCodec, bucket_of, ipc_to_batch
from kvlease.ops.wait import wait_until
from tests.tablet.test_tablet_server import SCHEMA, Cluster, put
from tests.tablet.test_tablet_server import cluster  # noqa: F401  (the fixture)

pytestmark = pytest.mark.zk
E = ErrorCode


class Scan:
    """One tablet server leading every bucket of ``table``, and helpers to scan it."""

    def __init__(self, c: Cluster, tmp_path, buckets=1):
        self.c = c
        self.tablet = c.tablet(1, tmp_path / "t1")
        self.table = c.admin.create_table(f"db.scan{random.randrange(1 << 30)}", SCHEMA, ["id"], buckets)
        self.stubs = [c.stub(self.table.table_id, b) for b in range(buckets)]
        self.stub = self.stubs[0]
        self.codec = RowCodec(self.table)
        self.service = self.tablet.scans

    def open(self, bucket=0, size=1 << 20, limit=None, after=None, table_id=None):
        req = pb.BucketScanReqPb(table_id=self.table.table_id if table_id is None else table_id, bucket=bucket)
        if limit is not None:
            req.limit = limit
        if after is not None:
            req.start_after_key = after
        return self.stub.ScanKv(pb.ScanKvRequest(bucket_scan_req=req, batch_size_bytes=size), timeout=30)

    def next(self, sid, seq, size=1 << 20):
        return self.stub.ScanKv(pb.ScanKvRequest(scanner_id=sid, call_seq_id=seq, batch_size_bytes=size), timeout=30)

    def close(self, sid):
        return self.stub.ScanKv(pb.ScanKvRequest(scanner_id=sid, close_scanner=True), timeout=30)

    def values(self, response) -> list[bytes]:
        batch = ipc_to_batch(response.records)
        assert batch.schema.names == ["value"] and batch.num_rows == response.record_count
        return batch.column(0).to_pylist()

    def rows(self, values) -> list[dict]:
        return self.codec.decode_values(pa.array(values, pa.binary())).to_pylist() if values else []

    def scan_all(self, bucket=0, size=1 << 20, limit=None, after=None):
        """(rows, log_offset, responses) of a whole unary scan."""
        first = self.open(bucket, size, limit, after)
        assert not first.error.code, first.error.message
        responses, seq, response = [first], 0, first
        while response.has_more_results:
            response = self.next(first.scanner_id, seq, size)
            assert not response.error.code, response.error.message
            responses.append(response)
            seq += 1
        values = [v for r in responses for v in self.values(r)]
        return self.rows(values), first.log_offset, responses

    def counts(self):
        return self.service.counts()


def ids_rows(n, start=0, width=20):
    return [{"id": i, "v": f"v{i}-" + "x" * width} for i in range(start, start + n)]


@pytest.fixture
def scans(cluster, tmp_path):  # noqa: F811
    def make(overrides=None, buckets=1):
        return Scan(cluster(overrides), tmp_path, buckets)
    return make


@pytest.fixture
def blocking(monkeypatch):
    """Make batch building wait on ``gate`` while ``armed`` is set (a call stays in progress);
    turn the service's read-ahead off in the test, or the next batch is already built."""
    armed, gate, entered = threading.Event(), threading.Event(), threading.Event()

    def waiting(original):
        def read(*args, **kwargs):
            if armed.is_set():
                entered.set()
                assert gate.wait(30)
            return original(*args, **kwargs)
        return read

    monkeypatch.setattr(scan_batch, "read_batch", waiting(scan_batch.read_batch))  # replays, fallbacks
    monkeypatch.setattr(scan_batch.ValueReader, "read", waiting(scan_batch.ValueReader.read))  # forward reads
    return armed, gate, entered


# --- forms, batches, replay ------------------------------------------------------------------

def test_invalid_forms_and_unknown_ids_get_typed_errors(scans):
    s = scans()
    put(s.stub, s.table, ids_rows(10))
    req = pb.BucketScanReqPb(table_id=s.table.table_id, bucket=0)
    bad = [
        pb.ScanKvRequest(bucket_scan_req=req, scanner_id=b"x" * 16, batch_size_bytes=100),  # both
        pb.ScanKvRequest(batch_size_bytes=100),  # neither
        pb.ScanKvRequest(close_scanner=True),  # close without an id
        pb.ScanKvRequest(bucket_scan_req=req, close_scanner=True),  # close with bucket_scan_req
        pb.ScanKvRequest(bucket_scan_req=req),  # no batch size
        pb.ScanKvRequest(bucket_scan_req=req, batch_size_bytes=-1),
        pb.ScanKvRequest(bucket_scan_req=pb.BucketScanReqPb(table_id=s.table.table_id, bucket=0, limit=-1),
                         batch_size_bytes=100),
    ]
    for request in bad:
        assert s.stub.ScanKv(request, timeout=10).error.code == E.INVALID_SCAN_REQUEST, request
    first = s.open(size=1)
    assert first.has_more_results
    assert s.next(first.scanner_id, 0, size=0).error.code == E.INVALID_SCAN_REQUEST
    assert s.next(first.scanner_id, 0, size=1).error.code == 0  # the session survived the bad request
    assert s.next(b"n" * 16, 0).error.code == E.UNKNOWN_SCANNER_ID
    assert s.next(b"", 0).error.code == E.UNKNOWN_SCANNER_ID
    closed = s.close(b"n" * 16)  # closing an unknown scanner succeeds
    assert closed.error.code == 0 and not closed.has_more_results
    assert s.close(first.scanner_id).error.code == 0
    assert s.next(first.scanner_id, 1).error.code == E.UNKNOWN_SCANNER_ID
    assert s.open(bucket=5).error.code == E.NOT_LEADER
    assert s.open(table_id=987654).error.code == E.NOT_LEADER
    assert s.counts() == (0, {}, 0)


def test_full_scan_in_small_batches_resume_keys_and_replay(scans):
    s = scans()
    put(s.stub, s.table, ids_rows(3000))
    put(s.stub, s.table, [{"id": 5, "v": "new"}], delete_keys=[{"id": 7}])
    size = 8 << 10
    first = s.open(size=size)
    assert first.error.code == 0 and len(first.scanner_id) == 16 and first.has_more_results
    assert first.HasField("log_offset") and first.log_offset == 3003  # 3000 +I, -U +U, -D
    assert s.counts()[0] == 1
    responses, seq, response = [first], 0, first
    while response.has_more_results:
        response = s.next(first.scanner_id, seq, size)
        assert response.error.code == 0, response.error.message
        again = s.next(first.scanner_id, seq, size)  # a retry of the same call: the same batch
        assert again.SerializeToString() == response.SerializeToString()
        if response.has_more_results:
            assert s.next(first.scanner_id, seq + 2, size).error.code == E.INVALID_SCAN_REQUEST
            assert s.next(first.scanner_id, seq - 1, size).error.code == E.INVALID_SCAN_REQUEST
        responses.append(response)
        seq += 1
    assert len(responses) > 5
    for r in responses:
        assert 0 < r.record_count and len(r.records) <= size
        keys = s.codec.encode_keys(s.codec.decode_values(pa.array(s.values(r), pa.binary())).select(["id"]))
        assert r.resume_key == keys[-1]
    keys = [k for r in responses for k in s.codec.encode_keys(
        s.codec.decode_values(pa.array(s.values(r), pa.binary())).select(["id"]))]
    assert keys == sorted(keys) and len(set(keys)) == 2999
    rows = s.rows([v for r in responses for v in s.values(r)])
    expected = {r["id"]: r["v"] for r in ids_rows(3000)}
    expected[5] = "new"
    del expected[7]
    assert {r["id"]: r["v"] for r in rows} == expected
    # the last batch closed the session (a retry of it still gets it)
    assert s.counts() == (0, {}, 0)
    assert s.next(first.scanner_id, seq, size).error.code == E.UNKNOWN_SCANNER_ID
    assert s.next(first.scanner_id, seq - 2, size).error.code == E.UNKNOWN_SCANNER_ID
    # a resumed scan: only keys after the resume key (a new snapshot)
    after = responses[2].resume_key
    rest, _, _ = s.scan_all(after=after)
    assert [s.codec.encode_keys(s.codec.to_batch([r]).select(["id"]))[0] for r in rest] == \
        [k for k in keys if k > after]


def test_a_replay_is_read_again_from_the_snapshot_and_only_a_last_batch_is_kept(scans):
    s = scans()
    put(s.stub, s.table, ids_rows(3000))
    size = 8 << 10
    first = s.open(size=size)
    sid = first.scanner_id
    put(s.stub, s.table, [{"id": i, "v": "changed"} for i in range(3000)])  # after the snapshot: not seen
    session = s.service._sessions[sid]
    values, seq, response = s.values(first), 0, first
    while response.has_more_results:
        response = s.next(sid, seq, size)
        assert response.error.code == 0, response.error.message
        if response.has_more_results:  # a live session keeps how to read the batch again, not the batch
            wait_until(lambda: session.ahead is not None, 10, "the read-ahead")  # the iterator is past it
            assert session.last.call == seq and session.last.answer is None
        again = s.next(sid, seq, 1)  # another size on the retry: still the same batch, byte for byte
        assert again.SerializeToString() == response.SerializeToString()
        values += s.values(response)
        seq += 1
    rows = s.rows(values)
    assert sorted(r["id"] for r in rows) == list(range(3000)) and {r["v"] for r in rows} != {"changed"}
    assert s.counts() == (0, {}, 0)  # the last batch ended the session; its answer is kept for a retry
    assert pb.ScanKvResponse.FromString(s.service._finished[sid].last.answer.data) == response
    assert s.next(sid, seq - 1, size).SerializeToString() == response.SerializeToString()
    kept = s.service._finished_bytes
    stream = list(s.stub.ScanKvStream(pb.ScanKvStreamRequest(
        bucket_scan_req=pb.BucketScanReqPb(table_id=s.table.table_id, bucket=0), batch_size_bytes=size), timeout=30))
    assert sum(r.record_count for r in stream) == 3000 and not any(r.scanner_id for r in stream)
    assert s.service._finished_bytes == kept  # a stream has no replay: nothing kept of it


def test_read_ahead_is_used_or_dropped_when_the_size_changes(scans):
    s = scans()
    put(s.stub, s.table, ids_rows(2000))
    sizes = [1, 1, 700, 700, 5000, 1, 64 << 10, 3000, 3000]
    first = s.open(size=sizes[0], limit=1500)
    values, seq, response = s.values(first), 0, first
    while response.has_more_results:
        session = s.service._sessions[first.scanner_id]
        wait_until(lambda: session.ahead is not None, 10, "the read-ahead")
        response = s.next(first.scanner_id, seq, sizes[(seq + 1) % len(sizes)])
        assert response.error.code == 0, response.error.message
        values += s.values(response)
        seq += 1
    assert [r["id"] for r in s.rows(values)] == sorted(range(2000), key=lambda i: s.codec.encode_keys(
        s.codec.to_batch([{"id": i}]).select(["id"]))[0])[:1500]
    text = generate_latest(s.service.metrics.registry).decode()
    used = float(text.split('kvlease_scan_read_ahead_total{outcome="used"} ')[1].split()[0])
    dropped = float(text.split('kvlease_scan_read_ahead_total{outcome="dropped"} ')[1].split()[0])
    assert used + dropped == seq and used >= 2 and dropped >= 3
    assert s.counts() == (0, {}, 0)


def test_empty_bucket_limit_and_one_huge_row_per_batch(scans):
    s = scans()
    first = s.open()
    assert first.error.code == 0 and not first.has_more_results and first.scanner_id == b""
    assert first.HasField("log_offset") and first.log_offset == 0 and first.record_count == 0
    assert s.values(first) == []
    assert s.counts() == (0, {}, 0)
    put(s.stub, s.table, ids_rows(100) + [{"id": 1000, "v": "y" * 50_000}])
    rows, offset, responses = s.scan_all(size=1, limit=37)
    assert len(rows) == 37 and offset == 101 and all(r.record_count == 1 for r in responses)
    assert len(s.scan_all(limit=0)[0]) == 0
    rows, _, responses = s.scan_all(size=1000)
    assert len(rows) == 101 and responses[-1].record_count == 1  # the big row alone, beyond the batch size
    assert s.counts() == (0, {}, 0)


def test_effective_batch_size_is_capped_by_the_server(scans):
    s = scans({"kv.scanner.max-batch-size": "4kb"})
    put(s.stub, s.table, ids_rows(2000))
    rows, _, responses = s.scan_all(size=1 << 30)
    assert len(rows) == 2000 and all(len(r.records) <= 4096 for r in responses) and len(responses) > 10


# --- concurrency, TTL, limits ----------------------------------------------------------------------

def test_a_concurrent_request_is_refused_and_the_session_still_works(scans, blocking):
    armed, gate, entered = blocking
    s = scans()
    s.service.read_ahead = False
    put(s.stub, s.table, ids_rows(50))
    first = s.open(size=1)
    armed.set()
    pending = s.stub.ScanKv.future(pb.ScanKvRequest(scanner_id=first.scanner_id, call_seq_id=0,
                                                    batch_size_bytes=1), timeout=30)
    assert entered.wait(10)
    for seq in (0, 1, -1):
        response = s.next(first.scanner_id, seq, 1)
        assert response.error.code == E.INVALID_SCAN_REQUEST and "in progress" in response.error.message
    armed.clear()
    gate.set()
    assert pending.result().error.code == 0 and pending.result().record_count == 1
    assert s.next(first.scanner_id, 1, 1).error.code == 0
    assert s.close(first.scanner_id).error.code == 0
    assert s.counts() == (0, {}, 0)


def test_idle_scanner_expires_on_access(scans):
    s = scans({"kv.scanner.ttl": "300ms", "kv.scanner.expiration-interval": "1h"})
    put(s.stub, s.table, ids_rows(10))
    first = s.open(size=1)
    assert s.next(first.scanner_id, 0, 1).error.code == 0
    time.sleep(0.45)  # past the ttl (300 ms): the scanner is idle that long
    assert s.counts()[0] == 1  # no reaper ran
    assert s.next(first.scanner_id, 1, 1).error.code == E.SCANNER_EXPIRED
    assert s.counts() == (0, {}, 0)
    assert s.next(first.scanner_id, 1, 1).error.code == E.SCANNER_EXPIRED
    time.sleep(0.65)  # more than 2 x ttl after the expiry
    assert s.next(first.scanner_id, 1, 1).error.code == E.UNKNOWN_SCANNER_ID


def test_reaper_frees_idle_scanners(scans):
    s = scans({"kv.scanner.ttl": "300ms", "kv.scanner.expiration-interval": "100ms", "metrics.port": 0})
    put(s.stub, s.table, ids_rows(10))
    sids = [s.open(size=1).scanner_id for _ in range(3)]
    assert s.counts()[0] == 3 and s.counts()[2] == 3
    wait_until(lambda: s.counts() == (0, {}, 0), 5, "the reaper to free the idle scanners")
    assert {s.next(sid, 0, 1).error.code for sid in sids} == {E.SCANNER_EXPIRED}
    with urllib.request.urlopen(f"http://127.0.0.1:{s.tablet.metrics_port}/metrics", timeout=10) as page:
        text = page.read().decode()
    assert "kvlease_scanners_expired_total 3.0" in text and "kvlease_scanners_open 0.0" in text


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_limits_hold_under_1000_concurrent_opens_and_everything_is_freed(scans):
    s = scans({"kv.scanner.max-per-bucket": 8, "kv.scanner.max-per-server": 20}, buckets=4)
    keys = s.codec.encode_keys(s.codec.to_batch([{"id": i} for i in range(200)]).select(["id"]))
    for b in range(4):  # five rows of each bucket, written to their bucket
        ids = [i for i, key in enumerate(keys) if bucket_of(key, 4) == b][:5]
        put(s.stubs[b], s.table, [{"id": i, "v": f"v{i}"} for i in ids], bucket=b)

    def storm(n, buckets):  # n opens at once from 200 client threads
        with ThreadPoolExecutor(max_workers=200) as pool:
            return list(pool.map(lambda i: s.open(bucket=buckets[i % len(buckets)], size=1), range(n)))

    def close_all(responses):
        for r in responses:
            if r.scanner_id:
                assert s.close(r.scanner_id).error.code == 0

    close_all(storm(50, [0, 1, 2, 3]))  # warm up: every SST opened, threads and channels made
    baseline = _fd_count()
    # one bucket: exactly max-per-bucket succeed
    responses = storm(1000, [0])
    codes = [r.error.code for r in responses]
    assert codes.count(0) == 8 and codes.count(E.TOO_MANY_SCANNERS) == 992
    assert s.counts()[:2] == (8, {s_bucket(s, 0): 8})
    close_all(responses)
    # four buckets: exactly max-per-server succeed, no bucket over its limit
    responses = storm(1000, [0, 1, 2, 3])
    codes = [r.error.code for r in responses]
    assert codes.count(0) == 20 and codes.count(E.TOO_MANY_SCANNERS) == 980
    total, per_bucket, snapshots = s.counts()
    assert total == 20 == snapshots and max(per_bucket.values()) <= 8
    text = generate_latest(s.service.metrics.registry).decode()
    assert "kvlease_scanners_open 20.0" in text and 'kvlease_bucket_scanners_open{bucket="0"' in text
    # a stream counts against the same limits
    stream = list(s.stub.ScanKvStream(pb.ScanKvStreamRequest(
        bucket_scan_req=pb.BucketScanReqPb(table_id=s.table.table_id, bucket=0), batch_size_bytes=1), timeout=10))
    assert [r.error.code for r in stream] == [E.TOO_MANY_SCANNERS]
    close_all(responses)
    assert s.counts() == (0, {}, 0)
    wait_until(lambda: _fd_count() <= baseline, 5, f"open files back to {baseline} (now {_fd_count()})")
    assert "kvlease_scanners_open 0.0" in generate_latest(s.service.metrics.registry).decode()


def s_bucket(s, b):
    return TableBucket(s.table.table_id, b)
