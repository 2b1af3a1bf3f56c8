"""FakeTablet: an in-memory ScanKv / ScanKvStream server for scanner unit tests.

It has the semantics of docs/live-scans.md (sessions, call_seq_id
replay, close, limit, start_after_key), knobs to fail calls, and counts the
requests in flight and the sessions open.
"""

from __future__ import annotations


import grpc
import pyarrow as pa

from kvlease.common.errors import ErrorCode
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import Column, TableInfo
from kvlease.common.codec import RowCodec, batch_to_ipc

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
CODEC = RowCodec(TABLE)



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
