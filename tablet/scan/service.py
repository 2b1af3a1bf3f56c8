"""The shell of live KV scans: session resources, read-ahead, the reaper.

:class:`ScanService` carries out what the pure :class:`~kvlease.tablet.scan.manager.ScannerManager`
decides: a :mod:`kvlease.common.statemachine` shell, one registered executor per
instruction, each carried out inline by the call that handed the event in.
It creates each session (:class:`~kvlease.tablet.scan.session.ScanSession`: its RocksDB
snapshot from ``BucketStore.snapshot()``, taken under the bucket's write lock,
and how to answer its last call again), has it build batches
(:mod:`kvlease.tablet.scan.batch`) and their answers' bytes (:mod:`kvlease.tablet.scan.wire`), runs the reaper every
``kv.scanner.expiration-interval`` and ends a bucket's sessions before its
store closes (it listens to the ReplicaManager). See docs/live-scans.md.

Read-ahead, replays and memory: :mod:`kvlease.tablet.scan.session`. Only a batch a
unary session ends with is kept (its snapshot is gone), in a cache of
:data:`FINISHED_CACHE_BYTES` shared by finished sessions.

Locks: ``_lock`` guards the manager and the session map; nothing waits
while holding it. A session's ``lock`` is held while a batch is built (a
call or its read-ahead); its snapshot is closed only under it. A session
whose call is in flight is released by that call as it ends, which sets
``released``: :meth:`close_bucket` waits for that, so a bucket's store never
closes under a batch being read.

Authorization: :mod:`kvlease.tablet.scan.access`. Metrics: :mod:`kvlease.tablet.scan.metrics`.
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

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.wire import error_pb
from kvlease.common.model import TableBucket
from kvlease.common.statemachine import Shell, on
from kvlease.common.security.server import OPEN
from kvlease.tablet.authz import TableAccess
from kvlease.tablet.bucket.store import BucketStoreError
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.tablet.scan.ttl_filter import ttl_filter
from kvlease.tablet.scan import manager as scan
from kvlease.tablet.scan import batch as scan_batch
from kvlease.tablet.scan import wire as scan_wire
from kvlease.tablet.scan.access import ScanAccess
from kvlease.tablet.scan.metrics import ScanMetrics
from kvlease.tablet.scan.session import ScanSession

log = logging.getLogger(__name__)

FINISHED_CACHE_BYTES = 16 << 20  # last batches of finished unary sessions kept for a replay (oldest go first)
READ_AHEAD_THREADS = 2
RELEASE_WAIT_S = 60.0  # close_bucket's patience with a call in flight (one batch)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass
class _Outcome:
    """What the manager's instructions for one event ask of the call that handed it in."""

    serve: scan.Serve | None = None
    replay: scan.Replay | None = None
    refuse: scan.Refuse | None = None
    released: list[tuple[scan.Release, ScanSession]] = field(default_factory=list)  # free them, unlocked



class ScanService(Shell):
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
        self._sessions: dict[bytes, ScanSession] = {}
        self._finished: OrderedDict[bytes, ScanSession] = OrderedDict()  # sid -> finished session (its last batch)
        self._finished_bytes = 0
        self._pool = ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="scan-ahead")
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self.metrics = ScanMetrics(self.counts)
        self.authz = ScanAccess(self.access, self.metrics.refused, self._session_of)
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
            released = self._carry_out(scan.Tick(self.clock_ms())).released
            for sid in [s for s in self._finished if s not in self.manager.gone]:
                self._finished_bytes -= len(self._finished.pop(sid).last.answer.data)
        self._free(released)
        return len(released)

    def close_bucket(self, tb: TableBucket, dropped: bool = False) -> None:
        """End the bucket's sessions (it is no longer led here, or its table was ``dropped``);
        returns once none reads its store."""
        self._end(scan.CloseBucket(tb, self.clock_ms(), dropped), tb)

    def _end(self, event: object, bucket: TableBucket | None) -> None:
        with self._lock:
            released = self._carry_out(event).released
            busy = [s for s in self._sessions.values() if bucket is None or s.bucket == bucket]
        self._free(released)
        for session in busy:  # a call in flight releases its session as it ends
            if not session.released.wait(RELEASE_WAIT_S):
                log.warning("a scan call on %s did not end within %.0f s", session.bucket, RELEASE_WAIT_S)

    def counts(self) -> tuple[int, dict[TableBucket, int], int]:
        """``(open sessions, open sessions per bucket, snapshots held)``."""
        with self._lock:
            return self.manager.open_count(), dict(self.manager.per_bucket), self.snapshots_open

    # -- the manager's instructions ------------------------------------------------------------

    def _run(self, event: object, outcome: _Outcome | None = None) -> list[object]:
        """Hand ``event`` to the manager and carry out its instructions into ``outcome`` (hold ``_lock``);
        returns them. One of a type with no executor here raises UnhandledError (a new instruction
        must get its executor, never be skipped)."""
        out = self.manager.handle(event)
        self.execute(out, outcome if outcome is not None else _Outcome())
        return out

    def _carry_out(self, event: object) -> _Outcome:
        outcome = _Outcome()
        self._run(event, outcome)
        return outcome

    @on(scan.Serve)
    def _serve(self, ins: scan.Serve, outcome: _Outcome) -> None:
        outcome.serve = ins

    @on(scan.Replay)
    def _replay_instruction(self, ins: scan.Replay, outcome: _Outcome) -> None:
        outcome.replay = ins

    @on(scan.Refuse)
    def _refuse(self, ins: scan.Refuse, outcome: _Outcome) -> None:
        outcome.refuse = outcome.refuse or ins

    @on(scan.Release)
    def _release(self, ins: scan.Release, outcome: _Outcome) -> None:
        """Drop the session from the map (``outcome.released``: free it after, unlocked); keep a finished
        unary session's last batch for a replay."""
        session = self._sessions.pop(ins.scanner_id)
        outcome.released.append((ins, session))
        if (ins.reason == scan.FINISHED and not session.stream and session.last is not None
                and session.last.call != scan.OPEN_CALL and session.last.answer is not None):
            self._keep_finished(ins.scanner_id, session)

    def _keep_finished(self, sid: bytes, session: ScanSession) -> None:
        """Keep a finished session (its last batch and owner; its snapshot is freed) for a retry of its
        last call (the manager knows for how long)."""
        self._finished[sid] = session
        self._finished_bytes += len(session.last.answer.data)
        while self._finished_bytes > FINISHED_CACHE_BYTES:
            _sid, old = self._finished.popitem(last=False)
            self._finished_bytes -= len(old.last.answer.data)

    def _free(self, released: list[tuple[scan.Release, ScanSession]]) -> None:
        for ins, session in released:
            with session.lock:  # waits for a read-ahead in progress
                if session.free():
                    with self._lock:
                        self.snapshots_open -= 1
                session.released.set()
            self.metrics.released.labels(ins.reason).inc()
            if ins.reason == scan.EXPIRED:
                self.metrics.expired.inc()
            log.debug("scanner %s of %s released (%s)", ins.scanner_id.hex(), ins.bucket, ins.reason)

    def _handle(self, event: object) -> tuple[_Outcome, ScanSession | None]:
        """Feed ``event``, free what it releases, raise its refusal; returns what its instructions
        asked and the event's session."""
        with self._lock:
            session = self._sessions.get(event.scanner_id)  # type: ignore[attr-defined]
            outcome = self._carry_out(event)
        self._free(outcome.released)
        if outcome.refuse is not None:
            self.metrics.refused.labels(outcome.refuse.error.code.name).inc()
            raise outcome.refuse.error
        return outcome, session

    def _session_of(self, sid: bytes) -> ScanSession | None:
        """The open (or kept finished) session of ``sid``."""
        with self._lock:
            return self._sessions.get(sid) or self._finished.get(sid)

    # -- calls ------------------------------------------------------------------------------------

    def scan(self, request: pb.ScanKvRequest) -> bytes | pb.ScanKvResponse:
        """Answer one ScanKv request (a batch as the bytes of its ScanKvResponse, see :mod:`kvlease.tablet.scan.wire`);
        raises the typed error to answer instead."""
        has_open = request.HasField("bucket_scan_req")
        limit = request.bucket_scan_req.limit if has_open and request.bucket_scan_req.HasField("limit") else None
        kind = scan.request_kind(has_open, request.HasField("scanner_id"), request.close_scanner,
                                 request.batch_size_bytes, limit)
        if kind == scan.OPEN:
            return self._open(request.bucket_scan_req, request.batch_size_bytes, stream=False)[1].data
        if kind == scan.CLOSE:
            self.authz.check_call(request.scanner_id, read=False)
            self._handle(scan.Close(request.scanner_id, self.clock_ms()))
            return pb.ScanKvResponse(scanner_id=request.scanner_id, has_more_results=False)
        self.authz.check_call(request.scanner_id, read=True)
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
            sid, answer = self._open(req, request.batch_size_bytes, stream=True)
            more, data = answer.has_more_results, answer.data
            del answer  # only gRPC holds a batch sent (until the next one is built)
            if more:
                context.add_callback(lambda: self._close_quietly(sid))
            yield data
            call = 0
            while more and context.is_active():
                del data
                self.authz.check_call(sid, read=True)  # READ revoked mid-stream: the stream ends with the error
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
        tb = self.replicas.tables.bucket_of(req)  # with its partition: the errors of a request naming none held
        self.authz.check_open(tb.physical_id)
        sid = self.new_id()
        limit = req.limit if req.HasField("limit") else None
        session = ScanSession(tb, limit, stream, owner=self.access.principal())
        with self._lock:
            outcome = self._carry_out(scan.Open(sid, tb, limit, self.clock_ms()))
            if outcome.serve is not None:
                self._sessions[sid] = session
        if outcome.refuse is not None:
            if isinstance(outcome.refuse.error, errors.TooManyScannersError):
                empty = self._empty_answer(req, tb, limit)
                if empty is not None:  # nothing to read: no session needed, so no limit applies
                    return sid, empty
            self.metrics.refused.labels(outcome.refuse.error.code.name).inc()
            raise outcome.refuse.error
        self.metrics.opened.inc()
        budget = self._budget(batch_size_bytes)
        with session.lock:
            try:
                start = req.start_after_key + b"\x00" if req.HasField("start_after_key") else b""
                replica, snapshot, epoch = self._leader_snapshot(tb, values_from=start)
                with self._lock:
                    self.snapshots_open += 1
                session.snapshot = snapshot
                # the reader seeks the snapshot's iterator itself; read_batch, after a dropped read-ahead,
                # is given it positioned
                session.reader = scan_batch.ValueReader(replica.store.key_of_value, start)
                session.keep = ttl_filter(replica.store.codec)  # row TTL: expired rows left out
                answer = session.build(sid, budget, limit, log_offset=snapshot.log_offset)
                # the open is the scan's point in time: its snapshot is as new as any write acknowledged before
                self.replicas.confirm(replica, epoch)  # it was sent (its later batches come from that snapshot)
            except BaseException as exc:
                self._handle(scan.Failed(sid, scan.OPEN_CALL, self.clock_ms()))
                self._raise_as(exc, tb)
            self._served(sid, session, scan.OPEN_CALL, budget, limit, answer)
        return sid, answer

    def _leader_snapshot(self, tb: TableBucket, **snapshot_args):
        """``(replica, snapshot, leader epoch)`` of the bucket led here; NotLeaderError if it changed leader.
        Its answer is confirmed (:meth:`ReplicaManager.confirm`) once built, under that epoch.

        Leader check and snapshot under the lock a bucket's store closes under. A bucket leaves the
        replica map before close_bucket ends its sessions (a session being opened included, at the
        end of its call), and only then closes its store.
        """
        replica = self.replicas.get(tb.physical_id, tb.bucket)
        epoch = replica.role.leader_epoch if replica.role is not None else None
        with replica.store.write_lock:
            if self.replicas.get(tb.physical_id, tb.bucket) is not replica:
                raise errors.NotLeaderError(f"{replica.where} changed leader", **replica.details)
            return replica, replica.store.snapshot(**snapshot_args), epoch

    def _empty_answer(self, req: pb.BucketScanReqPb, tb: TableBucket, limit: int | None) -> scan_wire.Answer | None:
        """The whole answer of an open that reads no row (an empty bucket or range, or limit 0):
        no rows and the snapshot's ``log_offset``; None if there are rows to read."""
        replica, snapshot, epoch = self._leader_snapshot(tb)
        try:
            if limit != 0:
                it = snapshot.seekable()
                if req.HasField("start_after_key"):
                    it.seek(req.start_after_key + b"\x00")
                else:
                    it.seek_to_first()
                has_rows = it.valid()
                del it
                if has_rows:
                    return None
            answer = scan_wire.answer(scan_batch.EMPTY, log_offset=snapshot.log_offset)
        finally:
            snapshot.close()
        self.replicas.confirm(replica, epoch)
        return answer

    def _continue(self, sid: bytes, call: int, batch_size_bytes: int) -> scan_wire.Answer:
        outcome, session = self._handle(scan.Continue(sid, call, self.clock_ms()))
        if outcome.replay is not None:
            return self._replay(sid, session, outcome.replay.call)
        ins = outcome.serve
        budget = self._budget(batch_size_bytes)
        with session.lock:  # the call is in flight: the session stays until it ends
            try:
                answer = self._ahead_or_build(sid, session, ins.call, budget, ins.max_rows)
            except BaseException as exc:
                self._handle(scan.Failed(sid, ins.call, self.clock_ms()))
                self._raise_as(exc, session.bucket)
            self._served(sid, session, ins.call, budget, ins.max_rows, answer)
        return answer

    def _replay(self, sid: bytes, session: ScanSession | None, call: int) -> scan_wire.Answer:
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
                        answer = last.answer or session.read_again(sid, last)
                    except BaseException as exc:
                        self._raise_as(exc, session.bucket)
        if answer is None:
            raise errors.UnknownScannerIdError(f"scanner {sid.hex()} finished; its last batch is not kept")
        self.metrics.bytes.inc(answer.records_size)
        return answer

    # -- batches ----------------------------------------------------------------------------------

    def _ahead_or_build(self, sid: bytes, session: ScanSession, call: int, budget: int,
                        max_rows: int | None) -> scan_wire.Answer:
        answer, outcome = session.take_ahead(call, budget, max_rows)
        if outcome is not None:
            self.metrics.read_ahead.labels(outcome).inc()
        return answer if answer is not None else session.build(sid, budget, max_rows)

    def _served(self, sid: bytes, session: ScanSession, call: int, budget: int, max_rows: int | None,
                answer: scan_wire.Answer) -> None:
        """Book the answer, tell the manager (hold the session's lock), read ahead.

        The answer itself is kept only if the session ends with it (a replay of an earlier call reads
        the batch again), so a session holds at most one batch of its own: the one read ahead.
        """
        session.book(call, budget, max_rows, answer)
        self.metrics.rows.inc(answer.record_count)
        self.metrics.bytes.inc(answer.records_size)
        outcome, _ = self._handle(scan.Served(sid, call, answer.record_count, answer.has_more_results,
                                              self.clock_ms()))
        if not outcome.released:
            session.last = dataclasses.replace(session.last, answer=None)
        if self.read_ahead and not session.stream and answer.has_more_results and not session.released.is_set():
            token = session.ahead_token = object()
            max_rows = None if session.limit is None else session.limit - session.rows
            try:
                self._pool.submit(session.read_ahead, sid, token, call + 1, budget, max_rows)
            except RuntimeError:  # shutting down
                session.ahead_token = None

    def _raise_as(self, exc: BaseException, tb: TableBucket) -> None:
        """Re-raise a failure while reading; NOT_LEADER if the bucket's store closed meanwhile."""
        if not isinstance(exc, Exception) or (isinstance(exc, errors.KvLeaseError)
                                              and not isinstance(exc, BucketStoreError)):
            raise exc
        try:
            replica = self.replicas.get(tb.physical_id, tb.bucket)
        except errors.NotLeaderError as not_leader:
            raise not_leader from exc
        log.error("scan of %s failed", tb, exc_info=exc)
        raise errors.UnknownServerError(f"scan of {replica.where} failed: {exc}") from exc
