"""Live KV scans, client side: one bucket at a time, or a whole table.

:class:`KvBatchScanner` reads one bucket through ScanKv sessions (docs/live-scans.md): the first call
opens a session on the bucket's leader
(RocksDB snapshot + ``log_offset`` taken together), continuations carry
``call_seq_id`` 0, 1, 2, … and ``client.scanner.kv.fetch.max-bytes``.
:class:`KvStreamScanner` reads the same thing over one ScanKvStream call.
Both yield Arrow ``RecordBatch``es of the table's schema (or, with
``decode=False``, of the one binary column ``value`` as it came off the
wire) and expose ``log_offset`` (the first changelog record not in the scan)
once opened and ``resume_key`` (the last key of the last batch handed out).

Contract of a scanner:

- **Lazy**: nothing is sent before the first :meth:`~BucketScanner.poll` (or
  iteration, or :meth:`~BucketScanner.open`).
- **Prefetch, one request in flight**: as soon as batch N arrives, the
  request for N+1 is sent (``stub.ScanKv.future``) and only then is batch N
  decoded and handed out. So the server reads N+1 while the caller decodes
  and consumes N, and a scanner never holds more than one request (one
  batch) on the server's side. The stream variant relies on gRPC's flow
  control for the same overlap.
- **Opening** is routed to the bucket's leader and retried like any
  idempotent read of :class:`kvlease.client.table.TableClient` (routing refreshed on
  ``NOT_LEADER`` / ``FENCED_LEADER_EPOCH`` / ``LEADER_NOT_AVAILABLE`` / an
  unreachable server; ``TOO_MANY_SCANNERS`` retried with backoff).
- **Transport failure of a continuation** (gRPC UNAVAILABLE or
  DEADLINE_EXCEEDED): the same request, same ``call_seq_id``, is sent again
  with bounded exponential backoff (tenacity); the server replays the batch
  if it had already served it. Continuations always go to the server that
  opened the session; once another live server leads the bucket (a failover)
  the replays stop: the session is lost (``NOT_LEADER``).
- **The session is lost mid-scan** (``NOT_LEADER``, ``FENCED_LEADER_EPOCH``, ``SCANNER_EXPIRED``,
  ``UNKNOWN_SCANNER_ID``, or transport retries exhausted): the typed error
  (:func:`kvlease.common.errors.error_for`) is raised with ``details``
  ``bucket``, ``resume_key`` (None if no batch was handed out yet),
  ``rows_delivered`` and ``log_offset``. With ``resume=True`` the scanner
  instead opens a new scan after ``resume_key`` (at most ``max_resumes``
  times). A resumed scan is **not one snapshot any more**: rows up to the
  resume key come from the first snapshot, the rest from a later one.
  ``log_offset`` stays the first scan's, which is the lowest, so replaying
  the changelog from it still reaches the current state, but a change may be
  applied to a row that already contains it (at-least-once instead of
  exactly-once); ``resumed`` counts the reopenings.
- **Every other error code** raises its typed exception; the session is
  closed first.
- **Never leaks a server session**: :meth:`~BucketScanner.close` (also the
  context manager, the end of iteration, an error, ``break`` out of a
  ``for`` loop through the generator's ``finally``, and ``__del__`` as a
  last resort) cancels the request in flight and sends ``close_scanner``.
  A session the server ended itself (last batch, ``has_more_results``
  false) needs no close. The one case a client cannot close is an *open*
  whose answer was lost in transport: it never learned the scanner id, and
  the server's reaper frees that session after ``kv.scanner.ttl``.

A scanner is for one consumer thread. :class:`kvlease.client.stream_scanner.KvStreamScanner`
is the streaming variant; :func:`kvlease.client.table_scan.scan_table` reads every
bucket of a table and returns a :class:`~kvlease.client.table_scan.ScanResult`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

import grpc
import pyarrow as pa

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import TableInfo
from kvlease.common.wire import error_from_pb
from kvlease.common.codec import RowCodec, ipc_to_batch
from kvlease.client.routing import LEADER_CHANGED, REROUTE
from kvlease.client.leader_watch import call_watching
from kvlease.client.transport import RetryPolicy, is_int, rpc_error

log = logging.getLogger(__name__)

#: Errors after which the session is gone; ``resume=True`` opens a new scan after ``resume_key``.
SESSION_LOST: tuple[type[errors.KvLeaseError], ...] = (
    *LEADER_CHANGED, errors.ScannerExpiredError, errors.UnknownScannerIdError, errors.NetworkError)
#: gRPC status codes of a continuation that is sent again unchanged (the server replays it); CANCELLED: a server
#: that stops drops the calls reaching it then (client/transport.py rpc_error)
TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
CLOSE_TIMEOUT_S = 5.0
#: Close calls sent without waiting (from ``__del__``), kept alive until answered.
_CLOSING: set = set()
DEFAULT_MAX_RESUMES = 8
_DEFAULT_BATCH_BYTES = cfg.CLIENT_SCANNER_FETCH_MAX_BYTES.parse(cfg.CLIENT_SCANNER_FETCH_MAX_BYTES.default)


class _CallInProgress(Exception):
    """A replay met the first attempt of the same call still running on the server."""

    def __init__(self, response) -> None:
        super().__init__(response.error.message)
        self.response = response


# -- one bucket ------------------------------------------------------------------------------------


def check_limit(limit) -> None:
    """InvalidScanRequestError unless ``limit`` is None or an int >= 0."""
    if limit is not None and (not is_int(limit) or limit < 0):
        raise errors.InvalidScanRequestError(f"limit must be an int >= 0, got {errors.show(limit)}")


class BucketScanner:
    """What both scanners share: lazy open, decoding, limit, resume, close; see the module docstring."""

    def __init__(self, route, table: TableInfo, bucket: int, *, limit: int | None = None,
                 batch_size_bytes: int | None = None, start_after_key: bytes | None = None,
                 resume: bool = False, max_resumes: int = DEFAULT_MAX_RESUMES, decode: bool = True,
                 codec: RowCodec | None = None, request_timeout_s: float | None = None,
                 retry: RetryPolicy | None = None, retry_total_s: float | None = None,
                 retry_max_wait_s: float | None = None, sleep: Callable[[float], None] | None = None) -> None:
        """``route`` finds the bucket's leader: a :class:`kvlease.client.routing.BucketRoute` (what
        :meth:`kvlease.client.table.TableClient.scanner` passes) or a :class:`kvlease.client.routing.FixedRoute`.
        ``retry`` is the policy for opens and replays; ``retry_total_s``, ``retry_max_wait_s`` and
        ``sleep`` change single fields of it."""
        check_limit(limit)
        if batch_size_bytes is not None and (not is_int(batch_size_bytes) or batch_size_bytes <= 0):
            raise errors.InvalidScanRequestError(f"batch_size_bytes must be an int > 0, got {errors.show(batch_size_bytes)}")
        if start_after_key is not None and not isinstance(start_after_key, (bytes, bytearray, memoryview)):
            raise errors.InvalidScanRequestError(
                f"start_after_key must be bytes (an encoded key, such as a scan's resume_key), "
                f"got {type(start_after_key).__name__} {start_after_key!r:.60}")
        self._closed = True  # until __init__ is through: __del__ then has nothing to do
        self.table = table
        self.bucket = bucket
        self.limit = limit
        self.batch_size_bytes = batch_size_bytes or _DEFAULT_BATCH_BYTES
        self.start_after_key = None if start_after_key is None else bytes(start_after_key)
        self.resume = resume
        self.max_resumes = max_resumes
        self.decode = decode
        self._route = route
        same = codec is not None and codec.table.physical_id == table.physical_id  # the client's, with its schemas
        self._codec = (codec if same else RowCodec(table)) if decode else None
        self._timeout_s = request_timeout_s or 30.0
        changes = {name: value for name, value in (("total_s", retry_total_s), ("max_wait_s", retry_max_wait_s),
                                                    ("sleep", sleep)) if value is not None}
        self._retry = (retry or RetryPolicy()).but(**changes)
        self.log_offset: int | None = None
        self.resume_key: bytes | None = None
        self.rows_delivered = 0
        self.batches_delivered = 0
        self.resumed = 0
        self._pending_first = None  # the open's answer, until the first poll takes it
        self._opened = False
        self._finished = False
        self._closed = False

    # -- the caller's side -------------------------------------------------------------------------

    def open(self) -> "BucketScanner":
        """Open the scan now (it otherwise opens on the first poll); ``log_offset`` is then known."""
        self._check_usable()
        if not self._opened:
            self._pending_first = self._open_scan(self.start_after_key, self.limit)
            self._opened = True
        return self

    def poll(self) -> pa.RecordBatch | None:
        """The next batch (at least one row), or None when the scan is complete (it is then closed)."""
        self._check_usable()
        if self.limit == 0:
            self._finished = True  # nothing to ask for (the server refuses limit 0)
        while not self._finished:
            if not self._opened:
                self.open()
            response = self._next_response()
            raw = ipc_to_batch(response.records) if response.records else None
            rows = raw.num_rows if raw is not None else 0
            more = response.has_more_results
            remaining = None if self.limit is None else self.limit - self.rows_delivered
            if remaining is not None and rows >= remaining:
                more = False
            if more:
                self._request_next()  # in flight while this batch is decoded and consumed
            else:
                self._finished = True
                self._end(server_closed=not response.has_more_results)
            if not rows:
                continue
            if remaining is not None and rows > remaining:
                raw = raw.slice(0, remaining)
            batch = self._codec.decode_values(raw.column("value")) if self.decode else raw
            self.rows_delivered += batch.num_rows
            self.batches_delivered += 1
            if response.resume_key:
                self.resume_key = response.resume_key
            return batch
        return None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            while (batch := self.poll()) is not None:
                yield batch
        finally:  # also on break / an abandoned generator: never leave the session open
            self.close()

    def read_all(self) -> pa.Table:
        """Every remaining batch as one table (the table's schema; ``value`` with ``decode=False``)."""
        batches = list(self)
        return pa.Table.from_batches(batches, schema=self._schema()) if batches else self._schema().empty_table()

    def close(self) -> None:
        """Cancel the request in flight and close the server session; safe to call again."""
        if self._closed:
            return
        self._closed = True
        self._end(server_closed=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; close() or `with` is the way
        try:
            if not getattr(self, "_closed", True):
                self._closed = True
                self._end(server_closed=False, wait=False)
        except Exception:  # noqa: BLE001 - nothing may escape __del__ (interpreter shutdown, …)
            pass

    @property
    def closed(self) -> bool:
        """Whether it is closed: read to the end, closed, or left by its ``with``."""
        return self._closed

    # -- shared plumbing ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise errors.InvalidScanRequestError(f"the scanner of bucket {self.bucket} is closed")

    def _schema(self) -> pa.Schema:
        return self._codec.schema if self.decode else pa.schema([pa.field("value", pa.binary())])

    def _scan_req(self, start_after_key: bytes | None, limit: int | None) -> pb.BucketScanReqPb:
        req = pb.BucketScanReqPb(table_id=self.table.table_id, partition_id=self.table.partition_id, bucket=self.bucket)
        if limit is not None:
            req.limit = limit
        if start_after_key is not None:
            req.start_after_key = start_after_key
        return req

    def _lost(self, error: errors.KvLeaseError) -> errors.KvLeaseError:
        """``error`` with what the caller needs to resume (details and message)."""
        error.details.update(bucket=self.bucket, resume_key=self.resume_key, rows_delivered=self.rows_delivered,
                             log_offset=self.log_offset)
        if self.resume_key is None:
            where = "before its first batch"
        elif isinstance(error, (errors.AuthorizationFailedError, errors.AuthenticationFailedError,
                                errors.TableNotExistError)):
            where = f"after {self.rows_delivered} row(s)"  # no resume helps: not allowed any more, or no table
        else:
            where = f"after {self.rows_delivered} row(s); open a new scan with " \
                    "start_after_key=details['resume_key'] (a new snapshot) or use resume=True"
        error.message = f"{error.message} (scan of bucket {self.bucket} of table {self.table.path} lost {where})"
        error.args = (error.message,)
        return error

    def _fail(self, error: errors.KvLeaseError) -> Any:
        """Any other error: the scan ends here (the session closed), the error says where it stopped."""
        self._finished = True
        self._end(server_closed=False)
        raise self._lost(error)

    def _session_lost(self, error: errors.KvLeaseError) -> Any:
        """The session is gone: reopen after ``resume_key`` (``resume=True``), else raise the error.

        After a transport failure the server may still hold it: a close is sent without waiting.
        """
        self._end(server_closed=not isinstance(error, errors.NetworkError), wait=False)
        if isinstance(error, REROUTE):
            self._route.stale()
        if not self.resume or self.resumed >= self.max_resumes:
            self._finished = True
            raise self._lost(error)
        self.resumed += 1
        log.info("scan of bucket %d lost (%s); resuming after %r (%d rows delivered, resume %d)",
                 self.bucket, error.message, self.resume_key, self.rows_delivered, self.resumed)
        limit = None if self.limit is None else self.limit - self.rows_delivered
        start = self.resume_key if self.resume_key is not None else self.start_after_key
        return self._open_scan(start, limit)  # keeps the first scan's log_offset

    # -- what each transport does ------------------------------------------------------------------

    def _open_scan(self, start_after_key: bytes | None, limit: int | None) -> Any:
        raise NotImplementedError

    def _next_response(self) -> Any:
        raise NotImplementedError

    def _request_next(self) -> None:
        raise NotImplementedError

    def _end(self, server_closed: bool, wait: bool = True) -> None:
        raise NotImplementedError


class KvBatchScanner(BucketScanner):
    """One bucket through unary ScanKv calls, one request in flight (see the module docstring).

    ``KvBatchScanner(route, table_info, bucket)``: ``route`` finds the leader
    (:meth:`kvlease.client.table.TableClient.scanner` builds one for you).
    ``limit``: at most this many rows in all. ``batch_size_bytes``: per call
    (default ``client.scanner.kv.fetch.max-bytes``; the server caps it).
    ``start_after_key``: only keys after this encoded key (a new snapshot).
    Use it as a context manager or iterate it to the end (or ``close()``).
    """

    def __init__(self, route, table: TableInfo, bucket: int = 0, **options: Any) -> None:
        """``options`` as :class:`BucketScanner` takes them."""
        self._scanner_id = b""
        self._stub = None
        self._address = ""
        self._seq = 0
        self._pending: tuple[Any, pb.ScanKvRequest] | None = None
        super().__init__(route, table, bucket, **options)

    @property
    def scanner_id(self) -> bytes:
        """The server's id of the open scan session (empty before it opened)."""
        return self._scanner_id

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet (0 or 1)."""
        return 1 if self._pending is not None else 0

    def _open_scan(self, start_after_key: bytes | None, limit: int | None) -> Any:
        request = pb.ScanKvRequest(bucket_scan_req=self._scan_req(start_after_key, limit),
                                   batch_size_bytes=self.batch_size_bytes)

        def attempt():
            address, stub = self._route.leader()
            try:  # given up once the coordinator names another leader (a paused one holds it to its deadline)
                response = call_watching(stub.ScanKv, request, self._timeout_s, lambda: self._route.moved_from(address),
                                         where=f"tablet server {address}, the leader of bucket {self.bucket}")
            except grpc.RpcError as exc:
                error = rpc_error(exc, "ScanKv", address, timeout_s=self._timeout_s, idempotent=True)
                if isinstance(error, REROUTE):
                    self._route.stale()
                raise error from None
            error = error_from_pb(response.error)
            if error is not None:
                if isinstance(error, REROUTE):
                    self._route.stale()
                raise error
            return address, stub, response

        self._address, self._stub, response = self._retry.retrying(errors.RETRIABLE)(attempt)
        self._scanner_id = response.scanner_id if response.has_more_results else b""
        self._seq = 0
        if self.log_offset is None and response.HasField("log_offset"):
            self.log_offset = response.log_offset
        return response

    def _request_next(self) -> None:
        request = pb.ScanKvRequest(scanner_id=self._scanner_id, call_seq_id=self._seq,
                                   batch_size_bytes=self.batch_size_bytes)
        self._seq += 1
        self._pending = (self._stub.ScanKv.future(request, timeout=self._timeout_s), request)

    def _next_response(self) -> Any:
        if self._pending_first is not None:
            response, self._pending_first = self._pending_first, None
            return response
        future, request = self._pending
        try:
            response = future.result()
        except grpc.RpcError as exc:
            if exc.code() not in TRANSPORT_CODES:
                return self._fail(rpc_error(exc, "ScanKv", self._address, timeout_s=self._timeout_s, idempotent=True))
            try:
                response = self._replay(request)
            except (errors.NetworkError, errors.NotLeaderError) as error:  # replays exhausted, or the leader moved
                return self._session_lost(error)
        self._pending = None
        error = error_from_pb(response.error)
        if error is None:
            return response
        if isinstance(error, SESSION_LOST):
            return self._session_lost(error)
        return self._fail(error)

    def _replay(self, request: pb.ScanKvRequest) -> Any:
        """``request`` again, unchanged (same call_seq_id), until it gets an answer or the budget ends.

        The first attempt may still be running on the server: it then answers
        INVALID_SCAN_REQUEST ("still in progress"), which during a replay can
        mean nothing else (the server either served this call, and replays
        it, or did not, and serves it), so that is retried too.
        """
        log.info("ScanKv continuation %d of bucket %d failed in transport; sending it again",
                 request.call_seq_id, self.bucket)

        def attempt():
            future = self._stub.ScanKv.future(request, timeout=self._timeout_s)
            self._pending = (future, request)
            try:
                response = future.result()
            except grpc.RpcError as exc:
                error = rpc_error(exc, "ScanKv", self._address, timeout_s=self._timeout_s, idempotent=True)
                if isinstance(error, errors.NetworkError) and self._route.moved_from(self._address):
                    raise errors.NotLeaderError(f"{self._address} no longer leads the bucket ({error.message})")
                raise error from None
            if response.error.code == errors.ErrorCode.INVALID_SCAN_REQUEST:
                raise _CallInProgress(response)
            return response

        try:
            return self._retry.retrying((errors.NetworkError, _CallInProgress))(attempt)
        except _CallInProgress as busy:
            return busy.response

    def _end(self, server_closed: bool, wait: bool = True) -> None:
        pending, self._pending = self._pending, None
        self._pending_first = None
        if pending is not None:
            pending[0].cancel()
        scanner_id, self._scanner_id = self._scanner_id, b""
        if server_closed or not scanner_id or self._stub is None:
            return
        request = pb.ScanKvRequest(scanner_id=scanner_id, close_scanner=True)
        try:
            future = self._stub.ScanKv.future(request, timeout=CLOSE_TIMEOUT_S)
            if not wait:  # gRPC cancels a call whose future is garbage: keep it until it is done
                _CLOSING.add(future)
                future.add_done_callback(_CLOSING.discard)
            else:
                response = future.result()
                if response.error.code:
                    log.warning("closing scanner of bucket %d: %s", self.bucket, response.error.message)
        except Exception as exc:  # noqa: BLE001 - best effort; the server's reaper is the backstop
            log.warning("closing scanner of bucket %d on %s failed: %s (the server frees it after "
                        "kv.scanner.ttl)", self.bucket, self._address, exc)
