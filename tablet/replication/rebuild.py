"""Rebuilding a followed bucket from its remote snapshot, when its log cannot (or should not) continue.

A follower is rebuilt (docs/bucket-store.md, "Replication"; docs/architecture.md,
"Losing and moving replicas") when, as the fetcher (``tablet/replication/fetcher.py``) finds:

- **behind**: its fetch offset is below its leader's log start (retention
  removed the head; a stale replica came back) — it can never catch up by
  fetching;
- **fresh**: it has no local data for the bucket (a new replica, a wiped data
  dir) — the latest snapshot plus the tail is cheaper than the whole log;
- **damaged**: its files are damaged beyond repair at open
  (``tablet/bucket/damage.py``) — they are moved aside first;
- **diverged**: its log diverges from its leader's below what it already
  applied to RocksDB (truncating cannot take applied records back).

The :class:`Rebuilder`, on a thread of its own (the other buckets' fetches go
on), downloads the bucket's OLDEST kept snapshot whose ``log_offset`` the
leader's log still reaches, so that the rebuilt replica's changelog reaches
back as far as its leader's (changelog retention keeps every replica's log
back to the lowest kept snapshot: any kept snapshot, leased now or later,
can be read with its changelog from whichever replica leads next)
(``tablet/replication/snapshot_download.py``:
bounded by ``replica.rebuild.max-bytes-per-s``, each file checked, aborted
when the server stops), holding a KV snapshot lease on it meanwhile
(``rebuild-tablet-{server}-...``: the coordinator cannot delete its files
mid-download; asked for on a thread of its own while the first files
download, required before the install; released after a failure, or once
the installed bucket is back with its fetcher), installs it as the
bucket's files (``BucketStore.install_snapshot``: RocksDB := the snapshot,
the changelog empty at its ``log_offset``, the idempotent writers of the
manifest), appends the changelog tail fetched from the leader while the
files downloaded (``tablet/replication/tail_prefetch.py``) and hands the
bucket back: the fetcher fetches from there on, its applier applies the
tail, and the leader adds it to the ISR once caught up. With no snapshot at all (fresh,
damaged or diverged, while the leader's log starts at 0) the replica starts
empty and fetches the whole log.

A snapshot whose files are missing, of the wrong size or checksum, or that do
not open is skipped for the next newer one, with a warning naming it and why.
With none usable the bucket is tried again after :data:`RETRY_S`. Local files
in use when the download is done (a read of the empty replica holds them a
moment) are waited for; if they stay in use the rebuild is tried again later,
from the same snapshot: that says nothing against the snapshot.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from concurrent import futures
from typing import Callable

from kvlease.common import errors
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.storage import RemoteStorage
from kvlease.tablet.replication import snapshot_download
from kvlease.tablet.replication.tail_prefetch import TailPrefetch
from kvlease.tablet.replication.throttle import Throttle
from kvlease.tablet.replication.worker import ReplicaWorker
from kvlease.tablet.store.kvstore import BucketInUseError

log = logging.getLogger(__name__)

DOWNLOAD_DIR = "rebuild-download"  # inside the bucket's directory: the install moves it (same file system)
RETRY_S = 5.0
INSTALL_WAIT_S = 5.0  # an install waits this long for the replica's files to be free (then tried again later)
INSTALL_RETRY_S = 0.05
LISTING_S = 1.0  # a table's kept snapshots are listed again after this long
LEASE_MS = 600_000  # the download's snapshot lease; renewed when half of it passed
TAIL_MAX_BYTES = 256 << 20  # the changelog tail fetched during a download, at most (the fetcher gets the rest)

# why a replica is rebuilt (the module docstring)
BEHIND, FRESH, DAMAGED, DIVERGED = "behind", "fresh", "damaged", "diverged"


def lease_id(server_id: int, tb: TableBucket) -> str:
    """The lease a rebuild on tablet server ``server_id`` holds on the snapshot of ``tb`` it downloads."""
    part = "" if tb.partition_id is None else f"-p{tb.partition_id}"
    return f"rebuild-tablet-{server_id}-t{tb.table_id}{part}-b{tb.bucket}"


class Rebuilder(ReplicaWorker):
    """Rebuilds followed buckets one at a time on a thread of its own (see the module docstring)."""

    name = "replica-rebuild"

    def __init__(self, storage: RemoteStorage, admin, stop: threading.Event, *, server_id: int = 0,
                 max_bytes_per_s: int = 0, io_threads: int = 8, monotonic=time.monotonic, channels=None,
                 tail_fetch_bytes: int = 4 << 20) -> None:
        """``admin``: a ``client.admin.AdminClient`` (``list_kv_snapshots``, the lease calls);
        ``max_bytes_per_s``: ``replica.rebuild.max-bytes-per-s`` (0: unlimited); ``channels``: the
        fetchers' (``client.transport.Channels``), to fetch the changelog tail while the snapshot downloads
        (``tablet/replication/tail_prefetch.py``, ``tail_fetch_bytes`` a call; None: the fetcher fetches it
        after the install)."""
        super().__init__(stop)
        self.storage = storage
        self.admin = admin
        self.server_id = server_id
        self.io_threads = io_threads
        self.channels = channels
        self.tail_fetch_bytes = tail_fetch_bytes
        self._held: list[_Lease] = []  # leases of installed snapshots, released once the bucket is handed back
        self.throttle = Throttle(max_bytes_per_s, stop)
        self._monotonic = monotonic
        self._busy: set[int] = set()  # queued or being rebuilt: not fetched meanwhile
        #: Run after each rebuild attempt (the fetchers wake: the bucket is fetched again at once).
        self.on_done: Callable[[], None] = lambda: None
        #: Run with (replica, high watermark) once a prefetched tail is appended (the fetchers' applier applies
        #: it to RocksDB: the entries are committed, the leader said so when it served them).
        self.on_tail: Callable[[object, int], None] = lambda replica, hw: None
        #: Buckets rebuilt since the start, and the snapshot bytes downloaded (progress, metrics).
        self.rebuilt = 0
        self.bytes_downloaded = 0
        self.tail_records = 0  # changelog records appended from the tails fetched during the downloads
        self._count_lock = threading.Lock()
        self._listings: dict[int, tuple[float, list]] = {}  # table id -> (when, its kept snapshots)

    @property
    def in_progress(self) -> int:
        """Buckets waiting for or in a rebuild now."""
        with self._cond:
            return len(self._busy)

    def _dropped(self, replicas: list) -> None:
        """A rebuild queued and not begun when the fetchers stopped is not due any more: not busy, so the
        fetcher, resumed, finds the replica still to rebuild and queues it again (else it waited forever)."""
        for replica in replicas:
            self._busy.discard(id(replica))

    def busy(self, replica) -> bool:
        """Whether ``replica`` waits for or is in a rebuild (its fetches wait)."""
        with self._cond:
            return id(replica) in self._busy

    def due(self, replica, log_start: int, why: str = BEHIND) -> None:
        """Rebuild ``replica`` for the reason ``why`` (module docstring); its leader's log starts at
        ``log_start`` (0 if not known)."""
        with self._cond:
            if id(replica) in self._busy:
                return
            self._busy.add(id(replica))
        if not self._queue(replica, (log_start, why)):
            with self._cond:
                self._busy.discard(id(replica))

    def _run(self) -> None:
        while (work := self._take(one=True)) is not None:
            (replica, (log_start, why)), = work
            done = False
            try:
                done = self.rebuild(replica, log_start, why) is not None or replica.closed or replica.leads
            except Exception:  # the coordinator cannot list the snapshots now, ...: try again later
                log.exception("rebuilding %s failed", replica.tb)
            if done:
                replica.fresh = False
            else:
                self._stop.wait(RETRY_S)
            with self._cond:
                self._busy.discard(id(replica))  # the fetcher asks again: a bucket still behind comes back here
            self.on_done()
            self.release_held()  # a coordinator call: after the fetcher has the bucket back, not before

    def rebuild(self, replica, log_start: int, why: str = BEHIND) -> int | None:
        """Install the oldest usable snapshot of ``replica``'s bucket whose ``log_offset`` is at least
        ``log_start``; returns the offset its log continues from, None if nothing was done (no usable
        snapshot, the replica stopped following, the server stops). Raises the coordinator's error if the
        snapshots cannot be listed."""
        handles = sorted((info.handle for info in self._kept(replica.table.table_id, refresh=why == BEHIND)
                          if info.handle.bucket == replica.tb and info.handle.log_offset >= log_start),
                         key=lambda h: h.snapshot_id)  # oldest first: the module docstring says why
        if why == DAMAGED:
            with replica.fetch_lock:
                replica.store.discard_files(f"damaged: {replica.store.files.failure}")
        for handle in handles:
            if replica.closed or replica.leads or self._stop.is_set():
                return None
            try:
                return self._install(replica, handle, why)
            except BucketInUseError as exc:  # the local files, not the snapshot: the same snapshot, later
                log.info("%s: its files are in use: the rebuild from snapshot %d is tried again in %.0fs (%s)",
                         replica.tb, handle.snapshot_id, RETRY_S, exc)
                return None
            except snapshot_download.Aborted:
                log.info("%s: the rebuild from snapshot %d stopped: the server stops", replica.tb, handle.snapshot_id)
                return None
            except (errors.KvLeaseError, OSError) as exc:
                log.warning("%s: snapshot %d (log offset %d) cannot be used to rebuild it, trying a newer "
                            "one: %s", replica.tb, handle.snapshot_id, handle.log_offset, exc)
        if why != BEHIND and log_start == 0:  # the leader's whole log is there
            if why == DIVERGED:
                with replica.fetch_lock:
                    replica.store.discard_files("diverged from its leader below its applied offset")
            log.info("%s (%s): no usable snapshot; fetching its leader's log from offset 0", replica.tb, why)
            return 0
        if not handles:
            log.error("%s cannot be rebuilt: its leader's log starts at offset %d and no kept snapshot reaches "
                      "that far; trying again in %.0fs", replica.tb, log_start, RETRY_S)
        else:
            log.error("%s cannot be rebuilt: none of its snapshots %s is usable; trying again in %.0fs",
                      replica.tb, [h.snapshot_id for h in handles], RETRY_S)
        return None

    def _kept(self, table_id: int, refresh: bool) -> list:
        """The table's kept snapshots; asked of the coordinator, or (not ``refresh``) from a listing at most
        :data:`LISTING_S` old: the new replicas of a new table of many buckets need one listing, not one each."""
        now = self._monotonic()
        cached = self._listings.get(table_id)
        if refresh or cached is None or now - cached[0] > LISTING_S:
            cached = self._listings[table_id] = (now, self.admin.list_kv_snapshots(table_id))
        return cached[1]

    def _install(self, replica, handle: SnapshotHandle, why: str) -> int | None:
        """Download ``handle`` (its lease acquired and its changelog tail fetched meanwhile), install it,
        append the tail; the offset the replica's log continues from, None if not installed."""
        store = replica.store
        target = os.path.join(store.dir, DOWNLOAD_DIR)
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        lease = _Lease(self.admin, lease_id(self.server_id, handle.bucket), handle, self._monotonic)
        # the lease is asked for while the files download: a file the coordinator deletes before it is held fails
        # its download or its check (the snapshot is skipped, as when the lease says it is gone)
        acquiring = _on_a_thread(lease.acquire, "rebuild-lease")
        tail = self._prefetch(replica, handle)
        installed = False
        try:
            manifest = snapshot_download.download(
                self.storage, handle, target, throttle=self.throttle, stop=self._stop,
                on_file=lambda n: (self._count(n), lease.renew_if_due()), io_threads=self.io_threads,
                durable=store.files.settings.fsync)
            acquiring.result()
            size = sum(f.size for f in manifest.files)
            installed = self._install_when_free(replica, target, manifest, synced=store.files.settings.fsync)
        finally:
            entries, hw = tail.finish() if tail is not None else ([], 0)
            shutil.rmtree(target, ignore_errors=True)
            futures.wait([acquiring])
            if installed:
                self._held.append(lease)
            else:
                lease.release()
        if not installed:
            return None
        end = self._append_tail(replica, manifest.log_offset, entries)
        with self._count_lock:  # counted before the tail can be applied: rebuilt, then caught up
            self.rebuilt += 1
            self.tail_records += end - manifest.log_offset
        if end > manifest.log_offset:
            self.on_tail(replica, min(hw, end))
        log.info("%s (%s) rebuilt from snapshot %d: %d bytes in %.1fs; its log continues from offset %d "
                 "(%d tail records fetched during the download)", replica.tb, why, handle.snapshot_id, size,
                 time.monotonic() - started, end, end - manifest.log_offset)
        return manifest.log_offset

    def _prefetch(self, replica, handle: SnapshotHandle) -> TailPrefetch | None:
        """The tail fetch of ``replica`` from ``handle``'s offset, started; None without channels or leader."""
        address = replica.role.leader_address if getattr(replica, "role", None) is not None else ""
        if self.channels is None or not address:
            return None
        return TailPrefetch(self.channels, address, replica.table.table_id, replica.tb.bucket,
                            replica.table.partition_id, handle.log_offset, max_bytes=self.tail_fetch_bytes,
                            max_total_bytes=TAIL_MAX_BYTES, stop=self._stop).start()

    def _append_tail(self, replica, log_offset: int, entries: list[bytes]) -> int:
        """Append the prefetched ``entries`` (from ``log_offset`` on) to the installed replica as its
        fetcher appends (checked, fsynced; RocksDB gets them when the fetcher next learns the high
        watermark); its log end. A failure is logged: the fetcher fetches them then."""
        if not entries:
            return log_offset
        with replica.fetch_lock:
            if replica.closed or replica.leads:
                return log_offset
            try:
                return replica.store.append_replicated(entries)
            except Exception as exc:  # noqa: BLE001 - the fetcher fetches the tail itself
                log.warning("%s: the changelog tail fetched during the download was not appended (the fetcher "
                            "fetches it): %s", replica.tb, exc)
                return log_offset

    def release_held(self) -> None:
        """Release the leases of the snapshots installed (the worker thread, once the buckets are back
        with their fetchers)."""
        while self._held:
            lease = self._held.pop()
            try:
                lease.release()
            except Exception:  # noqa: BLE001 - not this thread's end: the lease expires by itself
                log.exception("releasing the rebuild's lease %s failed", lease.id)

    def _install_when_free(self, replica, target: str, manifest, synced: bool = False) -> bool:
        """Install the downloaded checkpoint ``target`` as ``replica``'s files, waiting up to
        :data:`INSTALL_WAIT_S` while they are in use (a lookup or a metrics read of the empty replica holds
        them a moment); False if the replica stopped following or the server stops meanwhile. Raises
        BucketInUseError if they stay in use: the rebuild is tried again later, from the same oldest snapshot
        (skipping to a newer one would make the replica's changelog start later than its leader's)."""
        deadline = self._monotonic() + INSTALL_WAIT_S
        while True:
            with replica.fetch_lock:
                if replica.closed or replica.leads:
                    return False
                try:
                    replica.store.install_snapshot(target, manifest.log_offset, manifest.writers, synced=synced)
                    return True
                except BucketInUseError:
                    if self._monotonic() >= deadline:
                        raise
            if self._stop.wait(INSTALL_RETRY_S):
                return False

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.bytes_downloaded += n


class _Lease:
    """The KV snapshot lease a rebuild holds on the snapshot it downloads (docs/architecture.md, "Leases")."""

    def __init__(self, admin, lease_id: str, handle: SnapshotHandle, monotonic) -> None:
        self.admin, self.id, self.handle, self._monotonic = admin, lease_id, handle, monotonic
        self._at: float | None = None  # when acquired or renewed last (None: not held)
        self._lock = threading.Lock()

    def acquire(self) -> None:
        """InvalidSnapshotError if the snapshot is gone already (a newer one is tried then)."""
        result = self.admin.acquire_lease(self.id, {self.handle.bucket: self.handle.snapshot_id}, LEASE_MS)
        self._at = self._monotonic()
        if self.handle.bucket in result.unavailable:
            raise errors.InvalidSnapshotError(f"snapshot {self.handle.snapshot_id} of {self.handle.bucket} is "
                                              f"no longer kept")

    def renew_if_due(self) -> None:
        with self._lock:
            if self._at is None or self._monotonic() - self._at < LEASE_MS / 2000.0:
                return
            self.admin.renew_lease(self.id, LEASE_MS)
            self._at = self._monotonic()

    def release(self) -> None:
        """Idempotent; a failure is logged (the lease expires by itself after :data:`LEASE_MS`)."""
        if self._at is None:
            return
        try:
            self.admin.release_lease(self.id, [self.handle.bucket])
            self._at = None
        except errors.KvLeaseError as exc:
            log.warning("could not release the rebuild's lease %s (it expires in %ds): %s", self.id,
                        LEASE_MS // 1000, exc)


def _on_a_thread(fn: Callable[[], object], name: str) -> futures.Future:
    """``fn()`` started on a thread of its own (named ``name``): its future."""
    pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(fn)
    finally:
        pool.shutdown(wait=False)  # the thread ends with fn
