"""A bucket's open files, its changelog and RocksDB: opened on demand, parked when idle, reopened after a failure.

A tablet server leads thousands of buckets, and an open bucket holds up to
:data:`~kvlease.tablet.store.kvstore.FDS_PER_OPEN_BUCKET` file descriptors. So a bucket's
files open on first use (:meth:`BucketFiles.use`: the changelog, then
RocksDB, then the changelog records RocksDB lacks are replayed into it, see
``tablet/bucket/store.py``), and the server's :class:`~kvlease.tablet.bucket.open_buckets.OpenBuckets`
*parks* the least recently used idle ones: their files close, their offsets
are remembered, the next use opens them again. A bucket is never parked while
an operation runs on it, while a snapshot of it is open (a live scan session)
or while it has a failure not yet repaired.

Failures (a full disk, too many open files): a failed local write
(:meth:`BucketFiles.fail`) or a failed open marks the bucket failed. Writes
are refused, reads go on while the files are open, and after a backoff
(``tablet.bucket.reopen-backoff``, doubled for each failure in a row up to
``tablet.bucket.reopen-backoff.max``; a failure within that maximum of a
reopen continues the row, as a reopen on a full disk may succeed and the
write after it fail) the files are closed and opened again:
by the first use once no operation runs on the failed files and no snapshot
of them is open, or by the server's keeper (``tablet/replicas/keeper.py``,
which first ends the bucket's live scan sessions), so a bucket recovers by
itself.
The reopen replays the changelog into RocksDB: every acknowledged write was in
the changelog before it was acknowledged, so none is lost. A replicated bucket
replays only up to its high watermark (:attr:`BucketFiles.replay_limit`): the
entries above are not committed and stay out of RocksDB.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

from kvlease.common.logentry import LogEntry
from kvlease.tablet.bucket.open_buckets import OpenBuckets
from kvlease.tablet.log.changelog import Changelog
from kvlease.tablet.store import kv_rebase, snapshot_install
from kvlease.tablet.store.kvstore import BucketInUseError, BucketStoreError, KvStore

log = logging.getLogger(__name__)

_REPLAY_BYTES = 16 << 20  # changelog bytes replayed per WriteBatch at open


class Backoff(NamedTuple):
    """How long a failed bucket waits before it is reopened: ``initial_s``, doubled per failure in a row."""

    initial_s: float = 1.0
    max_s: float = 30.0

    def delay(self, failures: int) -> float:
        return min(self.initial_s * 2 ** max(failures - 1, 0), self.max_s)


@dataclass(frozen=True)
class FileSettings:
    """How a bucket's files are opened: ``segment_bytes`` and ``fsync`` of the changelog
    (``log.segment.bytes``, ``log.flush.fsync``), ``clock_ms`` its append times, RocksDB's
    ``memtable_bytes`` and ``key_width`` (see :class:`~kvlease.tablet.store.kvstore.KvStore`)."""

    segment_bytes: int
    fsync: bool = True
    memtable_bytes: int | None = None
    key_width: int | None = None
    clock_ms: Callable[[], int] | None = None

    def now_ms(self) -> int:
        """The bucket's wall clock, ms since the epoch: ``clock_ms`` (a test's), else the system's. Append times,
        writer expiry and row TTL (the write-time stamp, what lookups and writes take as expired) read it."""
        return self.clock_ms() if self.clock_ms is not None else int(time.time() * 1000)


class BucketFiles:
    """The changelog and RocksDB of the bucket in ``dir``; see the module docstring. Thread-safe."""

    def __init__(self, dir: str, settings: FileSettings, *, budget: OpenBuckets | None = None,
                 backoff: Backoff = Backoff(), monotonic: Callable[[], float] = time.monotonic,
                 on_failure: Callable[[], None] | None = None) -> None:
        """``on_failure()`` is called after each failure recorded (maybe under this object's lock:
        it must not block)."""
        self.dir = dir
        self._on_failure = on_failure
        self.settings = settings
        self._budget = budget
        self._backoff = backoff
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self.changelog: Changelog | None = None  # None: not open
        self.kv: KvStore | None = None
        self._users = 0  # operations running on the open files
        self._offsets: tuple[int, int, int] | None = None  # (start, end, applied) while parked
        #: ``(from, to)``: the changelog records replayed into RocksDB at the last open.
        self.replayed = (0, 0)
        #: Why the bucket cannot write (None: it can); cleared by a successful (re)open.
        self.failure: BaseException | None = None
        #: Failures recorded since this object exists (never reset): a failure repaired between two looks is
        #: still seen (``tablet/replicas/step_down.py``).
        self.failure_count = 0
        self._failures = 0  # in a row
        self._reopened_at: float | None = None  # when (monotonic) failed files last opened again
        self._retry_at = 0.0
        self.closed = False
        #: Replay the changelog only up to this offset at open (a replicated bucket's high watermark: what
        #: is above is not committed); None: to its end.
        self.replay_limit: int | None = None
        #: Called with ``(changelog, kv)`` after each open, before any use (under this object's lock).
        self.on_open: Callable[[Changelog, KvStore], None] | None = None

    # --- state -------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.kv is not None

    @property
    def known(self) -> bool:
        """Whether the bucket was opened (so its offsets are known) since this object exists."""
        return self.kv is not None or self._offsets is not None

    def state(self) -> str:
        """``open``, ``parked``, ``new`` (never opened), ``failed`` or ``closed``."""
        if self.closed:
            return "closed"
        if self.failure is not None:
            return "failed"
        return "open" if self.kv is not None else "parked" if self._offsets is not None else "new"

    def retry_in(self) -> float:
        """Seconds until a failed bucket may be reopened (0: now)."""
        return max(0.0, self._retry_at - self._monotonic())

    def held_by_snapshots(self) -> bool:
        """Whether snapshots of the open files are open (live scans): they keep the files open."""
        kv = self.kv
        return kv is not None and kv.open_snapshots() > 0

    def offsets(self) -> tuple[int, int, int]:
        """``(start, end, applied)`` of the changelog and RocksDB; a parked bucket answers from memory."""
        known = self.known_offsets()
        if known is not None:
            return known
        with self.use() as (changelog, kv):
            return changelog.start_offset, changelog.end_offset, kv.applied_offset

    def known_offsets(self) -> tuple[int, int, int] | None:
        """:meth:`offsets` if they are known without opening anything (open, or parked); else None
        (never opened since the server started, failed, or closed)."""
        with self._lock:
            if self.kv is not None:
                return self.changelog.start_offset, self.changelog.end_offset, self.kv.applied_offset
            if self._offsets is not None and self.failure is None and not self.closed:
                return self._offsets
        return None

    # --- use ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def use(self) -> Iterator[tuple[Changelog, KvStore]]:
        """The open ``(changelog, kv)`` for one operation (opened first if needed); they are not
        parked until it ends. Raises BucketStoreError if closed, or if the files cannot open (or
        failed to open and their backoff has not passed); an open's own error the first time."""
        with self._lock:
            self._ready()
            self._users += 1
            files = self.changelog, self.kv
        try:
            yield files
        finally:
            with self._lock:
                self._users -= 1
            if self._budget is not None:
                self._budget.used(self)

    def _ready(self) -> None:
        """Open the files if they are not; reopen failed ones whose backoff passed. Hold the lock."""
        if self.closed:
            raise BucketStoreError(f"bucket {self.dir} is closed", dir=self.dir)
        if self.failure is not None:
            if self._monotonic() < self._retry_at or self._users or self.held_by_snapshots():
                if self.kv is None:
                    raise BucketStoreError(f"bucket {self.dir} cannot be opened ({self.failure}); next attempt "
                                           f"in {self.retry_in():.1f}s", dir=self.dir)
                return  # the failed files still serve reads; a later use reopens them
            if self.kv is not None:
                self._shut(raise_errors=False)
        if self.kv is None:
            self._open()

    def _open(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        s = self.settings
        try:
            snapshot_install.recover(self.dir, s.fsync)  # an install a crash interrupted: finished or undone
            kv_rebase.recover(self.dir, s.fsync)  # a re-base of RocksDB likewise (tablet/store/kv_rebase.py)
            changelog = Changelog(os.path.join(self.dir, "log"), segment_bytes=s.segment_bytes, fsync=s.fsync,
                                  clock_ms=s.clock_ms)
            try:
                kv = KvStore(os.path.join(self.dir, "kv"), memtable_bytes=s.memtable_bytes, key_width=s.key_width)
            except BaseException:
                changelog.close()
                raise
            try:
                self.replayed = replay(self.dir, changelog, kv, self.replay_limit)
                if self.on_open is not None:
                    self.on_open(changelog, kv)
            except BaseException:
                _close(kv, changelog, self.dir, raise_errors=False)
                raise
        except Exception as exc:
            self._record(exc)
            self._tell_failure()
            raise
        self.changelog, self.kv = changelog, kv
        if self.failure is not None:
            log.info("bucket %s reopened after a failure (%s)", self.dir, self.failure)
            self._reopened_at = self._monotonic()
        self.failure = None
        if self._budget is not None:
            self._budget.opened(self)

    # --- failures --------------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """A local write failed: refuse writes until the files are reopened (after the backoff)."""
        with self._lock:
            if self.failure is not None:
                return
            self._record(exc)
        self._tell_failure()

    def _tell_failure(self) -> None:
        if self._on_failure is not None:
            self._on_failure()

    def _record(self, exc: BaseException) -> None:
        now = self._monotonic()
        if self._reopened_at is not None and now - self._reopened_at > self._backoff.max_s:
            self._failures = 0  # it worked for a while since its last reopen: a new row of failures
        self.failure = exc
        self.failure_count += 1
        self._failures += 1
        delay = self._backoff.delay(self._failures)
        self._retry_at = now + delay
        log.warning("bucket %s failed (%s); reopened in %.1fs at the earliest", self.dir, exc, delay)

    def check_writable(self) -> None:
        """BucketStoreError if closed or failed (saying when it is reopened)."""
        if self.closed:
            raise BucketStoreError(f"bucket {self.dir} is closed", dir=self.dir)
        failure = self.failure
        if failure is not None:
            wait = self.retry_in()
            when = f"in {wait:.1f}s" if wait else "as soon as no call uses it"
            raise BucketStoreError(f"bucket {self.dir} failed earlier ({failure!r}); it is reopened {when}",
                                   dir=self.dir)

    def repair(self) -> bool:
        """Open a bucket never opened, or reopen a failed one whose backoff passed (the keeper's
        work); True if it did. An open that fails is recorded (and retried after its backoff)."""
        with self._lock:
            due = (self.failure is not None and not self._users and not self.held_by_snapshots()
                   and self._monotonic() >= self._retry_at)
            fresh = self.failure is None and not self.known
            if self.closed or not (due or fresh):
                return False
        try:
            with self.use():
                return True
        except Exception as exc:  # recorded by _open: the keeper tries again after the backoff
            log.debug("bucket %s did not open: %s", self.dir, exc)
            return False

    def replace(self, swap: Callable[[], None]) -> None:
        """Close the files, run ``swap()`` (which replaces them on disk), and leave them to open again on
        the next use (a failure is cleared). BucketStoreError if closed, or if an operation or a snapshot
        uses the files now (BucketInUseError: try again in a moment); ``swap``'s own error otherwise."""
        with self._lock:
            if self.closed:
                raise BucketStoreError(f"bucket {self.dir} is closed", dir=self.dir)
            if self._users or self.held_by_snapshots():
                raise BucketInUseError(f"bucket {self.dir} is in use: its files cannot be replaced now",
                                       dir=self.dir)
            if self.kv is not None:
                self._shut(raise_errors=True)
            self._offsets = None
            swap()
            self.failure, self._failures = None, 0

    # --- closing ------------------------------------------------------------------------------

    def park(self) -> bool:
        """Close the files if idle (see the module docstring), remembering the offsets; True if closed now."""
        if not self._lock.acquire(blocking=False):
            return False  # opening or closing right now
        try:
            if self.kv is None:
                return True
            if self._users or self.failure is not None or self.kv.open_snapshots():
                return False
            self._offsets = (self.changelog.start_offset, self.changelog.end_offset, self.kv.applied_offset)
            self._shut(raise_errors=False)
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Close for good (open snapshots included; RocksDB is flushed). Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.kv is not None:
                self._shut(raise_errors=True)

    def _shut(self, raise_errors: bool) -> None:
        kv, changelog = self.kv, self.changelog
        self.kv = self.changelog = None
        if self._budget is not None:
            self._budget.closed(self)
        _close(kv, changelog, self.dir, raise_errors)


def _close(kv: KvStore, changelog: Changelog, dir: str, raise_errors: bool) -> None:
    """Close RocksDB (flushing it), then the changelog, also if the first fails."""
    try:
        try:
            kv.close()
        finally:
            changelog.close()
    except Exception as exc:
        if raise_errors:
            raise
        log.warning("bucket %s: closing its files failed (%s); the changelog is replayed at the next open",
                    dir, exc)


def replay(dir: str, changelog: Changelog, kv: KvStore, limit: int | None = None) -> tuple[int, int]:
    """Replay the changelog from RocksDB's applied offset to its end, or to the last entry ending at or
    below ``limit`` (see ``tablet/bucket/store.py``); returns ``(from, to)``. Raises BucketStoreError if the
    applied offset lies outside the changelog."""
    applied = kv.applied_offset
    start, end = changelog.start_offset, changelog.end_offset
    if applied > end:
        raise BucketStoreError(f"bucket {dir}: RocksDB has applied changelog records up to offset "
                               f"{applied} but the changelog ends at {end} (changelog lost records "
                               f"written without fsync?)", dir=dir, applied=applied, end_offset=end)
    if applied < start:
        raise BucketStoreError(f"bucket {dir}: RocksDB has applied records up to offset {applied} "
                               f"but the changelog starts at {start}", dir=dir, applied=applied, start_offset=start)
    offset = applied
    target = end if limit is None else min(end, limit)
    while offset < target:
        entries: list[LogEntry] = [e for e in changelog.read(offset, _REPLAY_BYTES) if e.next_offset <= target]
        if not entries:
            break
        offset = entries[-1].next_offset
        kv.apply_records([e.records for e in entries], offset)
    if offset > applied:
        log.info("bucket %s: replayed changelog records %d..%d into RocksDB", dir, applied, offset)
    return applied, offset
