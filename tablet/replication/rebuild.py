"""Rebuilding a followed bucket from its remote snapshot, when its log cannot continue from the leader's.

A follower whose fetch offset is below its leader's log start (retention
removed the head; a wiped data dir asks from 0) can never catch up by
fetching. The fetcher (``tablet/replication/fetcher.py``) hands such a
bucket to the :class:`Rebuilder`, which, on a thread of its own (the other
buckets' fetches go on), downloads the bucket's newest kept snapshot whose
``log_offset`` the leader's log still reaches (``common/kvsnapshot.py``,
through the storage interface), installs it as the bucket's files
(``BucketStore.install_snapshot``: RocksDB := the snapshot, the changelog
empty at its ``log_offset``) and hands the bucket back: the fetcher fetches
from there on and the leader adds it to the ISR once caught up (DESIGN.md
"Replication — semantics", "Rebuilding a replica").

A snapshot whose files are missing, of the wrong size or that do not open is
skipped for the next older one, with a warning naming it and why. With none
usable the bucket is tried again after :data:`RETRY_S`.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time

from common import errors, kvsnapshot
from common.model import SnapshotHandle
from common.storage import RemoteStorage
from tablet.replication.worker import ReplicaWorker

log = logging.getLogger(__name__)

DOWNLOAD_DIR = "rebuild-download"  # inside the bucket's directory: the install moves it (same file system)
RETRY_S = 5.0


class Rebuilder(ReplicaWorker):
    """Rebuilds followed buckets one at a time on a thread of its own (see the module docstring)."""

    name = "replica-rebuild"

    def __init__(self, storage: RemoteStorage, admin, stop: threading.Event, *, io_threads: int = 8) -> None:
        """``admin``: a ``client.admin.AdminClient`` (``list_kv_snapshots``)."""
        super().__init__(stop)
        self.storage = storage
        self.admin = admin
        self.io_threads = io_threads
        self._busy: set[int] = set()  # queued or being rebuilt: not fetched meanwhile
        #: Buckets rebuilt since the start (for tests and status).
        self.rebuilt = 0

    def busy(self, replica) -> bool:
        """Whether ``replica`` waits for or is in a rebuild (its fetches wait)."""
        with self._cond:
            return id(replica) in self._busy

    def due(self, replica, log_start: int) -> None:
        """Rebuild ``replica``: its leader's log starts at ``log_start``, above its fetch offset."""
        with self._cond:
            if id(replica) in self._busy:
                return
            self._busy.add(id(replica))
        if not self._queue(replica, log_start):
            with self._cond:
                self._busy.discard(id(replica))

    def _run(self) -> None:
        while (work := self._take(one=True)) is not None:
            (replica, log_start), = work
            done = False
            try:
                done = self.rebuild(replica, log_start) is not None or replica.closed or replica.leads
            except Exception:  # the coordinator cannot list the snapshots now, ...: try again later
                log.exception("rebuilding %s failed", replica.tb)
            if not done:
                self._stop.wait(RETRY_S)
            with self._cond:
                self._busy.discard(id(replica))  # the fetcher asks again: a bucket still behind comes back here

    def rebuild(self, replica, log_start: int) -> int | None:
        """Install the newest usable snapshot of ``replica``'s bucket whose ``log_offset`` is at least
        ``log_start``; returns its log offset, None if none could be installed (or the replica stopped
        following). Raises the coordinator's error if the snapshots cannot be listed."""
        handles = sorted((info.handle for info in self.admin.list_kv_snapshots(replica.table.table_id)
                          if info.handle.bucket == replica.tb and info.handle.log_offset >= log_start),
                         key=lambda h: h.snapshot_id, reverse=True)
        if not handles:
            log.error("%s cannot be rebuilt: its leader's log starts at offset %d and no kept snapshot reaches "
                      "that far; trying again in %.0fs", replica.tb, log_start, RETRY_S)
            return None
        for handle in handles:
            if replica.closed or replica.leads:
                return None
            try:
                return self._install(replica, handle)
            except (errors.KvLeaseError, OSError) as exc:
                log.warning("%s: snapshot %d (log offset %d) cannot be used to rebuild it, trying an older "
                            "one: %s", replica.tb, handle.snapshot_id, handle.log_offset, exc)
        log.error("%s cannot be rebuilt: none of its snapshots %s is usable; trying again in %.0fs", replica.tb,
                  [h.snapshot_id for h in handles], RETRY_S)
        return None

    def _install(self, replica, handle: SnapshotHandle) -> int | None:
        store = replica.store
        target = os.path.join(store.dir, DOWNLOAD_DIR)
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        try:
            manifest = kvsnapshot.download(self.storage, handle, target, io_threads=self.io_threads)
            size = sum(f.size for f in manifest.files)
            with replica.fetch_lock:
                if replica.closed or replica.leads:
                    return None
                store.install_snapshot(target, manifest.log_offset)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        self.rebuilt += 1
        log.info("%s rebuilt from snapshot %d: %d bytes in %.1fs; its log continues from offset %d", replica.tb,
                 handle.snapshot_id, size, time.monotonic() - started, manifest.log_offset)
        return manifest.log_offset
