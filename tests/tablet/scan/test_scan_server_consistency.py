"""Live KV scans on a real tablet server: sessions closed on lost leadership and dropped tables,
and scan + changelog consistency under concurrent writes."""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlease.common.codec import bucket_of
from kvlease.common.errors import ErrorCode
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pbg
from kvlease.ops.wait import wait_until
from tests.tablet.test_tablet_server import fetch_all, lookup, put
from tests.tablet.test_tablet_server import cluster  # noqa: F401  (the fixture)
from tests.tablet.scan.test_scan_server import (  # noqa: F401 - the fixtures and shared helpers
    E, blocking, ids_rows, s_bucket, scans)

pytestmark = pytest.mark.zk


# --- leadership -------------------------------------------------------------------------------------

def test_lost_leadership_and_dropped_table_close_sessions(scans, blocking):
    armed, gate, entered = blocking
    s = scans(buckets=2)
    s.service.read_ahead = False
    rows = ids_rows(40)
    keys = s.codec.encode_keys(s.codec.to_batch(rows).select(["id"]))
    for b in range(2):  # each bucket's own keys
        put(s.stubs[b], s.table, [r for r, key in zip(rows, keys) if bucket_of(key, 2) == b], bucket=b)
    a = s.open(bucket=0, size=1)
    busy = s.open(bucket=0, size=1)
    other = s.open(bucket=1, size=1)
    replicas = s.tablet.replicas
    keep = [(r.table, r.bucket, r.leader_epoch) for r in replicas.replicas() if r.bucket == 1]
    # a call in flight on bucket 0: leadership goes meanwhile; the store closes only after the call
    armed.set()
    pending = s.stub.ScanKv.future(pb.ScanKvRequest(scanner_id=busy.scanner_id, call_seq_id=0,
                                                    batch_size_bytes=1), timeout=30)
    assert entered.wait(10)
    mover = threading.Thread(target=replicas.update_leadership, args=(replicas.coordinator_epoch, keep, []))
    mover.start()
    wait_until(lambda: a.scanner_id not in s.service._sessions, 10, "the idle session to be closed")
    time.sleep(0.2)  # a negative check: a mover that did not wait for the call would have finished by now
    assert mover.is_alive()  # waiting for the call in flight before closing the store
    armed.clear()
    gate.set()
    mover.join(10)
    assert not mover.is_alive()
    assert pending.result().error.code == 0  # the batch read before the store closed
    assert s.next(a.scanner_id, 0, 1).error.code == E.NOT_LEADER
    assert s.next(busy.scanner_id, 1, 1).error.code == E.NOT_LEADER
    assert s.open(bucket=0).error.code == E.NOT_LEADER
    assert s.counts()[:2] == (1, {s_bucket(s, 1): 1})
    # dropping the table closes the rest
    s.c.admin.drop_table(s.table.path)
    wait_until(lambda: s.counts() == (0, {}, 0), 10, "the dropped table's sessions to close")
    assert s.stubs[1].ScanKv(pb.ScanKvRequest(scanner_id=other.scanner_id, call_seq_id=0, batch_size_bytes=1),
                             timeout=10).error.code == E.TABLE_NOT_EXIST  # not "find the new leader"


# --- consistency --------------------------------------------------------------------------------------

def test_scan_plus_changelog_from_its_log_offset_equals_the_final_state(scans):
    s = scans()
    domain = 3000
    put(s.stub, s.table, ids_rows(domain, width=5))
    stop, wrote = threading.Event(), threading.Event()
    rng = random.Random(7)

    def writer():
        i = 0
        while not stop.is_set():
            ups = [{"id": rng.randrange(domain), "v": f"w{i}-{j}"} for j in range(20)]
            dels = [{"id": rng.randrange(domain)} for _ in range(5)]
            put(s.stub, s.table, ups, delete_keys=dels)
            wrote.set()
            i += 1

    def a_write() -> None:  # one more write is done from now on
        wrote.clear()
        assert wrote.wait(10), "the writer stopped writing"

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        a_write()
        first = s.open(size=4 << 10)
        state = {r["id"]: r["v"] for r in s.rows(s.values(first))}
        seq, response = 0, first
        while response.has_more_results:
            a_write()  # writes go on while the scan reads its snapshot
            response = s.next(first.scanner_id, seq, 4 << 10)
            assert response.error.code == 0
            state.update({r["id"]: r["v"] for r in s.rows(s.values(response))})
            seq += 1
        assert seq > 10
        a_write()  # and after it
    finally:
        stop.set()
        thread.join(30)
    records, _ = fetch_all(s.stub, s.table, from_offset=first.log_offset)
    assert records and records[0]["offset"] == first.log_offset
    for r in records:
        if r["change_type"] in (0, 2):  # +I, +U
            row = s.codec.decode_values([r["value"]]).to_pylist()[0]
            state[row["id"]] = row["v"]
        elif r["change_type"] == 3:  # -D
            state.pop(s.codec.decode_keys([r["key"]]).to_pylist()[0]["id"], None)
    final = {row["id"]: row["v"] for row in lookup(s.stub, s.table, list(range(domain))) if row}
    assert state == final


# --- streaming ------------------------------------------------------------------------------------------

def test_stream_equals_unary_and_cancel_frees_the_session(scans):
    s = scans()
    put(s.stub, s.table, ids_rows(5000))
    unary, offset, _ = s.scan_all(size=16 << 10)
    req = pb.ScanKvStreamRequest(bucket_scan_req=pb.BucketScanReqPb(table_id=s.table.table_id, bucket=0),
                                 batch_size_bytes=16 << 10)
    responses = list(s.stub.ScanKvStream(req, timeout=30))
    assert all(r.error.code == 0 for r in responses) and len(responses) > 5
    assert responses[0].log_offset == offset and not responses[-1].has_more_results
    assert s.rows([v for r in responses for v in s.values(r)]) == unary
    assert s.counts() == (0, {}, 0)
    limited = list(s.stub.ScanKvStream(pb.ScanKvStreamRequest(
        bucket_scan_req=pb.BucketScanReqPb(table_id=s.table.table_id, bucket=0, limit=10), batch_size_bytes=1),
        timeout=30))
    assert [r.record_count for r in limited] == [1] * 10
    bad = list(s.stub.ScanKvStream(pb.ScanKvStreamRequest(bucket_scan_req=req.bucket_scan_req), timeout=30))
    assert [r.error.code for r in bad] == [E.INVALID_SCAN_REQUEST]
    gone = list(s.stub.ScanKvStream(pb.ScanKvStreamRequest(
        bucket_scan_req=pb.BucketScanReqPb(table_id=s.table.table_id, bucket=3), batch_size_bytes=1), timeout=30))
    assert [r.error.code for r in gone] == [E.NOT_LEADER]
    # cancel mid-stream (tiny batches: the server is still far from the end)
    call = s.stub.ScanKvStream(pb.ScanKvStreamRequest(bucket_scan_req=req.bucket_scan_req, batch_size_bytes=1))
    for _ in range(3):
        assert next(call).error.code == 0
    assert s.counts()[0] == 1
    call.cancel()
    wait_until(lambda: s.counts() == (0, {}, 0), 10, "the cancelled stream's session to be freed")
    # a client that goes away without cancelling
    channel = grpc.insecure_channel(s.tablet.address)
    call = pbg.TabletServiceStub(channel).ScanKvStream(
        pb.ScanKvStreamRequest(bucket_scan_req=req.bucket_scan_req, batch_size_bytes=1))
    next(call)
    channel.close()
    wait_until(lambda: s.counts() == (0, {}, 0), 10, "the abandoned stream's session to be freed")


# --- random request sequences ---------------------------------------------------------------------------

op_st = st.one_of(
    st.tuples(st.just("open"), st.integers(1, 3000), st.one_of(st.none(), st.integers(0, 50)),
              st.one_of(st.none(), st.integers(0, 300))),
    st.tuples(st.just("next"), st.integers(0, 7), st.integers(-1, 2), st.integers(-10, 4000)),
    st.tuples(st.just("close"), st.integers(0, 7)),
    st.tuples(st.just("raw"), st.booleans(), st.booleans(), st.booleans(), st.integers(-5, 100)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_st, min_size=1, max_size=25))
def test_random_request_sequences_get_batches_or_typed_errors(scans, ops, request):
    s = _shared(request, scans)
    known = set(ErrorCode) - {E.NONE, E.UNKNOWN}
    sessions: list[tuple[bytes, int]] = []  # (scanner id, next seq)
    for op in ops:
        if op[0] == "open":
            after = None if op[3] is None else s.codec.encode_keys(s.codec.to_batch([{"id": op[3]}]).select(["id"]))[0]
            response = s.open(size=op[1], limit=op[2], after=after)
            if response.error.code == 0 and response.has_more_results:
                sessions.append((response.scanner_id, 0))
        elif op[0] == "next" and sessions:
            i = op[1] % len(sessions)
            sid, seq = sessions[i]
            response = s.next(sid, seq + op[2] - 1 if op[2] != 1 else seq, op[3])
            if response.error.code == 0 and op[2] == 1:
                sessions[i] = (sid, seq + 1)
        elif op[0] == "close" and sessions:
            sid, _ = sessions.pop(op[1] % len(sessions))
            response = s.close(sid)
            assert response.error.code == 0
        elif op[0] == "raw":
            req = pb.ScanKvRequest(batch_size_bytes=op[4], close_scanner=op[3])
            if op[1]:
                req.bucket_scan_req.CopyFrom(pb.BucketScanReqPb(table_id=s.table.table_id, bucket=0))
            if op[2]:
                req.scanner_id = sessions[0][0] if sessions else b"zz"
            response = s.stub.ScanKv(req, timeout=10)
            if response.error.code == 0 and response.has_more_results and op[1]:
                sessions.append((response.scanner_id, 0))
        else:
            continue
        assert response.error.code == 0 or response.error.code in known, response.error
        if response.error.code == 0 and response.records:
            assert len(s.values(response)) == response.record_count
    for sid, _ in sessions:
        assert s.close(sid).error.code == 0
    assert s.counts() == (0, {}, 0), "a session was left behind"


def _shared(request, scans):
    """One server for all examples of the hypothesis test (made on the first)."""
    node = request.node
    if not hasattr(node, "_scan"):
        node._scan = scans({"kv.scanner.max-per-bucket": 4})
        put(node._scan.stub, node._scan.table, ids_rows(300))
    return node._scan
