"""Orphan snapshot files on remote storage: listed off the event loop, judged on it, deleted after a grace.

An *orphan* is a file under ``kv/{table_id}/`` that no stored snapshot names
(kept, or taken out of the kept list but still leased): the upload of a
snapshot whose commit was refused, lost or never sent (a crash, a deposed
leader that could not delete its own), SSTs a tablet server uploaded and then
lost track of (a restart), the leftovers of a dropped table whose delete failed
or was cut short. The active coordinator deletes a file once it is an orphan
*and* older than ``kv.snapshot.orphan-grace`` by the storage's own modification
time. An upload in flight is younger than that, so nothing is deleted under its
uploader; a tablet server reuses its own uncommitted uploads for half the grace
only (``tablet/store/snapshot.py``).

A run every ``kv.snapshot.orphan-check-interval`` (the first one a tenth of an
interval after the coordinator became active, so one that fails over often
still runs it), driven by the event loop's timer (:meth:`OrphanFiles.tick`,
which never waits on remote storage):

1. a worker thread lists the table directories under ``kv/`` (``list_dirs``:
   one shallow listing) and then each table's files with their size and age
   (``list_stats``: one listing per table, so at most one per bucket), and hands
   them over through a bounded buffer;
2. at each tick the loop judges what arrived against the snapshot store *as it
   is then* (:meth:`OrphanFiles._judge`): a commit the loop took before names
   its files, so they are kept; a commit it takes after finds its deleted files
   remembered (:meth:`OrphanFiles.deleted`) and is refused naming the file
   (``coordinator/snapshot_checks.py`` ``check_not_reclaimed``; a commit checked
   after the delete finds the file missing anyway). A live table's files are
   judged file by file; a dropped table's (an id the catalog gave out and no
   longer has) all go once old enough; a directory that is no table id of this
   cluster is left alone;
3. a second worker deletes them (``delete_many``) and counts them
   (``kvlease_coordinator_orphan_files_deleted_total``, ``..._bytes_total``, a
   log line per run).

Failover: nothing here is persisted and no run depends on an earlier one. A
new active coordinator loads the stored snapshots from ZooKeeper, lists again
and deletes what is still an orphan (deletes are idempotent). One that steps
down stops its workers: a listing under way is dropped and deletes not yet sent
are not sent.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.storage import RemoteStorage
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.snapshots import IsLeased, SnapshotStore

log = logging.getLogger(__name__)

KV_ROOT = "kv"
MAX_BUFFERED_FILES = 200_000  # listed files waiting for the loop: the worker waits beyond this
MAX_JUDGED_PER_TICK = 50_000  # files the loop judges per tick (the rest wait for the next)
DELETE_CHUNK = 1000  # paths per delete_many call (S3: one DeleteObjects request)
_SNAP_DIR = re.compile(r"^kv/(?P<table>\d+)/(?:p(?P<part>\d+)/)?(?P<bucket>\d+)/snap-(?P<sid>\d+)/")

#: a table's listing: ``{path: (size, modified ms)}``
Listing = dict[str, tuple[int, int]]


def orphan_timing(config: cfg.Config) -> tuple[int, int]:
    """(``kv.snapshot.orphan-grace``, ``kv.snapshot.orphan-check-interval``) in ms; a grace below two snapshot
    intervals is warned about (an upload takes longer than that now and then: its files would go under it)."""
    grace, interval = config[cfg.SNAPSHOT_ORPHAN_GRACE], config[cfg.SNAPSHOT_INTERVAL]
    if grace < 2 * interval:
        log.warning("kv.snapshot.orphan-grace (%d ms) is below two kv.snapshot.interval (%d ms): the orphan reclaim "
                    "may delete the files of an upload still under way (its commit is then refused)", grace, interval)
    return grace, config[cfg.SNAPSHOT_ORPHAN_CHECK_INTERVAL]


@dataclass
class _Run:
    """One run's progress and figures (the loop's thread owns it)."""
    started_ms: int
    listed_all: bool = False
    failed: str = ""
    tables: int = 0
    files: int = 0
    young: int = 0
    dropped_tables: list[int] = field(default_factory=list)
    doomed: int = 0
    deletes: list[Future] = field(default_factory=list)


class _Buffer:
    """Listings from the lister to the loop, bounded by the files they hold (one listing always fits)."""

    def __init__(self, closed: threading.Event) -> None:
        self._items: deque[tuple[int, Listing] | BaseException | None] = deque()
        self._files = 0
        self._cv = threading.Condition()
        self._closed = closed

    def put(self, item: tuple[int, Listing] | BaseException | None) -> None:
        """Waits while the buffer is full; gives up (drops the item) once the reclaim is closed."""
        size = len(item[1]) if isinstance(item, tuple) else 0
        with self._cv:
            while self._files and self._files + size > MAX_BUFFERED_FILES and not self._closed.is_set():
                self._cv.wait(0.5)
            if self._closed.is_set():
                return
            self._items.append(item)
            self._files += size

    def take(self, limit: int) -> list[tuple[int, Listing] | BaseException | None]:
        """What arrived, listings of up to ``limit`` files (at least one), without waiting."""
        taken = []
        with self._cv:
            count = 0
            while self._items and (not taken or count < limit):
                item = self._items.popleft()
                size = len(item[1]) if isinstance(item, tuple) else 0
                self._files -= size
                count += size
                taken.append(item)
            self._cv.notify_all()
        return taken

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()


class OrphanFiles:
    """The reclaim of one active coordinator's term; :meth:`tick` on the loop, :meth:`close` at step-down."""

    def __init__(self, storage: RemoteStorage, *, grace_ms: int, interval_ms: int, clock_ms: Callable[[], int],
                 catalog: Callable[[], TableCatalog], snapshots: Callable[[], SnapshotStore],
                 is_protected: IsLeased, metrics=None) -> None:
        if grace_ms <= 0 or interval_ms <= 0:
            raise ValueError("kv.snapshot.orphan-grace and kv.snapshot.orphan-check-interval must be above zero")
        self.storage = storage
        self.grace_ms = grace_ms
        self.interval_ms = interval_ms
        self.clock_ms = clock_ms
        self.catalog = catalog
        self.snapshots = snapshots
        self.is_protected = is_protected
        self.metrics = metrics
        self.next_run_ms = clock_ms() + max(1, interval_ms // 10)
        self.runs_started = 0
        self.runs_done = 0
        self.last_run: dict = {}  # the figures of the last run done (also logged)
        self._run: _Run | None = None
        self._deleted: Counter[str] = Counter()  # paths a commit naming them is refused (each run's: _expiry)
        self._expiry: deque[tuple[int, list[str]]] = deque()  # (until when, paths), oldest first
        self._closed = threading.Event()
        self._buffer = _Buffer(self._closed)
        self._lister = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orphan-list")
        self._deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orphan-delete")

    # -- on the loop --------------------------------------------------------------------------

    def tick(self) -> None:
        """Start a run when one is due; judge the listings that arrived; end the run once all is done."""
        now = self.clock_ms()
        while self._expiry and self._expiry[0][0] <= now:
            self._deleted.subtract(self._expiry.popleft()[1])
            self._deleted = +self._deleted  # the paths no run remembers any more leave
        run = self._run
        if run is None:
            if now >= self.next_run_ms and not self._closed.is_set():
                self._start(now)
            return
        for item in self._buffer.take(MAX_JUDGED_PER_TICK):
            if item is None:
                run.listed_all = True
            elif isinstance(item, BaseException):
                run.failed = str(getattr(item, "message", item))
                run.listed_all = True
            else:
                self._judge(run, *item, now)
        if run.listed_all and all(f.done() for f in run.deletes):
            self._finish(run, now)

    def deleted(self, path: str) -> bool:
        """Whether a run of this term deleted ``path`` (or is deleting it) within the last grace: a commit
        naming it is refused."""
        return self._deleted[path] > 0

    def _start(self, now: int) -> None:
        self._run = _Run(now)
        self.runs_started += 1
        self._lister.submit(self._list_all)

    def _judge(self, run: _Run, table_id: int, listing: Listing, now: int) -> None:
        catalog = self.catalog()
        live = table_id in catalog.by_id
        if not live and table_id > catalog.last_id:
            log.warning("orphan files: %s/%d is no table of this cluster (the last table id is %d): left alone",
                        KV_ROOT, table_id, catalog.last_id)
            return
        store = self.snapshots()
        cutoff = now - self.grace_ms
        run.tables += 1
        run.files += len(listing)
        doomed: list[tuple[str, int]] = []
        for path, (size, modified_ms) in listing.items():
            if modified_ms > cutoff:
                run.young += 1
            elif store.file_refcount(path) == 0 and not (live and self._protected(path)):
                doomed.append((path, size))
        if not live and listing:
            run.dropped_tables.append(table_id)
        if not doomed:
            return
        paths = [path for path, _size in doomed]
        self._deleted.update(paths)  # a path doomed again (its delete failed) is remembered until the later
        self._expiry.append((now + self.grace_ms, paths))
        run.doomed += len(doomed)
        reason = "orphan" if live else "dropped_table"
        for start in range(0, len(doomed), DELETE_CHUNK):
            run.deletes.append(self._deleter.submit(self._delete, doomed[start:start + DELETE_CHUNK], reason))

    def _protected(self, path: str) -> bool:
        """A file in the directory of a snapshot a lease names (it is stored, and its files are counted,
        unless a lease outlived it: then it is kept for the lease's reader all the same)."""
        match = _SNAP_DIR.match(path)
        if match is None:
            return False
        part = match["part"]
        tb = TableBucket(int(match["table"]), int(match["bucket"]), None if part is None else int(part))
        return self.is_protected(tb, int(match["sid"]))

    def _finish(self, run: _Run, now: int) -> None:
        deleted = sum(f.result()[0] for f in run.deletes if not f.cancelled() and f.exception() is None)
        freed = sum(f.result()[1] for f in run.deletes if not f.cancelled() and f.exception() is None)
        self.last_run = {"tables": run.tables, "files": run.files, "young": run.young, "deleted": deleted,
                         "deleted_bytes": freed, "not_deleted": run.doomed - deleted,
                         "dropped_tables": run.dropped_tables, "took_ms": now - run.started_ms}
        if run.failed:
            self.last_run["failed"] = run.failed
        (log.warning if run.failed or run.doomed > deleted else log.info)("orphan files: %s", self.last_run)
        self._run = None
        self.runs_done += 1
        self.next_run_ms = now + self.interval_ms

    # -- on the workers ---------------------------------------------------------------------------

    def _list_all(self) -> None:
        """Every table directory's files, one listing each, into the buffer; then None (or the error)."""
        try:
            names = self.storage.list_dirs(KV_ROOT)
        except errors.StorageError as exc:
            self._buffer.put(exc)
            return
        for name in names:
            if self._closed.is_set():
                return
            if not name.isdigit():
                log.warning("orphan files: %s/%s is no table directory: left alone", KV_ROOT, name)
                continue
            try:
                self._buffer.put((int(name), self.storage.list_stats(f"{KV_ROOT}/{name}")))
            except errors.StorageError as exc:  # that table waits for the next run
                log.warning("orphan files: cannot list %s/%s: %s", KV_ROOT, name, exc)
        self._buffer.put(None)

    def _delete(self, doomed: list[tuple[str, int]], reason: str) -> tuple[int, int]:
        """Delete one chunk unless the reclaim was closed meanwhile; (files, bytes) deleted."""
        if self._closed.is_set():
            return 0, 0
        try:
            self.storage.delete_many([path for path, _size in doomed])
        except errors.StorageError as exc:  # still orphans: the next run finds them again
            log.warning("orphan files: could not delete %d files (e.g. %s): %s", len(doomed), doomed[0][0], exc)
            return 0, 0
        freed = sum(size for _path, size in doomed)
        if self.metrics is not None:
            self.metrics.orphan_files_deleted.labels(reason).inc(len(doomed))
            self.metrics.orphan_bytes_deleted.labels(reason).inc(freed)
        return len(doomed), freed

    # -- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """The coordinator steps down: stop listing, send no more deletes (one under way finishes)."""
        self._closed.set()
        self._buffer.wake()
        self._lister.shutdown(wait=False, cancel_futures=True)
        self._deleter.shutdown(wait=False, cancel_futures=True)

    def settle(self, timeout_s: float) -> None:
        """Wait until the run under way (if any) has listed and deleted everything, calling :meth:`tick`
        (tests: on a controller no loop drives)."""
        deadline = time.monotonic() + timeout_s
        while self._run is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the orphan reclaim did not finish within {timeout_s}s")
            self.tick()
            time.sleep(0.01)
