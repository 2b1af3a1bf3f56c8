"""The pure scanner-session state machine: ``ScannerManager.handle(*events) -> list[Instruction]``.

A live KV scan (docs/live-scans.md) is a session on the bucket's
leader: a RocksDB snapshot read batch by batch. This module only keeps the
books — which sessions exist, which call each may serve next, limits, idle
time, why a session went away. No RocksDB, gRPC or clock inside: time comes
in the events (``now_ms``, monotonic), the shell (``tablet/scan/service.py``)
owns the snapshots and carries out the instructions. Events, instructions and
the registered dispatch come from :mod:`kvlease.common.statemachine`.

Calls of a session: the open's batch is call :data:`OPEN_CALL` (-1);
continuations are ``call_seq_id`` 0, 1, 2, ... Re-sending the last one
replays its batch — also after the session ended with it (its last batch),
for ``2 * ttl``, if the shell still keeps that batch; any other number is
``INVALID_SCAN_REQUEST`` and the session stays. One call at a time: a request while a call is in progress is
``INVALID_SCAN_REQUEST`` too (the session stays). A session's resources are
released (:class:`Release`) only while no call is in progress: a close, an
expiry or a lost leadership that meets a call in progress takes effect when
that call ends (:class:`Served` / :class:`Failed`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.statemachine import Event, Instruction, StateMachine, on

#: The call number of the batch answered with the open.
OPEN_CALL = -1

# Why a session was released (Release.reason; metrics label).
CLOSED = "closed"          # the client closed it
FINISHED = "finished"      # its last batch was served
EXPIRED = "expired"        # idle longer than kv.scanner.ttl
NOT_LEADER = "not-leader"  # its bucket is no longer led here
DROPPED = "dropped"        # its table was dropped
FAILED = "failed"          # building a batch failed: its cursor is unknown
SHUTDOWN = "shutdown"      # the server stops


# --- request forms -----------------------------------------------------------------

OPEN, CONTINUE, CLOSE = "open", "continue", "close"


def request_kind(has_open: bool, has_scanner_id: bool, close: bool, batch_size_bytes: int,
                 limit: int | None = None) -> str:
    """:data:`OPEN`, :data:`CONTINUE` or :data:`CLOSE` for a ScanKv request's shape.

    Raises InvalidScanRequestError for both or neither of ``bucket_scan_req``
    and ``scanner_id``, a close with ``bucket_scan_req``, ``batch_size_bytes
    <= 0`` on a data request (open or continue), or a negative ``limit`` (0 is
    a scan that answers no rows).
    """
    if has_open and has_scanner_id:
        raise errors.InvalidScanRequestError("a ScanKv request has either bucket_scan_req (open) or scanner_id "
                                             "(continue/close), not both")
    if not has_open and not has_scanner_id:
        raise errors.InvalidScanRequestError("a ScanKv request needs bucket_scan_req (open) or scanner_id "
                                             "(continue/close)")
    if close:
        if has_open:
            raise errors.InvalidScanRequestError("close_scanner goes with scanner_id, not bucket_scan_req")
        return CLOSE
    if batch_size_bytes <= 0:
        raise errors.InvalidScanRequestError(f"batch_size_bytes must be positive, got {batch_size_bytes}")
    if has_open and limit is not None and limit < 0:
        raise errors.InvalidScanRequestError(f"limit must not be negative, got {limit}")
    return OPEN if has_open else CONTINUE


# --- events ------------------------------------------------------------------------

@dataclass(frozen=True)
class Open(Event):
    """Open a session (the shell then takes the snapshot and serves call OPEN_CALL)."""

    scanner_id: bytes
    bucket: TableBucket
    limit: int | None
    now_ms: int


@dataclass(frozen=True)
class Continue(Event):
    scanner_id: bytes
    call_seq_id: int
    now_ms: int


@dataclass(frozen=True)
class Close(Event):
    scanner_id: bytes
    now_ms: int


@dataclass(frozen=True)
class Served(Event):
    """The shell answered ``call`` with ``rows`` rows; ``has_more``: rows remain in the snapshot."""

    scanner_id: bytes
    call: int
    rows: int
    has_more: bool
    now_ms: int


@dataclass(frozen=True)
class Failed(Event):
    """Serving ``call`` failed (the shell answers the error): the session ends."""

    scanner_id: bytes
    call: int
    now_ms: int


@dataclass(frozen=True)
class Tick(Event):
    """The reaper's beat: expire idle sessions, forget old expiries."""

    now_ms: int


@dataclass(frozen=True)
class CloseBucket(Event):
    """The bucket is no longer led here, or (``dropped``) its table was dropped."""

    bucket: TableBucket
    now_ms: int
    dropped: bool = False


@dataclass(frozen=True)
class CloseAll(Event):
    now_ms: int


# --- instructions ----------------------------------------------------------------------

@dataclass(frozen=True)
class Serve(Instruction):
    """Build call ``call``'s batch from the session's cursor; at most ``max_rows`` rows (None: no cap)."""

    scanner_id: bytes
    call: int
    max_rows: int | None


@dataclass(frozen=True)
class Replay(Instruction):
    """Answer the kept batch of ``call`` again."""

    scanner_id: bytes
    call: int


@dataclass(frozen=True)
class Release(Instruction):
    """Free the session's snapshot and kept batch."""

    scanner_id: bytes
    bucket: TableBucket
    reason: str


@dataclass(frozen=True)
class Refuse(Instruction):
    """Answer the request with ``error``."""

    scanner_id: bytes
    error: errors.KvLeaseError


# --- state -------------------------------------------------------------------------------

def _table(tb: TableBucket) -> str:
    """``table 3``, or ``partition 7 of table 3`` for a partition's bucket."""
    return f"table {tb.table_id}" if tb.partition_id is None else f"partition {tb.partition_id} of table {tb.table_id}"


@dataclass
class Session:
    bucket: TableBucket
    limit: int | None
    last_access_ms: int
    rows: int = 0
    last_call: int | None = None      # the last call served (None: not even the open's batch yet)
    in_flight: int | None = OPEN_CALL  # the call being served (None: idle)
    ending: str | None = None          # released when the call in flight ends, for this reason

    def next_call(self) -> int:
        return OPEN_CALL if self.last_call is None else self.last_call + 1


@dataclass
class ScannerManager(StateMachine):
    """The scanner sessions of one tablet server; see the module docstring.

    ``gone`` remembers for ``2 * ttl_ms`` why recent sessions ended: expiry
    (answered SCANNER_EXPIRED), lost leadership (NOT_LEADER), or their last
    batch (that call is replayed); any other id not open is UNKNOWN_SCANNER_ID.
    """

    max_per_bucket: int
    max_per_server: int
    ttl_ms: int
    sessions: dict[bytes, Session] = field(default_factory=dict)
    per_bucket: dict[TableBucket, int] = field(default_factory=dict)
    gone: dict[bytes, tuple[str, int, int | None]] = field(default_factory=dict)  # id -> (why, at ms, last call)

    def open_count(self, bucket: TableBucket | None = None) -> int:
        return len(self.sessions) if bucket is None else self.per_bucket.get(bucket, 0)

    # -- requests -------------------------------------------------------------------------

    @on(Open)
    def _on_open(self, ev: Open) -> list[object]:
        if ev.scanner_id in self.sessions or ev.scanner_id in self.gone:
            return [Refuse(ev.scanner_id, errors.InvalidScanRequestError("scanner id already in use"))]
        if len(self.sessions) >= self.max_per_server:
            return [Refuse(ev.scanner_id, errors.TooManyScannersError(
                f"this tablet server has {len(self.sessions)} open scanners (kv.scanner.max-per-server)"))]
        if self.per_bucket.get(ev.bucket, 0) >= self.max_per_bucket:
            return [Refuse(ev.scanner_id, errors.TooManyScannersError(
                f"bucket {ev.bucket.bucket} of {_table(ev.bucket)} has {self.per_bucket[ev.bucket]} open "
                f"scanners (kv.scanner.max-per-bucket)"))]
        self.sessions[ev.scanner_id] = Session(ev.bucket, ev.limit, ev.now_ms)
        self.per_bucket[ev.bucket] = self.per_bucket.get(ev.bucket, 0) + 1
        return [Serve(ev.scanner_id, OPEN_CALL, ev.limit)]

    @on(Continue)
    def _on_continue(self, ev: Continue) -> list[object]:
        sid = ev.scanner_id
        session = self.sessions.get(sid)
        if session is None or session.ending is not None:
            why, at, call = self.gone.get(sid, (None, 0, 0))
            if why == FINISHED and call == ev.call_seq_id and ev.now_ms - at <= 2 * self.ttl_ms:
                return [Replay(sid, call)]  # the last batch, lost on its way
            return [Refuse(sid, self._gone_error(sid, ev.now_ms))]
        if session.in_flight is not None:
            return [Refuse(sid, errors.InvalidScanRequestError(
                f"call {session.in_flight} of this scanner is still in progress; send one call at a time"))]
        if ev.now_ms - session.last_access_ms > self.ttl_ms:
            self.gone[sid] = (EXPIRED, ev.now_ms, session.last_call)
            return [self._release(sid, EXPIRED), Refuse(sid, self._gone_error(sid, ev.now_ms))]
        expected = session.next_call()
        if ev.call_seq_id == expected:
            session.in_flight = expected
            session.last_access_ms = ev.now_ms
            remaining = None if session.limit is None else session.limit - session.rows
            return [Serve(sid, expected, remaining)]
        if ev.call_seq_id == session.last_call and ev.call_seq_id != OPEN_CALL:
            session.last_access_ms = ev.now_ms
            return [Replay(sid, ev.call_seq_id)]
        return [Refuse(sid, errors.InvalidScanRequestError(
            f"call_seq_id {ev.call_seq_id} out of order: expected {expected}"
            + (f" (or {session.last_call} to replay the last batch)" if session.last_call != OPEN_CALL else "")))]

    @on(Close)
    def _on_close(self, ev: Close) -> list[object]:
        session = self.sessions.get(ev.scanner_id)
        if session is None:
            return []  # closing an unknown (or already closed) scanner succeeds
        if session.in_flight is not None:
            session.ending = session.ending or CLOSED
            return []
        return [self._release(ev.scanner_id, CLOSED)]

    # -- outcomes of calls ------------------------------------------------------------------

    def _end_call(self, sid: bytes, call: int) -> Session:
        session = self.sessions.get(sid)
        if session is None or session.in_flight != call:
            raise AssertionError(f"no call {call} in flight for scanner {sid.hex()}")
        session.in_flight = None
        return session

    @on(Served)
    def _on_served(self, ev: Served) -> list[object]:
        session = self._end_call(ev.scanner_id, ev.call)
        session.last_call = ev.call
        session.rows += ev.rows
        session.last_access_ms = ev.now_ms
        if session.limit is not None and session.rows > session.limit:
            raise AssertionError(f"scanner {ev.scanner_id.hex()} served {session.rows} rows, limit {session.limit}")
        if session.ending is not None:
            return [self._release(ev.scanner_id, session.ending)]
        if not ev.has_more or (session.limit is not None and session.rows >= session.limit):
            if ev.call != OPEN_CALL:
                self.gone[ev.scanner_id] = (FINISHED, ev.now_ms, ev.call)
            return [self._release(ev.scanner_id, FINISHED)]
        return []

    @on(Failed)
    def _on_failed(self, ev: Failed) -> list[object]:
        session = self._end_call(ev.scanner_id, ev.call)
        return [self._release(ev.scanner_id, session.ending or FAILED)]

    # -- housekeeping -------------------------------------------------------------------------

    @on(Tick)
    def _on_tick(self, ev: Tick) -> list[object]:
        horizon = ev.now_ms - 2 * self.ttl_ms
        for sid in [s for s, (_why, at, _call) in self.gone.items() if at < horizon]:
            del self.gone[sid]
        out: list[object] = []
        for sid, session in list(self.sessions.items()):
            if session.in_flight is None and ev.now_ms - session.last_access_ms > self.ttl_ms:
                self.gone[sid] = (EXPIRED, ev.now_ms, session.last_call)
                out.append(self._release(sid, EXPIRED))
        return out

    @on(CloseBucket)
    def _on_closebucket(self, ev: CloseBucket) -> list[object]:
        return self._end_all([s for s, session in self.sessions.items() if session.bucket == ev.bucket],
                             DROPPED if ev.dropped else NOT_LEADER, ev.now_ms)

    @on(CloseAll)
    def _on_closeall(self, ev: CloseAll) -> list[object]:
        return self._end_all(list(self.sessions), SHUTDOWN, ev.now_ms)

    def _end_all(self, sids: list[bytes], reason: str, now_ms: int) -> list[object]:
        out: list[object] = []
        for sid in sids:
            session = self.sessions[sid]
            # later calls: find the new leader, or learn that the table is gone
            self.gone[sid] = (DROPPED if reason == DROPPED else NOT_LEADER, now_ms, session.last_call)
            if session.in_flight is not None:
                session.ending = reason if session.ending in (None, CLOSED) else session.ending
            else:
                out.append(self._release(sid, reason))
        return out

    def _release(self, sid: bytes, reason: str) -> Release:
        session = self.sessions.pop(sid)
        left = self.per_bucket[session.bucket] - 1
        if left:
            self.per_bucket[session.bucket] = left
        else:
            del self.per_bucket[session.bucket]  # no entry per bucket ever scanned: the map stays small
        return Release(sid, session.bucket, reason)

    def _gone_error(self, sid: bytes, now_ms: int) -> errors.KvLeaseError:
        why, at, _call = self.gone.get(sid, (None, 0, 0))
        if why in (EXPIRED, NOT_LEADER, DROPPED) and now_ms - at <= 2 * self.ttl_ms:
            if why == EXPIRED:
                return errors.ScannerExpiredError(
                    f"scanner {sid.hex()} expired after more than {self.ttl_ms} ms idle (kv.scanner.ttl); "
                    "open a new scan (after the last resume_key to continue)")
            if why == DROPPED:
                return errors.TableNotExistError(f"scanner {sid.hex()} was closed: its table was dropped")
            return errors.NotLeaderError(f"scanner {sid.hex()} was closed: its bucket is no longer led here; "
                                         "open a new scan on the new leader")
        return errors.UnknownScannerIdError(f"unknown scanner id {errors.show(sid.hex())} (finished, closed, or never "
                                            "opened)")

    # -- invariants ---------------------------------------------------------------------------

    def validate(self) -> None:
        counts = Counter(s.bucket for s in self.sessions.values())
        assert dict(counts) == self.per_bucket, (dict(counts), self.per_bucket)
        assert all(n > 0 for n in self.per_bucket.values())
        assert len(self.sessions) <= self.max_per_server
        assert all(n <= self.max_per_bucket for n in self.per_bucket.values())
        for sid, s in self.sessions.items():
            assert s.in_flight is None or s.in_flight == s.next_call(), (sid, s)
            assert s.ending is None or s.in_flight is not None, (sid, s)  # idle + ending: released at once
            assert s.limit is None or s.rows <= s.limit, (sid, s)
            assert s.last_call is not None or s.in_flight == OPEN_CALL, (sid, s)
            if sid in self.gone:
                assert s.ending is not None and self.gone[sid][0] in (NOT_LEADER, DROPPED), (sid, s)
