"""Live KV scans, client side: client/scanner.py and client/stream_scanner.py on a fake server.

The tests run the scanners against :class:`FakeTablet`, an in-memory ScanKv
server with the semantics of docs/live-scans.md (sessions, call_seq_id
replay, close, limit, start_after_key) and knobs to fail calls; it counts
requests in flight and sessions open. ``kvlease scan`` on fakes:
``test_cli_scan_unit.py``; against a real coordinator and tablet server:
``test_kv_scanner_cluster.py``.
"""

from __future__ import annotations

import gc
import time

import grpc
import pyarrow as pa
import pytest

from kvlease.common import errors
from kvlease.common.errors import ErrorCode
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.client.routing import FixedRoute
from kvlease.client.scanner import KvBatchScanner
from kvlease.client.stream_scanner import KvStreamScanner
from tests.support.fake_scan_server import CODEC, TABLE, FakeTablet



def rows_of(n: int) -> list[dict]:
    return [{"id": i, "v": f"value-{i:06d}"} for i in range(n)]


def scanner(tablet: FakeTablet, cls=KvBatchScanner, **options) -> KvBatchScanner:
    options.setdefault("retry_total_s", 2.0)
    options.setdefault("sleep", lambda s: None)
    return cls(FixedRoute(tablet), TABLE, 0, **options)


def ids(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


# -- unit: KvBatchScanner ----------------------------------------------------------------------------------


@pytest.mark.unit
def test_full_scan_decodes_rows_in_key_order_with_log_offset_and_resume_key():
    tablet = FakeTablet(rows_of(95), rows_per_batch=10)
    s = scanner(tablet)
    assert tablet.requests == [] and s.log_offset is None  # lazy
    batches = list(s)
    assert ids(batches) == list(range(95)) and len(batches) == 10
    assert batches[0].schema == CODEC.schema and batches[0].to_pylist()[0] == {"id": 0, "v": "value-000000"}
    assert s.log_offset == 42 and s.rows_delivered == 95
    assert s.resume_key == CODEC.encode_keys(CODEC.to_batch([{"id": 94}]))[0]
    assert tablet.continuations() == list(range(9)) and tablet.sessions == {} and tablet.closes == []
    assert s.closed


@pytest.mark.unit
def test_prefetch_keeps_exactly_one_request_in_flight():
    tablet = FakeTablet(rows_of(50), rows_per_batch=10)
    seen = []
    with scanner(tablet) as s:
        while (batch := s.poll()) is not None:
            # the next batch was asked for before this one was handed out, and only that one
            seen.append((batch.num_rows, tablet.in_flight, len(tablet.continuations())))
    assert seen == [(10, 1, 1), (10, 1, 2), (10, 1, 3), (10, 1, 4), (10, 0, 4)]
    assert tablet.max_in_flight == 1


@pytest.mark.unit
@pytest.mark.parametrize("fault", ["lost-request", "lost-answer"])
@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.CANCELLED])  # CANCELLED: a server that stops drops calls
def test_transport_failure_of_a_continuation_replays_the_same_call_seq_id(fault, code):
    tablet = FakeTablet(rows_of(40), rows_per_batch=10)
    tablet.continuation_faults[1] = [(fault, code), (fault, code)]
    sleeps = []
    rows = ids(scanner(tablet, sleep=sleeps.append))
    assert rows == list(range(40))  # no row lost, none twice
    assert tablet.continuations() == [0, 1, 1, 1, 2]
    assert len(sleeps) == 1 and tablet.max_in_flight == 1  # first replay at once, then backoff


@pytest.mark.unit
def test_a_replay_that_meets_the_first_attempt_still_running_is_sent_again():
    tablet = FakeTablet(rows_of(40), rows_per_batch=10)
    tablet.continuation_faults[1] = [("lost-request", grpc.StatusCode.DEADLINE_EXCEEDED), "busy", "busy"]
    assert ids(scanner(tablet)) == list(range(40))
    assert tablet.continuations() == [0, 1, 1, 1, 1, 2]


@pytest.mark.unit
def test_transport_failure_past_the_budget_is_a_network_error_with_the_resume_key():
    tablet = FakeTablet(rows_of(40), rows_per_batch=10)
    tablet.continuation_faults[1] = [("lost-request", grpc.StatusCode.UNAVAILABLE)] * 1000
    s = scanner(tablet, retry_total_s=0.2, sleep=lambda _: time.sleep(0.01))  # the budget is on the real clock
    got = []
    with pytest.raises(errors.NetworkError) as info:
        for batch in s:
            got.append(batch)
    assert ids(got) == list(range(20))
    assert info.value.details["resume_key"] == s.resume_key and info.value.details["rows_delivered"] == 20
    assert "resume_key" in info.value.message
    assert s.closed
    tablet.drain()  # the server may still hold the session: a close went out without waiting
    assert tablet.closes == [b"s1"]


@pytest.mark.unit
@pytest.mark.parametrize("how", ["break", "close", "with", "del"])
def test_early_termination_closes_the_session(how):
    tablet = FakeTablet(rows_of(100), rows_per_batch=10)
    s = scanner(tablet)
    if how == "break":
        for _ in s:
            break
    elif how == "close":
        s.poll()
        s.close()
        s.close()  # again: nothing more sent
    elif how == "with":
        with s:
            s.poll()
    else:
        s.poll()
        del s
        gc.collect()
        tablet.drain()  # __del__ does not wait for the answer to its close
    assert tablet.closes == [b"s1"] and tablet.sessions == {}
    assert tablet.cancelled == 1 and tablet.in_flight == 0  # the prefetched request was cancelled
    close = [r for r in tablet.requests if r.close_scanner]
    assert len(close) == 1 and not close[0].HasField("bucket_scan_req")


@pytest.mark.unit
def test_a_closed_scanner_refuses_to_poll_and_a_finished_one_sends_no_close():
    tablet = FakeTablet(rows_of(5), rows_per_batch=10)
    s = scanner(tablet)
    assert ids([s.poll()]) == list(range(5))
    assert s.poll() is None
    s.close()
    assert tablet.closes == [] and tablet.sessions == {}
    with pytest.raises(errors.InvalidScanRequestError):
        s.poll()


@pytest.mark.unit
def test_empty_bucket_has_a_log_offset_and_no_session():
    tablet = FakeTablet([], log_offset=0)
    s = scanner(tablet)
    assert list(s) == [] and s.log_offset == 0 and s.resume_key is None
    assert tablet.sessions == {} and tablet.closes == [] and len(tablet.requests) == 1
    assert scanner(FakeTablet([])).read_all().schema == CODEC.schema


@pytest.mark.unit
def test_limit_and_start_after_key():
    tablet = FakeTablet(rows_of(100), rows_per_batch=10)
    assert ids(scanner(tablet, limit=25)) == list(range(25))
    assert tablet.sessions == {}
    after = CODEC.encode_keys(CODEC.to_batch([{"id": 89}]))[0]
    assert ids(scanner(tablet, start_after_key=after)) == list(range(90, 100))
    assert ids(scanner(tablet, limit=0)) == []
    with pytest.raises(errors.InvalidScanRequestError):
        scanner(tablet, limit=-1)
    with pytest.raises(errors.InvalidScanRequestError):
        scanner(tablet, batch_size_bytes=0)


@pytest.mark.unit
def test_a_server_that_sends_more_than_the_limit_is_cut_and_closed():
    tablet = FakeTablet(rows_of(100), rows_per_batch=10)
    s = scanner(tablet, limit=15)
    tablet.handle_limit = None
    original = tablet.handle

    def ignore_limit(request):
        if request.HasField("bucket_scan_req"):
            request = pb.ScanKvRequest(bucket_scan_req=pb.BucketScanReqPb(table_id=7, bucket=0),
                                       batch_size_bytes=request.batch_size_bytes)
        return original(request)

    tablet.handle = ignore_limit
    assert ids(s) == list(range(15))
    assert tablet.sessions == {} and tablet.closes == [b"s1"]


@pytest.mark.unit
@pytest.mark.parametrize("code, cls", [
    (ErrorCode.SCANNER_EXPIRED, errors.ScannerExpiredError),
    (ErrorCode.UNKNOWN_SCANNER_ID, errors.UnknownScannerIdError),
    (ErrorCode.NOT_LEADER, errors.NotLeaderError),
])
def test_session_lost_mid_scan_raises_the_typed_error_with_the_resume_key(code, cls):
    tablet = FakeTablet(rows_of(50), rows_per_batch=10)
    tablet.continuation_faults[2] = [int(code)]
    s = scanner(tablet)
    got = []
    with pytest.raises(cls) as info:
        for batch in s:
            got.append(batch)
    assert ids(got) == list(range(30))
    details = info.value.details
    assert details["bucket"] == 0 and details["rows_delivered"] == 30 and details["log_offset"] == 42
    assert details["resume_key"] == CODEC.encode_keys(CODEC.to_batch([{"id": 29}]))[0]
    # resuming by hand: a new scan after the key
    assert ids(scanner(tablet, start_after_key=details["resume_key"])) == list(range(30, 50))
    assert tablet.sessions == {}


@pytest.mark.unit
@pytest.mark.parametrize("code", [ErrorCode.SCANNER_EXPIRED, ErrorCode.NOT_LEADER, ErrorCode.UNKNOWN_SCANNER_ID])
def test_resume_mode_reopens_after_the_resume_key(code):
    tablet = FakeTablet(rows_of(50), rows_per_batch=10)
    tablet.continuation_faults[2] = [int(code)]
    s = scanner(tablet, resume=True, limit=45)
    first_offset = []
    got = []
    for batch in s:
        got.append(batch)
        first_offset.append(s.log_offset)
        tablet.log_offset += 1  # a later scan sees a later offset
    assert ids(got) == list(range(45)) and s.resumed == 1
    assert set(first_offset) == {42}  # the first scan's offset: replaying from it reaches the present
    opens = [r.bucket_scan_req for r in tablet.requests if r.HasField("bucket_scan_req")]
    assert len(opens) == 2 and opens[1].start_after_key == CODEC.encode_keys(CODEC.to_batch([{"id": 29}]))[0]
    assert opens[1].limit == 15
    assert tablet.max_sessions == 1 and tablet.sessions == {}


@pytest.mark.unit
@pytest.mark.parametrize("code, cls", [
    (ErrorCode.INVALID_SCAN_REQUEST, errors.InvalidScanRequestError),
    (ErrorCode.TABLE_NOT_EXIST, errors.TableNotExistError),
    (ErrorCode.BUCKET_OUT_OF_RANGE, errors.BucketOutOfRangeError),
    (999, errors.UnknownServerError),
])
def test_other_errors_are_typed_and_close_the_session(code, cls):
    tablet = FakeTablet(rows_of(50), rows_per_batch=10)
    tablet.open_errors = [int(code)]
    with pytest.raises(cls):
        scanner(tablet).poll()
    # mid-scan: the session is still open on the server, so it is closed
    tablet = FakeTablet(rows_of(50), rows_per_batch=10)
    original = tablet.handle

    def fail_seq_1(request):
        if request.scanner_id and not request.close_scanner and request.call_seq_id == 1:
            return tablet._error(code)
        return original(request)

    tablet.handle = fail_seq_1
    s = scanner(tablet)
    with pytest.raises(cls) as info:
        while s.poll() is not None:  # poll, not iteration: the error itself closes the session
            pass
    assert info.value.details["rows_delivered"] == 20
    assert tablet.sessions == {} and tablet.closes == [b"s1"]


@pytest.mark.unit
@pytest.mark.parametrize("code", [ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.TOO_MANY_SCANNERS])
def test_open_is_retried_on_retriable_errors(code):
    tablet = FakeTablet(rows_of(30), rows_per_batch=10)
    tablet.open_errors = [int(code), int(code)]
    sleeps = []
    assert ids(scanner(tablet, sleep=sleeps.append)) == list(range(30))
    assert len(sleeps) == 2 and tablet.sessions == {}


@pytest.mark.unit
def test_never_more_than_one_session_per_scanner():
    tablet = FakeTablet(rows_of(200), rows_per_batch=7)
    tablet.continuation_faults = {3: [int(ErrorCode.SCANNER_EXPIRED)], 5: [("lost-answer", grpc.StatusCode.UNAVAILABLE)]}
    s = scanner(tablet, resume=True)
    for _ in range(10):
        s.poll()
        assert len(tablet.sessions) <= 1 and tablet.in_flight <= 1
    s.close()
    assert tablet.max_sessions == 1 and tablet.sessions == {} and tablet.max_in_flight == 1


@pytest.mark.unit
def test_values_without_decoding():
    tablet = FakeTablet(rows_of(20), rows_per_batch=10)
    batches = list(scanner(tablet, decode=False))
    assert [b.schema.names for b in batches] == [["value"], ["value"]]
    assert CODEC.decode_values(pa.concat_arrays([b.column(0) for b in batches])).column("id").to_pylist() == \
        list(range(20))


# -- unit: KvStreamScanner ---------------------------------------------------------------------------------


@pytest.mark.unit
def test_stream_scanner_reads_everything_and_cancels_on_early_close():
    tablet = FakeTablet(rows_of(55), rows_per_batch=10)
    s = scanner(tablet, cls=KvStreamScanner)
    assert ids(s) == list(range(55)) and s.log_offset == 42 and tablet.cancelled == 0
    s = scanner(tablet, cls=KvStreamScanner)
    for _ in s:
        break
    assert tablet.cancelled == 1 and tablet.streams[-1].cancelled and tablet.sessions == {}


@pytest.mark.unit
def test_stream_scanner_errors_and_resume():
    tablet = FakeTablet(rows_of(50), rows_per_batch=10)
    tablet.open_errors = [int(ErrorCode.NOT_LEADER)]
    assert ids(scanner(tablet, cls=KvStreamScanner)) == list(range(50))  # open retried
    tablet.continuation_faults[1] = [int(ErrorCode.SCANNER_EXPIRED)]
    with pytest.raises(errors.ScannerExpiredError) as info:
        list(scanner(tablet, cls=KvStreamScanner))
    assert info.value.details["rows_delivered"] == 20
    tablet.continuation_faults[1] = [int(ErrorCode.SCANNER_EXPIRED)]
    s = scanner(tablet, cls=KvStreamScanner, resume=True)
    assert ids(s) == list(range(50)) and s.resumed == 1
    tablet.open_errors = [int(ErrorCode.INVALID_SCAN_REQUEST)]
    with pytest.raises(errors.InvalidScanRequestError):
        list(scanner(tablet, cls=KvStreamScanner))
