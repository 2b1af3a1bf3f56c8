"""Live KV scans, client side: one bucket at a time, or a whole table.

:class:`KvBatchScanner` reads one bucket through ScanKv sessions (DESIGN.md
"Live KV scans"): the first call opens a session on the bucket's leader
(RocksDB snapshot + ``log_offset`` taken together), continuations carry
``call_seq_id`` 0, 1, 2, … and ``client.scanner.kv.fetch.max-bytes``.
:class:`KvStreamScanner` reads the same thing over one ScanKvStream call.
Both yield Arrow ``RecordBatch``es of the table's schema (or, with
``decode=False``, of the one binary column ``value`` as it came off the
wire) and expose ``log_offset`` (the first changelog record not in the scan)
once opened and ``resume_key`` (the last key of the last batch handed out).

Contract of a scanner:

- **Lazy**: nothing is sent before the first :meth:`~_Scanner.poll` (or
  iteration, or :meth:`~_Scanner.open`).
- **Prefetch, one request in flight**: as soon as batch N arrives, the
  request for N+1 is sent (``stub.ScanKv.future``) and only then is batch N
  decoded and handed out. So the server reads N+1 while the caller decodes
  and consumes N, and a scanner never holds more than one request (one
  batch) on the server's side. The stream variant relies on gRPC's flow
  control for the same overlap.
- **Opening** is routed to the bucket's leader and retried like any
  idempotent read of :class:`client.table.TableClient` (routing refreshed on
  ``NOT_LEADER`` / ``LEADER_NOT_AVAILABLE`` / an unreachable server;
  ``TOO_MANY_SCANNERS`` retried with backoff).
- **Transport failure of a continuation** (gRPC UNAVAILABLE or
  DEADLINE_EXCEEDED): the same request, same ``call_seq_id``, is sent again
  with bounded exponential backoff (tenacity); the server replays the batch
  if it had already served it. Continuations always go to the server that
  opened the session.
- **The session is lost mid-scan** (``NOT_LEADER``, ``SCANNER_EXPIRED``,
  ``UNKNOWN_SCANNER_ID``, or transport retries exhausted): the typed error
  (:func:`common.errors.error_for`) is raised with ``details``
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
- **Never leaks a server session**: :meth:`~_Scanner.close` (also the
  context manager, the end of iteration, an error, ``break`` out of a
  ``for`` loop through the generator's ``finally``, and ``__del__`` as a
  last resort) cancels the request in flight and sends ``close_scanner``.
  A session the server ended itself (last batch, ``has_more_results``
  false) needs no close. The one case a client cannot close is an *open*
  whose answer was lost in transport: it never learned the scanner id, and
  the server's reaper frees that session after ``kv.scanner.ttl``.

A scanner is for one consumer thread. :func:`scan_table` reads every bucket
of a table and returns a :class:`ScanResult`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import grpc
import pyarrow as pa
import tenacity

from common import config as cfg
from common import errors
from common.proto import tablet_pb2 as pb
from common.tables import TableInfo
from common.wire import error_from_pb
from common.codec import RowCodec, ipc_to_batch

log = logging.getLogger(__name__)

#: Errors after which the session is gone; ``resume=True`` opens a new scan after ``resume_key``.
SESSION_LOST: tuple[type[errors.KvLeaseError], ...] = (
    errors.NotLeaderError, errors.ScannerExpiredError, errors.UnknownScannerIdError, errors.NetworkError)
#: gRPC status codes of a continuation that is sent again unchanged (the server replays it).
TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
CLOSE_TIMEOUT_S = 5.0
#: Close calls sent without waiting (from ``__del__``), kept alive until answered.
_CLOSING: set = set()
DEFAULT_MAX_RESUMES = 8
_DEFAULT_BATCH_BYTES = cfg.CLIENT_SCANNER_FETCH_MAX_BYTES.parse(cfg.CLIENT_SCANNER_FETCH_MAX_BYTES.default)


# -- where the calls go --------------------------------------------------------------------------


class _ClientRoute:
    """The leader of one bucket, as a :class:`client.table.TableClient` knows it (refreshed on demand)."""

    def __init__(self, client, bucket: int) -> None:
        self.client = client
        self.bucket = bucket
        self._routing = None

    def leader(self) -> tuple[str, Any]:
        """``(address, stub)`` of the bucket's leader; raises LeaderNotAvailableError when it has none."""
        self._routing = self.client._routing()
        address = self.client._leader(self._routing, self.bucket)
        return address, self.client._stub(address)

    def stale(self) -> None:
        """The leader answered NOT_LEADER or could not be reached: fetch the assignment again next time."""
        if self._routing is not None:
            self.client._invalidate(self._routing)


class FixedRoute:
    """One stub for every call (tests, tools that already know the leader)."""

    def __init__(self, stub, address: str = "stub") -> None:
        self.stub = stub
        self.address = address

    def leader(self) -> tuple[str, Any]:
        return self.address, self.stub

    def stale(self) -> None:
        pass


def _rpc_error(exc: grpc.RpcError, method: str, address: str, timeout_s: float | None) -> errors.KvLeaseError:
    from client.table import rpc_error

    return rpc_error(exc, method, address, timeout_s or 0.0, idempotent=True)


def _response_error(response) -> errors.KvLeaseError | None:
    return error_from_pb(response.error)


class _CallInProgress(Exception):
    """A replay met the first attempt of the same call still running on the server."""

    def __init__(self, response) -> None:
        super().__init__(response.error.message)
        self.response = response


# -- one bucket ------------------------------------------------------------------------------------


class _Scanner:
    """What both scanners share: lazy open, decoding, limit, resume, close; see the module docstring."""

    def __init__(self, client, table: TableInfo | None, bucket: int, *, limit: int | None = None,
                 batch_size_bytes: int | None = None, start_after_key: bytes | None = None,
                 resume: bool = False, max_resumes: int = DEFAULT_MAX_RESUMES, decode: bool = True,
                 request_timeout_s: float | None = None, retry_total_s: float | None = None,
                 retry_max_wait_s: float | None = None, sleep: Callable[[float], None] | None = None) -> None:
        """``client`` is a TableClient (routing to the leader) or a TabletService stub (fixed)."""
        if limit is not None and limit < 0:
            raise errors.InvalidScanRequestError(f"limit must be >= 0, got {limit}")
        if batch_size_bytes is not None and batch_size_bytes <= 0:
            raise errors.InvalidScanRequestError(f"batch_size_bytes must be > 0, got {batch_size_bytes}")
        is_client = hasattr(client, "_routing")
        self._closed = True  # until __init__ is through: __del__ then has nothing to do
        self.table = table if table is not None else client.table
        self.bucket = bucket
        self.limit = limit
        self.batch_size_bytes = batch_size_bytes or (
            getattr(client, "scan_batch_bytes", None) if is_client else None) or _DEFAULT_BATCH_BYTES
        self.start_after_key = start_after_key
        self.resume = resume
        self.max_resumes = max_resumes
        self.decode = decode
        self._route = _ClientRoute(client, bucket) if is_client else FixedRoute(client)
        self._codec = (client.codec if is_client and client.table is self.table else RowCodec(self.table)) \
            if decode else None
        self._timeout_s = request_timeout_s or (client._timeout_s if is_client else 30.0)
        self._retry_total_s = retry_total_s if retry_total_s is not None else \
            (client._retry_total_s if is_client else 30.0)
        self._retry_max_wait_s = retry_max_wait_s if retry_max_wait_s is not None else \
            (client._retry_max_wait_s if is_client else 2.0)
        self._sleep = sleep or (client._sleep if is_client else tenacity.nap.sleep)
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

    def open(self) -> "_Scanner":
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
        return self._closed

    # -- shared plumbing ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise errors.InvalidScanRequestError(f"the scanner of bucket {self.bucket} is closed")

    def _schema(self) -> pa.Schema:
        return self._codec.schema if self.decode else pa.schema([pa.field("value", pa.binary())])

    def _retrying(self, retry_on: tuple[type[BaseException], ...]) -> tenacity.Retrying:
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(retry_on),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=self._retry_max_wait_s),
            stop=tenacity.stop_before_delay(self._retry_total_s),
            sleep=self._sleep, reraise=True)

    def _scan_req(self, start_after_key: bytes | None, limit: int | None) -> pb.BucketScanReqPb:
        req = pb.BucketScanReqPb(table_id=self.table.table_id, bucket=self.bucket)
        if limit is not None:
            req.limit = limit
        if start_after_key is not None:
            req.start_after_key = start_after_key
        return req

    def _lost(self, error: errors.KvLeaseError) -> errors.KvLeaseError:
        """``error`` with what the caller needs to resume (details and message)."""
        error.details.update(bucket=self.bucket, resume_key=self.resume_key, rows_delivered=self.rows_delivered,
                             log_offset=self.log_offset)
        where = "before its first batch" if self.resume_key is None else \
            f"after {self.rows_delivered} row(s); open a new scan with start_after_key=details['resume_key'] " \
            "(a new snapshot) or use resume=True"
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
        if isinstance(error, (errors.NotLeaderError, errors.NetworkError)):
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


class KvBatchScanner(_Scanner):
    """One bucket through unary ScanKv calls, one request in flight (see the module docstring).

    ``KvBatchScanner(table_client, None, bucket)`` routes to the bucket's
    leader; ``KvBatchScanner(stub, table_info, bucket)`` talks to that stub.
    ``limit``: at most this many rows in all. ``batch_size_bytes``: per call
    (default ``client.scanner.kv.fetch.max-bytes``; the server caps it).
    ``start_after_key``: only keys after this encoded key (a new snapshot).
    Use it as a context manager or iterate it to the end (or ``close()``).
    """

    def __init__(self, client, table: TableInfo | None = None, bucket: int = 0, **options: Any) -> None:
        self._scanner_id = b""
        self._stub = None
        self._address = ""
        self._seq = 0
        self._pending: tuple[Any, pb.ScanKvRequest] | None = None
        super().__init__(client, table, bucket, **options)

    @property
    def scanner_id(self) -> bytes:
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
            try:
                response = stub.ScanKv.future(request, timeout=self._timeout_s).result()
            except grpc.RpcError as exc:
                error = _rpc_error(exc, "ScanKv", address, self._timeout_s)
                if isinstance(error, errors.NetworkError):
                    self._route.stale()
                raise error from None
            error = _response_error(response)
            if error is not None:
                if isinstance(error, (errors.NotLeaderError, errors.LeaderNotAvailableError)):
                    self._route.stale()
                raise error
            return address, stub, response

        self._address, self._stub, response = self._retrying(errors.RETRIABLE)(attempt)
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
                return self._fail(_rpc_error(exc, "ScanKv", self._address, self._timeout_s))
            try:
                response = self._replay(request)
            except errors.NetworkError as error:  # replays exhausted
                return self._session_lost(error)
        self._pending = None
        error = _response_error(response)
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
                raise _rpc_error(exc, "ScanKv", self._address, self._timeout_s) from None
            if response.error.code == errors.ErrorCode.INVALID_SCAN_REQUEST:
                raise _CallInProgress(response)
            return response

        try:
            return self._retrying((errors.NetworkError, _CallInProgress))(attempt)
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


class KvStreamScanner(_Scanner):
    """One bucket through one server-streaming ScanKvStream call (same options as KvBatchScanner).

    The server pushes batches as gRPC flow control allows; closing early
    cancels the call, which ends the session. A stream has no replay: a
    transport failure mid-stream is a lost session (resumable after
    ``resume_key`` with ``resume=True``). The call has no deadline.
    """

    def __init__(self, client, table: TableInfo | None = None, bucket: int = 0, **options: Any) -> None:
        self._call = None
        self._address = ""
        super().__init__(client, table, bucket, **options)

    def _open_scan(self, start_after_key: bytes | None, limit: int | None) -> Any:
        request = pb.ScanKvStreamRequest(bucket_scan_req=self._scan_req(start_after_key, limit),
                                         batch_size_bytes=self.batch_size_bytes)

        def attempt():
            address, stub = self._route.leader()
            call = stub.ScanKvStream(request)
            try:
                response = next(call)
            except StopIteration:
                raise errors.UnknownServerError(f"ScanKvStream to {address} ended without a response") from None
            except grpc.RpcError as exc:
                call.cancel()
                error = _rpc_error(exc, "ScanKvStream", address, None)
                if isinstance(error, errors.NetworkError):
                    self._route.stale()
                raise error from None
            error = _response_error(response)
            if error is not None:
                call.cancel()
                if isinstance(error, (errors.NotLeaderError, errors.LeaderNotAvailableError)):
                    self._route.stale()
                raise error
            return address, call, response

        self._address, self._call, response = self._retrying(errors.RETRIABLE)(attempt)
        if self.log_offset is None and response.HasField("log_offset"):
            self.log_offset = response.log_offset
        return response

    def _request_next(self) -> None:
        pass  # the server keeps sending

    def _next_response(self) -> Any:
        if self._pending_first is not None:
            response, self._pending_first = self._pending_first, None
            return response
        try:
            response = next(self._call)
        except StopIteration:
            error = errors.UnknownServerError(f"ScanKvStream from {self._address} ended before the last batch")
            return self._session_lost_or_raise(error)
        except grpc.RpcError as exc:
            return self._session_lost_or_raise(_rpc_error(exc, "ScanKvStream", self._address, None))
        error = _response_error(response)
        if error is None:
            return response
        return self._session_lost_or_raise(error)

    def _session_lost_or_raise(self, error: errors.KvLeaseError) -> Any:
        return self._session_lost(error) if isinstance(error, SESSION_LOST) else self._fail(error)

    def _end(self, server_closed: bool, wait: bool = True) -> None:
        self._pending_first = None
        call, self._call = self._call, None
        if call is not None and not server_closed:
            call.cancel()


# -- a whole table -----------------------------------------------------------------------------------


@dataclass
class ScanResult:
    """What :func:`scan_table` read: ``batches`` (bucket order, the table's schema) and per bucket
    ``log_offsets`` (replay the changelog from there to reach the present) and ``resumed`` counts."""

    table: TableInfo
    batches: list[pa.RecordBatch]
    log_offsets: dict[int, int]
    resumed: dict[int, int] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for b in self.batches)

    def to_table(self) -> pa.Table:
        schema = self.batches[0].schema if self.batches else RowCodec(self.table).schema
        return pa.Table.from_batches(self.batches, schema=schema)

    @property
    def rows(self) -> list[dict]:
        return [row for batch in self.batches for row in batch.to_pylist()]

    @property
    def one_snapshot(self) -> bool:
        """Every bucket was read from one snapshot (no resumed scan)."""
        return not any(self.resumed.values())


def scan_table(client, *, limit: int | None = None, buckets: Sequence[int] | None = None,
               streaming: bool = False, resume: bool = False, decode: bool = True,
               batch_size_bytes: int | None = None,
               on_batch: Callable[[int, pa.RecordBatch], None] | None = None) -> ScanResult:
    """Every row of the table (or of ``buckets``) through ``client`` (a TableClient).

    Without a limit the buckets are read in parallel on the client's thread
    pool (``parallelism`` buckets at a time, each its own scanner with one
    request in flight): buckets live on different servers, so the scan takes
    about as long as the slowest bucket rather than the sum, and the server
    side of each stays bounded by one batch. With a limit they are read one
    after another, each asked for what is still missing, so no more than
    ``limit`` rows are ever fetched; buckets not reached then have no
    ``log_offsets`` entry. ``on_batch(bucket, batch)`` is called for every
    batch (from worker threads when parallel). The first error stops the
    other buckets (their sessions are closed) and is raised.
    """
    table = client.table
    wanted = list(range(table.buckets)) if buckets is None else sorted(set(buckets))
    for bucket in wanted:
        if not 0 <= bucket < table.buckets:
            raise errors.BucketOutOfRangeError(f"table {table.path} has buckets 0..{table.buckets - 1}, "
                                               f"not {bucket}")
    scanner_cls = KvStreamScanner if streaming else KvBatchScanner
    stop = threading.Event()

    def scan_bucket(bucket: int, bucket_limit: int | None = None) -> tuple[list[pa.RecordBatch], int, int]:
        batches = []
        with scanner_cls(client, table, bucket, limit=bucket_limit, resume=resume, decode=decode,
                         batch_size_bytes=batch_size_bytes) as scanner:
            while not stop.is_set() and (batch := scanner.poll()) is not None:
                batches.append(batch)
                if on_batch is not None:
                    on_batch(bucket, batch)
            return batches, scanner.log_offset, scanner.resumed

    per_bucket: dict[int, tuple[list[pa.RecordBatch], int, int]] = {}
    if limit is not None:
        remaining = limit
        for bucket in wanted:
            if remaining <= 0:
                break
            per_bucket[bucket] = scan_bucket(bucket, remaining)
            remaining -= sum(b.num_rows for b in per_bucket[bucket][0])
    else:
        def guarded(bucket: int):
            try:
                return scan_bucket(bucket)
            except BaseException:
                stop.set()
                raise

        for bucket, (result, error) in zip(wanted, client._map(guarded, wanted)):
            if error is not None:
                raise error
            per_bucket[bucket] = result
    return ScanResult(table=table,
                      batches=[b for bucket in sorted(per_bucket) for b in per_bucket[bucket][0]],
                      log_offsets={bucket: per_bucket[bucket][1] for bucket in sorted(per_bucket)},
                      resumed={bucket: per_bucket[bucket][2] for bucket in sorted(per_bucket)})
