"""Live KV scans, client side: tablet/scanner.py, TableClient.scan and ``kvlease scan``.

Unit tests (marker ``unit``) run the scanners against :class:`FakeTablet`, an
in-memory ScanKv server with the semantics of DESIGN.md "Live KV scans"
(sessions, call_seq_id replay, close, limit, start_after_key) and knobs to
fail calls; it counts requests in flight and sessions open. Integration tests
(``zk``) start a real coordinator and tablet server in-process.
"""

from __future__ import annotations

import gc
import io
import json
import threading
import time

import grpc
import pyarrow as pa
import pytest
from click.testing import CliRunner
from rich.console import Console

from common import errors
from common.errors import ErrorCode
from common.proto import tablet_pb2 as pb
from common.tables import Column, TableInfo
from ops import cli
from ops import output as out
from common.codec import RowCodec, batch_to_ipc
from client.routing import FixedRoute
from client.scanner import KvBatchScanner
from client.stream_scanner import KvStreamScanner
from client.table_scan import ScanResult

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
CODEC = RowCodec(TABLE)


def rows_of(n: int) -> list[dict]:
    return [{"id": i, "v": f"value-{i:06d}"} for i in range(n)]


# -- the fake server ----------------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "injected") -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeFuture:
    """Resolved when the caller asks for the result (like a real call still running until then)."""

    def __init__(self, tablet: "FakeTablet", request) -> None:
        self.tablet, self.request = tablet, request
        self.done = False
        self.cancelled = False
        self.callbacks = []
        tablet.in_flight += 1
        tablet.max_in_flight = max(tablet.max_in_flight, tablet.in_flight)

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            self.tablet.in_flight -= 1
            for callback in self.callbacks:
                callback(self)

    def add_done_callback(self, callback) -> None:
        self.callbacks.append(callback)

    def result(self, timeout=None):
        if self.cancelled:
            raise grpc.FutureCancelledError()
        self._finish()
        return self.tablet.handle(self.request)

    def cancel(self) -> bool:
        if self.done:
            return False
        self.cancelled = True
        self._finish()
        self.tablet.cancelled += 1
        return True


class FakeMethod:
    def __init__(self, tablet: "FakeTablet") -> None:
        self.tablet = tablet

    def future(self, request, timeout=None) -> FakeFuture:
        self.tablet.requests.append(request)
        future = FakeFuture(self.tablet, request)
        self.tablet.futures.append(future)
        return future

    def __call__(self, request, timeout=None):
        return self.future(request, timeout).result()


class FakeStream:
    def __init__(self, tablet: "FakeTablet", request) -> None:
        self.tablet = tablet
        self.cancelled = False
        open_request = pb.ScanKvRequest(bucket_scan_req=request.bucket_scan_req,
                                        batch_size_bytes=request.batch_size_bytes)
        self._first = tablet.handle(open_request)
        self._id = self._first.scanner_id
        self._seq = 0
        self._done = not self._first.has_more_results or self._first.error.code

    def __iter__(self):
        return self

    def __next__(self):
        if self.cancelled:
            raise FakeRpcError(grpc.StatusCode.CANCELLED, "cancelled")
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._done:
            raise StopIteration
        response = self.tablet.handle(pb.ScanKvRequest(scanner_id=self._id, call_seq_id=self._seq,
                                                       batch_size_bytes=1))
        self._seq += 1
        self._done = not response.has_more_results or response.error.code
        return response

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.tablet.cancelled += 1
            self.tablet.sessions.pop(self._id, None)


class FakeTablet:
    """ScanKv of one bucket over ``rows``; ``rows_per_batch`` rows per answer."""

    def __init__(self, rows: list[dict], rows_per_batch: int = 10, log_offset: int = 42) -> None:
        keys, values = CODEC.encode(CODEC.to_batch(rows)) if rows else ([], [])
        self.data = sorted(zip(keys, values))
        self.rows_per_batch = rows_per_batch
        self.log_offset = log_offset
        self.sessions: dict[bytes, dict] = {}
        self.max_sessions = 0
        self.requests: list = []
        self.in_flight = self.max_in_flight = self.cancelled = 0
        self.closes: list[bytes] = []
        self.open_errors: list[int] = []  # error codes answered to the next opens
        self.continuation_faults: dict[int, list] = {}  # call_seq_id -> faults: ("lost-request"|"lost-answer", code) or int
        self.next_id = 0
        self.ScanKv = FakeMethod(self)
        self.streams: list[FakeStream] = []
        self.futures: list[FakeFuture] = []

    def drain(self) -> None:
        """The server handles every request sent whose answer nobody waited for."""
        for future in self.futures:
            if not future.done and not future.cancelled:
                future.result()

    def ScanKvStream(self, request, timeout=None) -> FakeStream:
        stream = FakeStream(self, request)
        self.streams.append(stream)
        return stream

    def _error(self, code: int):
        return pb.ScanKvResponse(error={"code": code, "message": f"injected error {code}"})

    def _batch(self, session: dict) -> pb.ScanKvResponse:
        position, left = session["position"], session["left"]
        take = self.data[position:position + min(self.rows_per_batch, left)]
        session["position"] += len(take)
        session["left"] -= len(take)
        more = session["position"] < len(self.data) and session["left"] > 0
        values = pa.record_batch({"value": pa.array([v for _, v in take], pa.binary())})
        return pb.ScanKvResponse(records=batch_to_ipc(values) if take else b"", record_count=len(take),
                                 has_more_results=more, resume_key=take[-1][0] if take else b"")

    def handle(self, request) -> pb.ScanKvResponse:
        if request.HasField("bucket_scan_req"):
            if self.open_errors:
                return self._error(self.open_errors.pop(0))
            req = request.bucket_scan_req
            start = 0
            if req.HasField("start_after_key"):
                start = next((i for i, (k, _) in enumerate(self.data) if k > req.start_after_key), len(self.data))
            session = {"position": start, "left": req.limit if req.HasField("limit") else 1 << 62,
                       "expect": 0, "last": None}
            response = self._batch(session)
            response.log_offset = self.log_offset
            if response.has_more_results:
                self.next_id += 1
                scanner_id = b"s%d" % self.next_id
                self.sessions[scanner_id] = session
                self.max_sessions = max(self.max_sessions, len(self.sessions))
                response.scanner_id = scanner_id
            return response
        if request.close_scanner:
            self.closes.append(request.scanner_id)
            self.sessions.pop(request.scanner_id, None)
            return pb.ScanKvResponse()
        faults = self.continuation_faults.get(request.call_seq_id)
        fault = faults.pop(0) if faults else None
        if isinstance(fault, tuple) and fault[0] == "lost-request":
            raise FakeRpcError(fault[1])
        if isinstance(fault, int):
            self.sessions.pop(request.scanner_id, None)
            return self._error(fault)
        if fault == "busy":  # the first attempt of this call is still running here
            return self._error(ErrorCode.INVALID_SCAN_REQUEST)
        session = self.sessions.get(request.scanner_id)
        if session is None:
            return self._error(ErrorCode.UNKNOWN_SCANNER_ID)
        if session["last"] is not None and request.call_seq_id == session["expect"] - 1:
            response = session["last"]  # the idempotent replay
        elif request.call_seq_id != session["expect"]:
            return self._error(ErrorCode.INVALID_SCAN_REQUEST)
        else:
            response = self._batch(session)
            session["expect"] += 1
            session["last"] = response
            if not response.has_more_results:
                self.sessions.pop(request.scanner_id, None)
        if isinstance(fault, tuple) and fault[0] == "lost-answer":
            raise FakeRpcError(fault[1])
        return response

    def continuations(self) -> list[int]:
        return [r.call_seq_id for r in self.requests if r.scanner_id and not r.close_scanner]


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
@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
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
    s = scanner(tablet, retry_total_s=0.2, sleep=lambda _: time.sleep(0.01))
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


# -- unit: the CLI -----------------------------------------------------------------------------------------


class FakeScanClient:
    def __init__(self, table: TableInfo, rows: list[dict], batch_rows: int = 2) -> None:
        self.table = table
        self.codec = RowCodec(table)
        self.rows = rows
        self.batch_rows = batch_rows
        self.calls = []

    def scan(self, limit=None, buckets=None, streaming=False, on_batch=None, **options):
        self.calls.append({"limit": limit, "buckets": buckets})
        chosen = [b for b in range(self.table.buckets) if buckets is None or b in buckets]
        batches, offsets = [], {}
        left = limit
        for bucket in chosen:
            rows = [r for r in self.rows if r["id"] % self.table.buckets == bucket]
            if left is not None:
                rows, left = rows[:left], left - len(rows[:left])
            for start in range(0, len(rows), self.batch_rows):
                batch = self.codec.to_batch(rows[start:start + self.batch_rows])
                batches.append(batch)
                if on_batch:
                    on_batch(bucket, batch)
            offsets[bucket] = 100 + bucket
        return ScanResult(self.table, batches, offsets)

    def close(self):
        pass


@pytest.fixture
def fake_scan(monkeypatch):
    table = TableInfo(3, "db", "s", (Column("id", "BIGINT"), Column("name", "STRING"), Column("b", "BYTES")),
                      ("id",), 2)
    client = FakeScanClient(table, [{"id": i, "name": f"n{i}", "b": b"\x00\x01"} for i in range(6)])
    monkeypatch.setattr(cli.State, "table_client", lambda self, path: client)
    return client


def run_cli(*args: str):
    return CliRunner().invoke(cli.kvlease, ["--bootstrap", "127.0.0.1:1", *args],
                              env={"KVLEASE_CLUSTER": None, "KVLEASE_BOOTSTRAP": None}, prog_name="kvlease")


@pytest.mark.unit
def test_scan_json_document(fake_scan):
    result = run_cli("scan", "db.s", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc) == ["table", "rows", "log_offsets"]
    assert doc["table"] == "db.s" and doc["log_offsets"] == {"0": 100, "1": 101}
    assert sorted(r["id"] for r in doc["rows"]) == list(range(6))
    assert doc["rows"][0]["b"] == "AAE="  # BYTES as base64
    assert result.stderr == ""
    doc = json.loads(run_cli("scan", "db.s", "--bucket", "1", "--limit", "2", "--json").stdout)
    assert [r["id"] for r in doc["rows"]] == [1, 3] and doc["log_offsets"] == {"1": 101}
    assert fake_scan.calls[-1] == {"limit": 2, "buckets": [1]}


@pytest.mark.unit
def test_scan_text_and_errors(fake_scan):
    result = run_cli("scan", "db.s")
    assert result.exit_code == 0 and "n5" in result.stdout and "log offsets" in result.stdout
    bad = run_cli("scan", "db.s", "--bucket", "2")
    assert bad.exit_code == 1 and "buckets 0..1" in bad.stderr and bad.stdout == ""
    assert run_cli("scan", "db.s", "--limit", "0").exit_code == 2
    assert run_cli("scan", "nodot").exit_code == 2


@pytest.mark.unit
def test_scan_progress_goes_to_stderr_only_after_the_first_batch():
    buffer = io.StringIO()
    progress = out.ScanProgress(2, Console(file=buffer, force_terminal=True, width=100))
    batch = CODEC.to_batch(rows_of(3))
    progress(0, batch)
    assert progress.progress is None  # one batch: no bar
    progress(0, batch)
    progress(1, batch)
    progress.close()
    assert "9 rows" in buffer.getvalue()


@pytest.mark.unit
def test_scan_documents():
    doc = out.scan_doc("db.t", [{"id": 1, "b": b"\xff"}], {1: 5, 0: 3})
    assert doc == {"table": "db.t", "rows": [{"id": 1, "b": "/w=="}], "log_offsets": {"0": 3, "1": 5}}
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=100)).scan(doc)
    assert "log offsets" in buffer.getvalue() and "/w==" in buffer.getvalue()
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=100)).scan(out.scan_doc("db.t", [], {0: 0}))
    assert "no rows" in buffer.getvalue()


# -- integration: a real coordinator and tablet server ------------------------------------------------------

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]


@pytest.fixture
def cluster(make_config, tmp_path):  # tmp_path first: the servers stop before it is removed
    from tests.test_table_client_cluster import LocalCluster

    made = []

    def make(tablets: int = 1) -> LocalCluster:
        made.append(LocalCluster(make_config, tmp_path, tablets))
        return made[-1]

    yield make
    for c in made:
        c.close()


def table_client(c, name: str, buckets: int, retry_total_s: float = 20):
    from client.table import TableClient

    c.create_table(name, SCHEMA, ["id"], buckets)  # waits until every bucket has a live leader
    return TableClient(c.admin, name, retry_total_s=retry_total_s)


def open_scanners(server) -> int:
    """Sessions open on a tablet server (its ScanService's books)."""
    service = getattr(server, "scans", None) or getattr(server, "scan_service", None)
    if service is None:
        service = next(v for v in vars(server).values() if type(v).__name__ == "ScanService")
    return service.counts()[0]


def wait_until(predicate, timeout_s: float, what: str):
    from tests.test_table_client_cluster import LocalCluster

    return LocalCluster.wait_for(predicate, what, timeout_s)


def as_dict(rows) -> dict[int, dict]:
    return {row["id"]: row for row in rows}


def test_full_table_scan_equals_lookups_of_all_keys(cluster):
    c = cluster(2)
    with table_client(c, "db.full", 4) as client:
        client.upsert([{"id": i, "v": f"v{i}" * (i % 7)} for i in range(3000)])
        client.delete(list(range(0, 3000, 10)))
        client.upsert([{"id": i, "v": "updated"} for i in range(5, 3000, 50)])
        looked_up = [r for r in client.lookup(list(range(3000))) if r is not None]
        for streaming in (False, True):
            result = client.scan(streaming=streaming, batch_size_bytes=2000)  # many batches per bucket
            assert sorted(result.rows, key=lambda r: r["id"]) == looked_up
            assert result.num_rows == 2700 and len(result.batches) > 8 and result.one_snapshot
            ends = {b: latest for b, (_, latest) in client.list_offsets().items()}
            assert result.log_offsets == ends  # nothing was written since
        # one bucket, and the table's schema on every batch
        bucket_rows = client.scan(buckets=[2]).rows
        assert bucket_rows and all(client.split(client.codec.to_batch([r]))[0][0] == 2 for r in bucket_rows)
        assert all(b.schema == client.codec.schema for b in client.scan().batches)
        assert sum(open_scanners(t) for t in c.tablets.values()) == 0


def test_limit_over_the_table_and_per_bucket(cluster):
    c = cluster()
    with table_client(c, "db.limit", 3) as client:
        client.upsert([{"id": i, "v": "x"} for i in range(600)])
        result = client.scan(limit=250, batch_size_bytes=500)
        assert result.num_rows == 250 and len({r["id"] for r in result.rows}) == 250
        assert list(result.log_offsets)[0] == 0  # buckets in order, the last ones maybe not reached
        with client.scanner(1, limit=7, batch_size_bytes=30) as s:
            assert sum(b.num_rows for b in s) == 7
        empty = client.scan(limit=1, buckets=[0])
        assert empty.num_rows == 1
        assert open_scanners(c.tablets[1]) == 0


def test_log_offsets_plus_changelog_reach_the_current_state_under_concurrent_writes(cluster):
    from client.table import TableClient

    c = cluster()
    with table_client(c, "db.live", 3) as client, TableClient(c.admin, "db.live") as writer:
        client.upsert([{"id": i, "v": "initial"} for i in range(2000)])
        stop, written = threading.Event(), [0]

        def write() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                writer.upsert([{"id": (n * 7 + k) % 2500, "v": f"w{n}"} for k in range(20)])
                writer.delete([(n * 13) % 2000])
                written[0] = n

        thread = threading.Thread(target=write)
        thread.start()
        try:
            time.sleep(0.2)
            # small batches, slowly consumed: the writes interleave with the scan
            result = client.scan(batch_size_bytes=400, on_batch=lambda bucket, batch: time.sleep(0.002))
            time.sleep(0.2)
        finally:
            stop.set()
            thread.join()
        assert written[0] > 5
        state = as_dict(result.rows)
        for bucket, offset in result.log_offsets.items():
            end = client.list_offsets([bucket])[bucket][1]
            assert offset < end  # writes went on during and after the scan
            while offset < end:
                records, _ = client.fetch_log(bucket, offset)
                for record in records:
                    if record["change_type"] in ("+I", "+U"):
                        state[record["row"]["id"]] = record["row"]
                    elif record["change_type"] == "-D":
                        state.pop(record["row"]["id"], None)
                offset = records[-1]["offset"] + 1
        current = [r for r in client.lookup(list(range(2500))) if r is not None]
        assert sorted(state.values(), key=lambda r: r["id"]) == current


def test_early_break_closes_the_server_session(cluster):
    c = cluster()  # kv.scanner.max-per-bucket: 8 (the default)
    server = c.tablets[1]
    with table_client(c, "db.close", 1, retry_total_s=0.5) as client:
        client.upsert([{"id": i, "v": "y" * 50} for i in range(2000)])
        for i in range(20):
            for _ in client.scanner(0, batch_size_bytes=1000, streaming=i % 2 == 1):
                assert open_scanners(server) == 1
                break
        wait_until(lambda: open_scanners(server) == 0, 5, "the streams' sessions to end")
        # a scanner dropped without close: __del__ closes it
        s = client.scanner(0, batch_size_bytes=1000)
        s.poll()
        assert open_scanners(server) == 1
        del s
        gc.collect()
        wait_until(lambda: open_scanners(server) == 0, 5, "__del__'s close")
        # none leaked: the per-bucket limit of 8 is all there
        held = [client.scanner(0, batch_size_bytes=1000).open() for _ in range(8)]
        assert open_scanners(server) == 8
        with pytest.raises(errors.TooManyScannersError):
            client.scanner(0, batch_size_bytes=1000).poll()
        for s in held:
            s.close()
        assert open_scanners(server) == 0


def test_scan_of_an_empty_table_and_a_bad_bucket(cluster):
    c = cluster()
    server = c.tablets[1]
    with table_client(c, "db.empty", 2) as client:
        result = client.scan()
        assert result.rows == [] and result.log_offsets == {0: 0, 1: 0}
        assert client.scan(streaming=True).log_offsets == {0: 0, 1: 0}
        with pytest.raises(errors.BucketOutOfRangeError):
            client.scan(buckets=[2])
        with pytest.raises(errors.BucketOutOfRangeError):
            client.scanner(5)
        assert open_scanners(server) == 0
