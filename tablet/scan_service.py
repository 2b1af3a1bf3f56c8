"""The shell of live KV scans: session resources, read-ahead, the reaper, metrics.

:class:`ScanService` carries out what the pure :class:`~tablet.scan.ScannerManager`
decides. It owns each session's RocksDB snapshot (``BucketStore.snapshot()``:
a seekable iterator, a forward-only values iterator and the log offset, taken
together under the bucket's write lock) and how to answer its last call
again, builds batches
(:mod:`tablet.scan_batch`) and their answers' bytes (:mod:`tablet.scan_wire`), runs the reaper every
``kv.scanner.expiration-interval`` and ends a bucket's sessions before its
store closes (it listens to the ReplicaManager). See docs/live-scans.md.

Read-ahead: once a unary call is answered with more rows to come, the next
batch is built in the background with the same batch size, so the client's
next call finds it ready (streams need none: gRPC's flow control keeps the
stream's own thread ahead). A call with another size or row cap drops it and
seeks the iterator back after the last key served; the session then reads
with :func:`~tablet.scan_batch.read_batch` on that iterator, because the
values iterator (:class:`~tablet.scan_batch.ValueReader`, the faster one,
used until then) cannot go back.

Replays and memory: a replay of the last call reads its batch again from the
snapshot's seekable iterator (same start key, budget and row cap: the same
rows, the same bytes), so a session holds at most one batch of its own, the
one read ahead, plus at most one chunk of values read past it. Only a
batch a unary session ends with is kept (its snapshot is gone), in a cache of
:data:`FINISHED_CACHE_BYTES` shared by finished sessions.

Locks: ``_lock`` guards the manager and the session map; nothing waits
while holding it. A session's ``lock`` is held while a batch is built (a
call or its read-ahead); its snapshot is closed only under it. A session
whose call is in flight is released by that call as it ends, which sets
``released``: :meth:`close_bucket` waits for that, so a bucket's store never
closes under a batch being read.

Authorization (:mod:`tablet.authz`): opening a scan needs READ on the table.
A session belongs to the principal that opened it: a continuation or close
from another principal is ``AUTHORIZATION_FAILED`` and changes nothing (also
for the replay of a finished session's last batch), and every continuation
checks READ again, so an ACL revoked mid-scan stops the scan (the session
stays for its owner's close, or until it expires).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from common import config as cfg
from common import errors
from common.proto import tablet_pb2 as pb
from common.metrics import MetricsRegistry
from common.wire import error_pb
from common.model import TableBucket
from common.statemachine import UnhandledError
from common.security.server import OPEN
from tablet import scan, scan_batch, scan_wire
from tablet.authz import READ, TableAccess
from tablet.bucket import BucketStoreError, KvSnapshot
from tablet.replicas import ReplicaManager

log = logging.getLogger(__name__)

#: The scanner manager's instructions, each carried out inline by the call it answers.
_CARRIED_OUT = (scan.Serve, scan.Replay, scan.Release, scan.Refuse)

FINISHED_CACHE_BYTES = 16 << 20  # last batches of finished unary sessions kept for a replay (oldest go first)
READ_AHEAD_THREADS = 2
RELEASE_WAIT_S = 60.0  # close_bucket's patience with a call in flight (one batch)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


# --- metrics -----------------------------------------------------------------------------

class ScanMetrics(MetricsRegistry):
    """The tablet server's Prometheus registry: live-scan counters and open-scanner gauges."""

    def __init__(self, service: "ScanService") -> None:
        super().__init__()
        r = self.registry
        self.opened = Counter("kvlease_scanners_opened", "scan sessions opened", registry=r)
        self.released = Counter("kvlease_scanners_released", "scan sessions ended, by reason", ["reason"],
                                registry=r)
        self.expired = Counter("kvlease_scanners_expired", "scan sessions ended idle past kv.scanner.ttl",
                               registry=r)
        self.refused = Counter("kvlease_scan_requests_refused", "scan requests answered with an error, by code",
                               ["code"], registry=r)
        self.read_ahead = Counter("kvlease_scan_read_ahead", "batches read ahead, by outcome: used or dropped "
                                  "(the next call asked for another size)", ["outcome"], registry=r)
        self.rows = Counter("kvlease_scan_rows", "rows served by live scans", registry=r)
        self.bytes = Counter("kvlease_scan_bytes", "record bytes served by live scans (replays included)",
                             registry=r)
        self._service = service
        r.register(self)

    def describe(self):  # registering must not call collect(): the service is not built yet
        return [GaugeMetricFamily("kvlease_scanners_open", ""), GaugeMetricFamily("kvlease_bucket_scanners_open", ""),
                GaugeMetricFamily("kvlease_scan_snapshots_open", "")]

    def collect(self):  # the gauges, read from the manager at scrape time (no stale labels)
        total, per_bucket, snapshots = self._service.counts()
        yield GaugeMetricFamily("kvlease_scanners_open", "open scan sessions on this server", value=total)
        by_bucket = GaugeMetricFamily("kvlease_bucket_scanners_open", "open scan sessions per bucket",
                                      labels=["table_id", "bucket"])
        for tb, n in sorted(per_bucket.items(), key=lambda kv: kv[0].sort_key()):
            by_bucket.add_metric([str(tb.table_id), str(tb.bucket)], n)
        yield by_bucket
        yield GaugeMetricFamily("kvlease_scan_snapshots_open", "RocksDB snapshots held by scan sessions",
                                value=snapshots)


# --- the service ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Served:
    """A call answered, and how to answer it again: its batch starts after key ``after`` and was read
    with ``budget`` and ``max_rows``. ``answer`` is kept only for the batch a session ends with (its
    snapshot is then gone)."""

    call: int
    after: bytes
    budget: int
    max_rows: int | None
    answer: scan_wire.Answer | None


@dataclass(eq=False)
class _Session:
    """What a session holds besides the manager's books."""

    bucket: TableBucket
    limit: int | None
    stream: bool
    owner: str | None = None  # the principal that opened it (None: security off)
    lock: threading.RLock = field(default_factory=threading.RLock)
    released: threading.Event = field(default_factory=threading.Event)
    snapshot: KvSnapshot | None = None
    reader: scan_batch.ValueReader | None = None  # forward reads (None: read_batch on the snapshot's
    # iterator, which is then kept positioned after read_to)
    last: _Served | None = None  # the last call answered: for a replay
    rows: int = 0  # rows answered
    resume_key: bytes = b""  # the last key answered
    read_to: bytes = b""  # the last key read from the snapshot (answered or read ahead)
    ahead_token: object | None = None  # the read-ahead scheduled (None: none, or it is cancelled)
    ahead: tuple[tuple, scan_wire.Answer | None] | None = None  # ((call, budget, max_rows), batch or failed)


class ScanService:
    """Live KV scans on one tablet server: :meth:`scan` (ScanKv) and :meth:`stream` (ScanKvStream)."""

    def __init__(self, replicas: ReplicaManager, config: cfg.Config, *,
                 clock_ms: Callable[[], int] = _monotonic_ms,
                 new_id: Callable[[], bytes] = lambda: os.urandom(16), read_ahead: bool = True,
                 security=OPEN) -> None:
        self.replicas = replicas
        self.access = TableAccess(replicas, security)
        self.config = config
        self.clock_ms = clock_ms
        self.new_id = new_id
        self.read_ahead = read_ahead
        self.max_batch_bytes = config[cfg.SCANNER_MAX_BATCH_SIZE]
        self.manager = scan.ScannerManager(config[cfg.SCANNER_MAX_PER_BUCKET], config[cfg.SCANNER_MAX_PER_SERVER],
                                           config[cfg.SCANNER_TTL])
        self.snapshots_open = 0  # RocksDB snapshots (iterators) held by sessions, for tests and metrics
        self._lock = threading.Lock()
        self._sessions: dict[bytes, _Session] = {}
        self._finished: OrderedDict[bytes, _Session] = OrderedDict()  # sid -> finished session (its last batch)
        self._finished_bytes = 0
        self._pool = ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="scan-ahead")
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self.metrics = ScanMetrics(self)
        replicas.close_listeners.append(self.close_bucket)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "ScanService":
        self._reaper = threading.Thread(target=self._reap_loop, name="scan-reaper", daemon=True)
        self._reaper.start()
        return self

    def close(self) -> None:
        """Stop the reaper and end every session (waiting for calls in flight)."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=10)
        self._end(scan.CloseAll(self.clock_ms()), None)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.metrics.close()

    def _reap_loop(self) -> None:
        interval_s = self.config[cfg.SCANNER_EXPIRATION_INTERVAL] / 1000.0
        while not self._stop.wait(interval_s):
            try:
                self.reap()
            except Exception:  # keep reaping
                log.exception("scanner reaper failed")

    def reap(self) -> int:
        """Free the sessions idle longer than kv.scanner.ttl; returns how many."""
        with self._lock:
            released = self._take_releases(self._run(scan.Tick(self.clock_ms())))
            for sid in [s for s in self._finished if s not in self.manager.gone]:
                self._finished_bytes -= len(self._finished.pop(sid).last.answer.data)
        self._free(released)
        return len(released)

    def close_bucket(self, table_id: int, bucket: int, dropped: bool = False) -> None:
        """End the bucket's sessions (it is no longer led here, or its table was ``dropped``);
        returns once none reads its store."""
        tb = TableBucket(table_id, bucket)
        self._end(scan.CloseBucket(tb, self.clock_ms(), dropped), tb)

    def _end(self, event: object, bucket: TableBucket | None) -> None:
        with self._lock:
            released = self._take_releases(self._run(event))
            busy = [s for s in self._sessions.values() if bucket is None or s.bucket == bucket]
        self._free(released)
        for session in busy:  # a call in flight releases its session as it ends
            if not session.released.wait(RELEASE_WAIT_S):
                log.warning("a scan call on %s did not end within %.0f s", session.bucket, RELEASE_WAIT_S)

    def counts(self) -> tuple[int, dict[TableBucket, int], int]:
        """``(open sessions, open sessions per bucket, snapshots held)``."""
        with self._lock:
            return self.manager.open_count(), dict(self.manager.per_bucket), self.snapshots_open

    # -- releases -----------------------------------------------------------------------------

    def _run(self, event: object) -> list[object]:
        """The manager's instructions for ``event``; one of a type this service does not carry out
        raises (a new instruction must get its executor here, never be skipped)."""
        out = self.manager.handle(event)
        for ins in out:
            if not isinstance(ins, _CARRIED_OUT):
                raise UnhandledError(f"ScanService does not carry out {type(ins).__name__}")
        return out

    def _take_releases(self, instructions: list[object]) -> list[tuple[scan.Release, _Session]]:
        """Under ``_lock``: drop the released sessions from the map (free them after, unlocked)."""
        out = []
        for ins in instructions:
            if isinstance(ins, scan.Release):
                session = self._sessions.pop(ins.scanner_id)
                out.append((ins, session))
                if (ins.reason == scan.FINISHED and not session.stream and session.last is not None
                        and session.last.call != scan.OPEN_CALL and session.last.answer is not None):
                    self._keep_finished(ins.scanner_id, session)
        return out

    def _keep_finished(self, sid: bytes, session: _Session) -> None:
        """Keep a finished session (its last batch and owner; its snapshot is freed) for a retry of its
        last call (the manager knows for how long)."""
        self._finished[sid] = session
        self._finished_bytes += len(session.last.answer.data)
        while self._finished_bytes > FINISHED_CACHE_BYTES:
            _sid, old = self._finished.popitem(last=False)
            self._finished_bytes -= len(old.last.answer.data)

    def _free(self, released: list[tuple[scan.Release, _Session]]) -> None:
        for ins, session in released:
            with session.lock:  # waits for a read-ahead in progress
                snapshot, session.snapshot = session.snapshot, None
                session.ahead_token = session.ahead = session.reader = None  # the reader holds the store
                if snapshot is not None:
                    snapshot.close()
                    with self._lock:
                        self.snapshots_open -= 1
                session.released.set()
            self.metrics.released.labels(ins.reason).inc()
            if ins.reason == scan.EXPIRED:
                self.metrics.expired.inc()
            log.debug("scanner %s of %s released (%s)", ins.scanner_id.hex(), ins.bucket, ins.reason)

    def _handle(self, event: object) -> tuple[list[object], _Session | None]:
        """Feed ``event``, free what it releases, raise its refusal; returns the instructions
        and the event's session."""
        with self._lock:
            out = self._run(event)
            session = self._sessions.get(event.scanner_id)  # type: ignore[attr-defined]
            released = self._take_releases(out)
        self._free(released)
        for ins in out:
            if isinstance(ins, scan.Refuse):
                self.metrics.refused.labels(ins.error.code.name).inc()
                raise ins.error
        return out, session

    # -- authorization ----------------------------------------------------------------------------

    def _authorize_open(self, table_id: int) -> None:
        """READ on the table, or AuthorizationFailedError (nothing opened)."""
        try:
            self.access.check(READ, table_id)
        except errors.AuthorizationFailedError as exc:
            self.metrics.refused.labels(exc.code.name).inc()
            raise

    def _authorize_call(self, sid: bytes, *, read: bool) -> None:
        """Before a continuation (``read``) or close of ``sid``: AuthorizationFailedError unless the caller
        opened the session and (``read``) may still READ its table. Nothing changes either way. An id
        not open here (nor kept finished) is left to the manager's answer (unknown, expired, not leader)."""
        if not self.access.enabled:
            return
        with self._lock:
            session = self._sessions.get(sid) or self._finished.get(sid)
        if session is None:
            return
        try:
            principal = self.access.principal()
            if session.owner != principal:
                resource = self.access.resource(session.bucket.table_id)
                what = str(resource) if resource is not None else f"table id {session.bucket.table_id}"
                raise errors.AuthorizationFailedError(
                    f"{principal} may not {'continue' if read else 'close'} scanner {sid.hex()} of {what}: "
                    "another principal opened it", principal=principal, operation=READ.value, resource=what)
            if read:
                self.access.check(READ, session.bucket.table_id)
        except errors.AuthorizationFailedError as exc:
            self.metrics.refused.labels(exc.code.name).inc()
            raise

    # -- calls ------------------------------------------------------------------------------------

    def scan(self, request: pb.ScanKvRequest) -> bytes | pb.ScanKvResponse:
        """Answer one ScanKv request (a batch as the bytes of its ScanKvResponse, see :mod:`tablet.scan_wire`);
        raises the typed error to answer instead."""
        has_open = request.HasField("bucket_scan_req")
        limit = request.bucket_scan_req.limit if has_open and request.bucket_scan_req.HasField("limit") else None
        kind = scan.request_kind(has_open, request.HasField("scanner_id"), request.close_scanner,
                                 request.batch_size_bytes, limit)
        if kind == scan.OPEN:
            self._authorize_open(request.bucket_scan_req.table_id)
            return self._open(request.bucket_scan_req, request.batch_size_bytes, stream=False)[1].data
        if kind == scan.CLOSE:
            self._authorize_call(request.scanner_id, read=False)
            self._handle(scan.Close(request.scanner_id, self.clock_ms()))
            return pb.ScanKvResponse(scanner_id=request.scanner_id, has_more_results=False)
        self._authorize_call(request.scanner_id, read=True)
        return self._continue(request.scanner_id, request.call_seq_id, request.batch_size_bytes).data

    def stream(self, request: pb.ScanKvStreamRequest, context) -> Iterator[bytes | pb.ScanKvResponse]:
        """Answer one ScanKvStream call: every batch of one snapshot, then the end of the stream.

        A session like a unary scan's (limits, TTL, leadership), not addressable
        by id; an error is the stream's last response. Ends (and frees the
        session) when the call is cancelled or its client goes away.
        """
        sid = None
        try:
            req = request.bucket_scan_req
            scan.request_kind(request.HasField("bucket_scan_req"), False, False, request.batch_size_bytes,
                              req.limit if req.HasField("limit") else None)
            self._authorize_open(req.table_id)
            sid, answer = self._open(req, request.batch_size_bytes, stream=True)
            more, data = answer.has_more_results, answer.data
            del answer  # only gRPC holds a batch sent (until the next one is built)
            if more:
                context.add_callback(lambda: self._close_quietly(sid))
            yield data
            call = 0
            while more and context.is_active():
                del data
                self._authorize_call(sid, read=True)  # READ revoked mid-stream: the stream ends with the error
                answer = self._continue(sid, call, request.batch_size_bytes)
                more, data = answer.has_more_results, answer.data
                del answer
                call += 1
                yield data
        except errors.KvLeaseError as exc:
            yield pb.ScanKvResponse(error=error_pb(exc))
        except Exception as exc:  # a bug: answer it, keep serving
            log.exception("ScanKvStream failed")
            yield pb.ScanKvResponse(error=error_pb(errors.UnknownServerError(f"internal error: {exc}")))
        finally:
            if sid is not None:
                self._close_quietly(sid)

    def _close_quietly(self, sid: bytes) -> None:
        try:
            self._handle(scan.Close(sid, self.clock_ms()))
        except Exception:  # closing never refuses; nothing to answer anyway
            log.exception("closing scanner %s failed", sid.hex())

    def _budget(self, batch_size_bytes: int) -> int:
        """Bytes of rows in a batch: the records then stay within the (capped) batch size."""
        return max(min(batch_size_bytes, self.max_batch_bytes) - scan_batch.IPC_OVERHEAD, 0)

    def _open(self, req: pb.BucketScanReqPb, batch_size_bytes: int, stream: bool) -> tuple[bytes, scan_wire.Answer]:
        sid = self.new_id()
        tb = TableBucket(req.table_id, req.bucket)
        limit = req.limit if req.HasField("limit") else None
        session = _Session(tb, limit, stream, owner=self.access.principal())
        with self._lock:
            out = self._run(scan.Open(sid, tb, limit, self.clock_ms()))
            if isinstance(out[0], scan.Serve):
                self._sessions[sid] = session
        if isinstance(out[0], scan.Refuse):
            if isinstance(out[0].error, errors.TooManyScannersError):
                empty = self._empty_answer(req, tb, limit)
                if empty is not None:  # nothing to read: no session needed, so no limit applies
                    return sid, empty
            self.metrics.refused.labels(out[0].error.code.name).inc()
            raise out[0].error
        self.metrics.opened.inc()
        budget = self._budget(batch_size_bytes)
        with session.lock:
            try:
                replica = self.replicas.get(tb.table_id, tb.bucket)
                with replica.store.write_lock:
                    # Leader check and snapshot under the lock a bucket's store closes under. A bucket
                    # leaves the replica map before close_bucket ends its sessions (this one included,
                    # at the end of this call), and only then closes its store.
                    if self.replicas.get(tb.table_id, tb.bucket) is not replica:
                        raise errors.NotLeaderError(f"bucket {tb.bucket} of table {tb.table_id} changed leader")
                    start = req.start_after_key + b"\x00" if req.HasField("start_after_key") else b""
                    snapshot = replica.store.snapshot(values_from=start)
                with self._lock:
                    self.snapshots_open += 1
                session.snapshot = snapshot
                # the reader seeks the snapshot's iterator itself; read_batch, after a dropped read-ahead,
                # is given it positioned
                session.reader = scan_batch.ValueReader(replica.store.key_of_value, start)
                answer = self._build(sid, session, budget, limit, log_offset=snapshot.log_offset)
            except BaseException as exc:
                self._handle(scan.Failed(sid, scan.OPEN_CALL, self.clock_ms()))
                self._raise_as(exc, tb)
            self._served(sid, session, scan.OPEN_CALL, budget, limit, answer)
        return sid, answer

    def _empty_answer(self, req: pb.BucketScanReqPb, tb: TableBucket, limit: int | None) -> scan_wire.Answer | None:
        """The whole answer of an open that reads no row (an empty bucket or range, or limit 0):
        no rows and the snapshot's ``log_offset``; None if there are rows to read."""
        replica = self.replicas.get(tb.table_id, tb.bucket)
        with replica.store.write_lock:
            if self.replicas.get(tb.table_id, tb.bucket) is not replica:
                raise errors.NotLeaderError(f"bucket {tb.bucket} of table {tb.table_id} changed leader")
            snapshot = replica.store.snapshot()
        try:
            if limit != 0:
                it = snapshot._live()
                if req.HasField("start_after_key"):
                    it.seek(req.start_after_key + b"\x00")
                else:
                    it.seek_to_first()
                has_rows = it.valid()
                del it
                if has_rows:
                    return None
            return scan_wire.answer(scan_batch.EMPTY, log_offset=snapshot.log_offset)
        finally:
            snapshot.close()

    def _continue(self, sid: bytes, call: int, batch_size_bytes: int) -> scan_wire.Answer:
        out, session = self._handle(scan.Continue(sid, call, self.clock_ms()))
        ins = out[0]
        if isinstance(ins, scan.Replay):
            return self._replay(sid, session, ins.call)
        budget = self._budget(batch_size_bytes)
        with session.lock:  # the call is in flight: the session stays until it ends
            try:
                answer = self._ahead_or_build(sid, session, ins.call, budget, ins.max_rows)
            except BaseException as exc:
                self._handle(scan.Failed(sid, ins.call, self.clock_ms()))
                self._raise_as(exc, session.bucket)
            self._served(sid, session, ins.call, budget, ins.max_rows, answer)
        return answer

    def _replay(self, sid: bytes, session: _Session | None, call: int) -> scan_wire.Answer:
        """Call ``call`` answered again, byte for byte: read again from the snapshot (the same rows from
        the same place with the same budget and cap), or, for a session that ended with it, kept."""
        if session is None:  # the session ended with this batch
            with self._lock:
                finished = self._finished.get(sid)
            answer = finished.last.answer if finished is not None and finished.last.call == call else None
        else:
            with session.lock:
                last = session.last
                answer = None
                if last is not None and last.call == call and session.snapshot is not None:
                    try:
                        answer = last.answer or self._read_again(sid, session, last)
                    except BaseException as exc:
                        self._raise_as(exc, session.bucket)
        if answer is None:
            raise errors.UnknownScannerIdError(f"scanner {sid.hex()} finished; its last batch is not kept")
        self.metrics.bytes.inc(answer.records_size)
        return answer

    def _read_again(self, sid: bytes, session: _Session, last: _Served) -> scan_wire.Answer:
        """``last``'s batch built again; the iterator then goes back to where it was (hold the lock)."""
        it = session.snapshot._live()
        it.seek(last.after + b"\x00")
        batch = scan_batch.read_batch(it, last.budget, last.max_rows)
        it.seek(session.read_to + b"\x00")
        del it
        return scan_wire.answer(batch, scanner_id=sid if batch.has_more else b"")

    # -- batches ----------------------------------------------------------------------------------

    def _build(self, sid: bytes, session: _Session, budget: int, max_rows: int | None,
               log_offset: int | None = None) -> scan_wire.Answer:
        """The next batch from the session's iterator, serialized (hold the session's lock)."""
        it = session.snapshot._live()
        if session.reader is not None:
            batch = session.reader.read(session.snapshot.values(), it, budget, max_rows)
        else:
            batch = scan_batch.read_batch(it, budget, max_rows)
        del it  # no iterator reference outlives the batch: closing the snapshot frees it
        if batch.count:
            session.read_to = batch.last_key
        return scan_wire.answer(batch, scanner_id=sid if batch.has_more and not session.stream else b"",
                                log_offset=log_offset)

    def _ahead_or_build(self, sid: bytes, session: _Session, call: int, budget: int,
                        max_rows: int | None) -> scan_wire.Answer:
        ahead, session.ahead, session.ahead_token = session.ahead, None, None  # a queued read-ahead stays idle
        if ahead is not None:
            key, answer = ahead
            if key == (call, budget, max_rows) and answer is not None:
                self.metrics.read_ahead.labels("used").inc()
                return answer
            self.metrics.read_ahead.labels("dropped").inc()
            session.reader = None  # its values iterator cannot go back: read_batch from here on
            it = session.snapshot._live()  # read ahead for another size: back after the last key answered
            it.seek(session.resume_key + b"\x00")
            del it
            session.read_to = session.resume_key
        return self._build(sid, session, budget, max_rows)

    def _read_ahead(self, sid: bytes, session: _Session, token: object, call: int, budget: int,
                    max_rows: int | None) -> None:
        with session.lock:
            if session.ahead_token is not token or session.snapshot is None:
                return  # the call came first, or the session ended
            session.ahead_token = None
            try:
                answer = self._build(sid, session, budget, max_rows)
            except Exception:  # the call builds it again (and answers the error)
                log.debug("read-ahead of %s failed", session.bucket, exc_info=True)
                answer = None
            session.ahead = ((call, budget, max_rows), answer)

    def _served(self, sid: bytes, session: _Session, call: int, budget: int, max_rows: int | None,
                answer: scan_wire.Answer) -> None:
        """Book the answer, tell the manager (hold the session's lock), read ahead.

        The answer itself is kept only if the session ends with it (a replay of an earlier call reads
        the batch again), so a session holds at most one batch of its own: the one read ahead.
        """
        session.last = _Served(call, session.resume_key, budget, max_rows, answer)
        session.rows += answer.record_count
        if answer.record_count:
            session.resume_key = answer.resume_key
        self.metrics.rows.inc(answer.record_count)
        self.metrics.bytes.inc(answer.records_size)
        out, _ = self._handle(scan.Served(sid, call, answer.record_count, answer.has_more_results, self.clock_ms()))
        if not any(isinstance(ins, scan.Release) for ins in out):
            session.last = dataclasses.replace(session.last, answer=None)
        if self.read_ahead and not session.stream and answer.has_more_results and not session.released.is_set():
            token = session.ahead_token = object()
            max_rows = None if session.limit is None else session.limit - session.rows
            try:
                self._pool.submit(self._read_ahead, sid, session, token, call + 1, budget, max_rows)
            except RuntimeError:  # shutting down
                session.ahead_token = None

    def _raise_as(self, exc: BaseException, tb: TableBucket) -> None:
        """Re-raise a failure while reading; NOT_LEADER if the bucket's store closed meanwhile."""
        if not isinstance(exc, Exception) or (isinstance(exc, errors.KvLeaseError)
                                              and not isinstance(exc, BucketStoreError)):
            raise exc
        try:
            self.replicas.get(tb.table_id, tb.bucket)
        except errors.NotLeaderError as not_leader:
            raise not_leader from exc
        log.error("scan of %s failed", tb, exc_info=exc)
        raise errors.UnknownServerError(f"scan of bucket {tb.bucket} of table {tb.table_id} failed: {exc}") from exc



