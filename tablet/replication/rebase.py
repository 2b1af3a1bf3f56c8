"""Followers re-base their RocksDB on the latest remote snapshot, so a failover keeps snapshots incremental.

A leader's snapshot uploads only the SST files the latest committed snapshot
does not have, the files being known by (local name, size, CRC-32 of the last
64 KiB) (``tablet/store/snapshot.py``). A follower's RocksDB is its own: it
applied the same records but flushed and compacted them into other files. So
without this, the first snapshot of a follower that becomes leader uploads the
whole bucket again (docs/snapshots.md, "Incremental after a failover").

A leader tells its followers the id of the bucket's latest snapshot it
committed or learned in every fetch answer (``ReplicaFetchBucketResultPb.latest_snapshot_id``,
field 40; :meth:`Rebaser.note`). The :class:`Rebaser` (one thread per tablet
server, owned by the fetchers) looks every ``replica.rebase.interval``, or
every :data:`POLL_S` if that is shorter, at the buckets the server follows
(memory only: no coordinator call). A follower whose RocksDB lacks one of
that snapshot's SST files (its manifest read from remote storage, once) is
re-based on it, at most about once per interval (its last re-base at least
the interval minus the poll period ago):

1. into ``{bucket dir}/rebase-download``: each SST of the snapshot the live
   RocksDB holds too (same name, size and tail CRC) is hard-linked (SSTs never
   change), every other file downloaded (``replica.rebuild.max-bytes-per-s``
   bounds it, a separate budget from the rebuilds'), checked against the
   manifest (size, CRC-32), fsynced. SSTs downloaded by an attempt that
   failed stay there for the next one (a newer snapshot shares most);
2. under the replica's fetch lock (its fetches and applies wait; the other
   buckets go on): ``BucketStore.rebase_kv`` swaps RocksDB for it crash-safely
   (``tablet/store/kv_rebase.py``) and reopens the files, which replays the
   changelog from the snapshot's ``log_offset`` up to the high watermark. The
   log, the high watermark, the epochs and the writers are not touched.

It needs the changelog from the snapshot's ``log_offset`` on (changelog
retention keeps it back to the oldest kept snapshot on every replica) and a
RocksDB that applied at least that far (else: the next round). A failure
leaves the old RocksDB (tried again an interval later); a crash is finished or
undone when the bucket opens. The snapshot is not leased (a lease would show in
every lease listing, and keep snapshots past ``kv.snapshot.num-retained``): a
file the coordinator deleted meanwhile (two newer snapshots came) fails the
attempt, and the next one takes the newest, keeping what was downloaded.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kvlease.common import errors, kvsnapshot
from kvlease.common.fsync import fsync_path
from kvlease.common.kvsnapshot import Manifest, ManifestFile
from kvlease.common.storage import RemoteStorage
from kvlease.tablet.replication.throttle import Throttle
from kvlease.tablet.store.kvstore import BucketInUseError
from kvlease.tablet.store.snapshot import FileKey, fingerprint, parse_shared

log = logging.getLogger(__name__)

STAGE_DIR = "rebase-download"  # inside the bucket's directory: the swap moves it (same file system)
SWAP_WAIT_S = 5.0  # the swap waits this long for the bucket's files to be free (else: the next round)
SWAP_RETRY_S = 0.05
MANIFESTS_CACHED = 1024
POLL_S = 5.0  # the followed buckets are looked at at least this often (a re-base soon after each commit)


class Stopped(errors.KvLeaseError):
    """The re-base stopped: the server stops, or the replica leads or closed meanwhile."""


@dataclass(frozen=True)
class RebaseStats:
    """One re-base: the snapshot, its bytes, those downloaded and those hard-linked from the live RocksDB,
    seconds spent staging (links and downloads) and swapping (reopen and changelog replay, fetches held)."""

    snapshot_id: int
    log_offset: int
    bytes: int
    downloaded_bytes: int
    linked_bytes: int
    stage_s: float
    swap_s: float


@dataclass
class RebaseTotals:
    """Since the server started (metrics: ``kvlease_tablet_rebase*``)."""

    rebases: int = 0
    downloaded_bytes: int = 0
    linked_bytes: int = 0
    seconds: float = 0.0


def of_this_history(replica, snapshot_id: int) -> bool:
    """Whether snapshot ``snapshot_id`` was committed after the bucket's latest data loss (an unclean election,
    a restore: docs/replication.md, "Lost data"), so its records below its ``log_offset`` are the ones this replica
    applied (without a loss every committed snapshot is of the one committed history). One committed
    before it may hold history the loss gave up: never a base (the replica is rebuilt or restored anyway)."""
    loss = replica.role.latest_loss if replica.role is not None else None
    return loss is None or snapshot_id >= loss.next_snapshot_id


def local_ssts(kv_dir: str, wanted: dict[tuple[str, int], int]) -> dict[FileKey, str]:
    """The SST files of ``kv_dir`` whose (name, size) is in ``wanted`` (-> the CRC-32 of its tail) and whose
    tail matches: key -> path. Only those are read (64 KiB each); a file gone meanwhile is skipped."""
    found: dict[FileKey, str] = {}
    try:
        entries = list(os.scandir(kv_dir))
    except FileNotFoundError:
        return found
    for entry in entries:
        if not entry.name.endswith(".sst"):
            continue
        try:
            size = entry.stat().st_size
            crc = wanted.get((entry.name, size))
            if crc is not None and fingerprint(entry.path, size) == crc:
                found[(entry.name, size, crc)] = entry.path
        except FileNotFoundError:  # compacted away meanwhile
            continue
    return found


def keep_staged(stage: str, shared: dict[FileKey, ManifestFile]) -> set[str]:
    """Prepare ``stage`` for a re-base on the snapshot of ``shared`` (its SSTs by key): the SSTs an earlier
    attempt left there that are this snapshot's (by key) stay, everything else goes; their names."""
    os.makedirs(stage, exist_ok=True)
    keep = set(local_ssts(stage, {(k[0], k[1]): k[2] for k in shared}).values())
    for entry in os.scandir(stage):
        if entry.path not in keep:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    return {os.path.basename(path) for path in keep}


def shared_keys(manifest: Manifest) -> dict[FileKey, ManifestFile]:
    """The manifest's SST files by key (its other files are private: always downloaded)."""
    keys = {}
    for f in manifest.files:
        key = parse_shared(f.path)
        if key is not None and key[0] == f.local_name and key[1] == f.size:
            keys[key] = f
    return keys


class Rebaser:
    """Re-bases followed buckets on their latest remote snapshot (module docstring), on a thread of its own."""

    def __init__(self, storage: RemoteStorage, following: Callable[[], list], stop: threading.Event, *,
                 interval_ms: int, max_bytes_per_s: int = 0, io_threads: int = 8,
                 rebuilding: Callable[[object], bool] = lambda replica: False,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``following()``: the replicas this server follows now; ``interval_ms``: ``replica.rebase.interval``
        (0: never: :meth:`start` starts nothing); ``rebuilding(replica)``: whether a rebuild waits for or
        works on it (the rebuilder's ``busy``: it is left alone meanwhile)."""
        self.storage = storage
        self.following = following
        self.interval_s = interval_ms / 1000.0
        self.poll_s = min(self.interval_s, POLL_S)  # new snapshots are looked for this often
        self.io_threads = io_threads
        self._stop = stop
        self.throttle = Throttle(max_bytes_per_s, stop)
        self._monotonic = monotonic
        self._rebuilding = rebuilding
        self._noted: dict[int, int] = {}  # id(replica) -> its leader's latest snapshot id (fetch answers)
        self._based: dict[int, int] = {}  # id(replica) -> the snapshot id its RocksDB holds every SST of
        self._last: dict[int, float] = {}  # id(replica) -> when (monotonic) it was last re-based
        self._busy: set[int] = set()
        self._manifests: dict[str, Manifest] = {}
        self._lock = threading.Lock()
        self.totals = RebaseTotals()
        self.last: RebaseStats | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "Rebaser":
        """Start the thread unless it runs or the owner stopped (a leadership change may call this while the
        owner stops: :meth:`join` then sees either no thread or a started one, never one not yet started)."""
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            if self.interval_s > 0 and not self._stop.is_set() and not running:
                thread = threading.Thread(target=self._run, name="replica-rebase", daemon=True)
                thread.start()
                self._thread = thread
        return self

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for the thread to end (the owner sets the stop event first)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=timeout_s)

    def note(self, replica, snapshot_id: int) -> None:
        """``replica``'s leader says the bucket's latest snapshot is ``snapshot_id`` (its fetch answer)."""
        self._noted[id(replica)] = snapshot_id

    def based_on(self, replica) -> int | None:
        """The id of the latest snapshot seen whose every SST ``replica``'s RocksDB holds (None: none yet)."""
        return self._based.get(id(replica))

    def busy(self, replica) -> bool:
        """Whether ``replica`` is being re-based now (the fetcher skips it meanwhile)."""
        with self._lock:
            return id(replica) in self._busy

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.round()
            except Exception:  # a bug: logged, the next round goes on
                log.exception("a re-base round failed")

    def round(self) -> list[RebaseStats]:
        """Look at every followed bucket once (the snapshot its leader named last); the re-bases done."""
        followed = self.following()
        held = {id(replica) for replica in followed}  # a replica closed or led now is forgotten (ids are reused)
        for memo in (self._noted, self._based, self._last):
            for key in [k for k in list(memo) if k not in held]:  # (a copy: fetch threads note meanwhile)
                memo.pop(key, None)
        done = []
        for replica in followed:
            snapshot_id = self._noted.get(id(replica), 0)
            if (not snapshot_id or self._stop.is_set() or not replica.replicated or replica.leads or replica.closed
                    or replica.fresh or self._rebuilding(replica)):
                continue
            try:
                stats = self.consider(replica, snapshot_id)
            except Stopped as exc:  # it leads now, or the server stops: nothing went wrong
                log.info("%s", exc.message)
                continue
            except (errors.KvLeaseError, OSError) as exc:
                log.warning("%s: re-base on snapshot %d failed (tried again in %.0fs): %s", replica.tb, snapshot_id,
                            self.interval_s, exc)
                continue
            if stats is not None:
                done.append(stats)
        return done

    def consider(self, replica, snapshot_id: int, force: bool = False) -> RebaseStats | None:
        """Re-base ``replica`` on its bucket's snapshot ``snapshot_id`` (committed) if its RocksDB lacks one of
        its SST files and the interval since its last re-base passed (``force``: whatever the interval); None if
        not done."""
        key = id(replica)
        if key not in self._last:  # first look since the start: a crashed re-base's download goes
            self._last[key] = -float("inf")
            shutil.rmtree(os.path.join(replica.store.dir, STAGE_DIR), ignore_errors=True)
        if self._based.get(key) == snapshot_id or not of_this_history(replica, snapshot_id):
            return None
        if not force and self._monotonic() - self._last[key] < self.interval_s - self.poll_s:
            return None
        manifest = self._manifest(kvsnapshot.manifest_path(replica.tb, snapshot_id))
        offsets = replica.store.files.known_offsets()  # (in memory: checked before any file is read)
        if offsets is None or not offsets[0] <= manifest.log_offset <= offsets[2]:
            return None  # not applied that far yet, or the log does not reach back: a later round
        shared = shared_keys(manifest)
        local = local_ssts(os.path.join(replica.store.dir, "kv"), {(k[0], k[1]): k[2] for k in shared})
        if all(k in local for k in shared):
            self._based[key] = snapshot_id  # its RocksDB holds every SST of it already
            return None
        with self._lock:
            self._busy.add(key)
        try:
            stats = self._rebase(replica, manifest, shared, local)
        finally:
            with self._lock:
                self._busy.discard(key)
            self._last[key] = self._monotonic()  # a failure too: tried again an interval later
        self._based[key] = snapshot_id
        with self._lock:
            self.totals.rebases += 1
            self.totals.downloaded_bytes += stats.downloaded_bytes
            self.totals.linked_bytes += stats.linked_bytes
            self.totals.seconds += stats.stage_s + stats.swap_s
            self.last = stats
        log.info("%s re-based on snapshot %d (log offset %d): %d bytes, %d downloaded, %d linked; staged in "
                 "%.2fs, swapped and replayed in %.2fs", replica.tb, stats.snapshot_id, stats.log_offset,
                 stats.bytes, stats.downloaded_bytes, stats.linked_bytes, stats.stage_s, stats.swap_s)
        return stats

    def _manifest(self, path: str) -> Manifest:
        """The manifest at ``path``, read once (a bucket not re-based yet is looked at again every round)."""
        manifest = self._manifests.get(path)
        if manifest is None:
            if len(self._manifests) >= MANIFESTS_CACHED:
                self._manifests.clear()
            manifest = self._manifests[path] = kvsnapshot.read_manifest(self.storage, path)
        return manifest

    def _rebase(self, replica, manifest: Manifest, shared: dict[FileKey, ManifestFile],
                local: dict[FileKey, str]) -> RebaseStats:
        stage = os.path.join(replica.store.dir, STAGE_DIR)
        kept = keep_staged(stage, shared)
        started = time.monotonic()
        linked = {f.local_name: local[k] for k, f in shared.items() if k in local and f.local_name not in kept}
        downloaded = self._stage(manifest, stage, linked, kept)
        staged = time.monotonic()
        try:
            self._swap(replica, stage, manifest.log_offset)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return RebaseStats(manifest.snapshot_id, manifest.log_offset, sum(f.size for f in manifest.files),
                           downloaded, sum(f.size for f in manifest.files if f.local_name in linked),
                           staged - started, time.monotonic() - staged)

    def _stage(self, manifest: Manifest, stage: str, linked: dict[str, str], kept: set[str]) -> int:
        """Hard-link ``linked`` (local name -> live path) into ``stage`` and download the files of ``manifest``
        neither linked nor ``kept`` (staged by an earlier attempt) there, each checked; returns the bytes
        downloaded."""
        fetched = []
        for f in manifest.files:
            if f.local_name in kept:
                continue
            source = linked.get(f.local_name)
            if source is not None:
                try:
                    os.link(source, os.path.join(stage, f.local_name))
                    continue
                except FileNotFoundError:  # compacted away since it was fingerprinted: downloaded instead
                    linked.pop(f.local_name)
            fetched.append(f)

        def fetch(f: ManifestFile) -> None:
            if self._stop.is_set() or not self.throttle.take(f.size):
                raise Stopped(f"the re-base on snapshot {manifest.snapshot_id} of {manifest.bucket} stopped: "
                              f"the server stops")
            final = os.path.join(stage, f.local_name)
            self.storage.download_file(f.path, f"{final}.part")
            kvsnapshot.check_file(self.storage, f, f"{final}.part")
            fsync_path(f"{final}.part")
            os.replace(f"{final}.part", final)

        kvsnapshot.run_all([lambda f=f: fetch(f) for f in fetched], self.io_threads)
        return sum(f.size for f in fetched)

    def _swap(self, replica, stage: str, log_offset: int) -> None:
        """``BucketStore.rebase_kv`` under the fetch lock, waiting up to :data:`SWAP_WAIT_S` while the files
        are in use (a read of the replica holds them a moment). Stopped if it leads or closed meanwhile."""
        deadline = self._monotonic() + SWAP_WAIT_S
        while True:
            with replica.fetch_lock:
                if replica.closed or replica.leads or self._stop.is_set():
                    raise Stopped(f"{replica.tb}: the re-base stopped (it leads, closed, or the server stops)")
                try:
                    replica.store.rebase_kv(stage, log_offset)
                    return
                except BucketInUseError:
                    if self._monotonic() >= deadline:
                        raise
            if self._stop.wait(SWAP_RETRY_S):
                raise Stopped(f"{replica.tb}: the re-base stopped (the server stops)")


class RebaseCollector:
    """``kvlease_tablet_rebases_total``, ``kvlease_tablet_rebase_download_bytes_total``,
    ``kvlease_tablet_rebase_linked_bytes_total`` and ``kvlease_tablet_rebase_seconds_total`` of the server's
    :class:`Rebaser` (its fetchers'), at scrape time; register it with a CollectorRegistry."""

    def __init__(self, fetchers) -> None:
        self.fetchers = fetchers

    def describe(self):  # registering must not call collect()
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        rebaser = getattr(self.fetchers, "rebaser", None)
        totals = rebaser.totals if rebaser is not None else RebaseTotals()
        yield CounterMetricFamily("kvlease_tablet_rebases", "followed buckets re-based on a remote snapshot",
                                  value=totals.rebases)
        yield CounterMetricFamily("kvlease_tablet_rebase_download_bytes",
                                  "snapshot bytes downloaded by re-bases", value=totals.downloaded_bytes)
        yield CounterMetricFamily("kvlease_tablet_rebase_linked_bytes",
                                  "snapshot bytes re-bases hard-linked from the live RocksDB",
                                  value=totals.linked_bytes)
        yield CounterMetricFamily("kvlease_tablet_rebase_seconds",
                                  "seconds re-bases spent (staging, swapping and replaying)", value=totals.seconds)
