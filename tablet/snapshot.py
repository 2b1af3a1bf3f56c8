"""Remote KV snapshots of one bucket: incremental upload (the format and download: common/kvsnapshot.py).

Layout, naming, failure handling and figures: ``docs/snapshots.md``. In short,
SSTs go to ``kv/{t}/{b}/shared/{stem}-{size}-{crc32 of the last 64 KiB}-s{id}.sst``
(the tail holds RocksDB's db/session ids, so a re-created DB never matches;
``-s{id}`` makes every upload a fresh name), the other checkpoint files to
``kv/{t}/{b}/snap-{id}/``, the JSON manifest last to ``snap-{id}/_METADATA``.
An SST counts as present only if the latest committed snapshot uses it, or
this uploader put it there itself, and in both cases one listing of the shared
directory just before the upload shows it with its size.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable

from common import errors
from common.checksum import file_crc32
from common.storage import RemoteStorage, StorageExists
from common.model import SnapshotFile, SnapshotHandle, TableBucket
from common.kvsnapshot import Manifest, ManifestFile, run_all, shared_dir, snapshot_dir

log = logging.getLogger(__name__)

TAIL_BYTES = 64 << 10  # fingerprinted end of an SST: holds its properties block
_SKIPPED = re.compile(r"^(LOCK|LOG(\.old\..*)?)$")  # lock and info logs are not part of a checkpoint
_SHARED_NAME = re.compile(r"^(?P<stem>[^/]+)-(?P<size>\d+)-(?P<crc>[0-9a-f]{8})-s(?P<sid>\d+)\.sst$")

FileKey = tuple[str, int, int]  # (local name, size, crc32 of the tail)


# --- layout -----------------------------------------------------------------------

def shared_name(key: FileKey, snapshot_id: int) -> str:
    name, size, crc = key
    return f"{name.removesuffix('.sst')}-{size}-{crc:08x}-s{snapshot_id}.sst"


def parse_shared(path: str) -> FileKey | None:
    """The local-file key a shared object was uploaded for; None for any other path."""
    match = _SHARED_NAME.match(path.rsplit("/", 1)[-1])
    if match is None:
        return None
    return (f"{match['stem']}.sst", int(match["size"]), int(match["crc"], 16))


def fingerprint(path: str, size: int) -> int:
    """CRC-32 of the file's last ``TAIL_BYTES``."""
    with open(path, "rb") as fh:
        fh.seek(max(0, size - TAIL_BYTES))
        return zlib.crc32(fh.read())


# --- upload -------------------------------------------------------------------------

@dataclass(frozen=True)
class UploadStats:
    snapshot_id: int
    files: int  # files the snapshot uses (shared + private, not the manifest)
    bytes: int
    uploaded_files: int  # objects written, the manifest included
    uploaded_bytes: int
    new_shared_files: int
    new_shared_bytes: int
    reused_shared_files: int
    reused_shared_bytes: int


class SnapshotUploader:
    """Uploads one bucket's checkpoints; one upload at a time, one uploader per bucket (its leader).

    ``base`` is the bucket's latest committed snapshot (from the coordinator,
    or ``read_manifest(...).to_handle()``): its shared SSTs are taken as
    present. Call :meth:`mark_committed` after each successful commit, or use
    :func:`upload_and_commit`.
    """

    def __init__(self, storage: RemoteStorage, table_bucket: TableBucket, *, io_threads: int = 8,
                 base: SnapshotHandle | None = None, clock_ms: Callable[[], int] | None = None) -> None:
        self.storage = storage
        self.table_bucket = table_bucket
        self.io_threads = io_threads
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.base: SnapshotHandle | None = None
        self._committed: dict[FileKey, SnapshotFile] = {}
        self._pending: dict[FileKey, SnapshotFile] = {}  # uploaded by us, used by no committed snapshot we know
        self._crcs: dict[FileKey, int] = {}  # whole-file CRC-32 of the SSTs seen (an SST never changes)
        self._lock = threading.Lock()
        self.last_stats: UploadStats | None = None
        if base is not None:
            self.mark_committed(base)

    def mark_committed(self, handle: SnapshotHandle) -> None:
        """The coordinator holds ``handle``: it is the base of the next upload."""
        if handle.bucket != self.table_bucket:
            raise errors.InvalidRequestError(f"snapshot of {handle.bucket} given to the uploader of {self.table_bucket}")
        prefix = shared_dir(self.table_bucket) + "/"
        self.base = handle
        self._committed = {key: f for f in handle.files
                           if f.path.startswith(prefix) and (key := parse_shared(f.path)) is not None}
        for key in self._committed:
            self._pending.pop(key, None)

    def upload(self, checkpoint_dir: str, snapshot_id: int, log_offset: int,
               writers: tuple[tuple[int, ...], ...] = ()) -> SnapshotHandle:
        """Upload the checkpoint; returns the handle to commit (nothing is committed here).

        Each file's manifest entry carries its CRC-32 (an SST's is computed once per uploader);
        ``writers``: the idempotent writers' batches the snapshot holds (``common/kvsnapshot.py``).

        New SSTs and the private files go up in parallel, the manifest last
        (``write_new``). On failure the private files and the manifest this
        call wrote are deleted; new shared SSTs stay for the next upload.
        Raises StorageError, StorageExists (``snap-{id}`` is taken: use a new
        id), InvalidSnapshotError.
        """
        with self._lock:
            if self.base is not None and snapshot_id <= self.base.snapshot_id:
                raise errors.InvalidSnapshotError(
                    f"snapshot {snapshot_id} of {self.table_bucket} is not newer than the committed "
                    f"{self.base.snapshot_id}")
            local = _scan(checkpoint_dir)
            shared: list[ManifestFile] = []
            new_shared: list[tuple[FileKey, ManifestFile]] = []
            private: list[ManifestFile] = []
            keys = {name: self._key(checkpoint_dir, name, size) for name, size in local}
            reuse = self._reusable({key for key in keys.values() if key is not None})
            live = set(keys.values())
            self._crcs = {k: v for k, v in self._crcs.items() if k in live}
            for name, size in local:
                key = keys[name]
                crc = self._crc(checkpoint_dir, name, key)
                if key is None:
                    private.append(ManifestFile(f"{snapshot_dir(self.table_bucket, snapshot_id)}/{name}", name, size,
                                                crc))
                elif key in reuse:
                    shared.append(ManifestFile(reuse[key].path, name, size, crc))
                else:
                    entry = ManifestFile(f"{shared_dir(self.table_bucket)}/{shared_name(key, snapshot_id)}", name, size,
                                         crc)
                    shared.append(entry)
                    new_shared.append((key, entry))
            manifest = Manifest(self.table_bucket, snapshot_id, log_offset,
                                tuple(sorted(shared + private, key=lambda f: f.local_name)), self.clock_ms(),
                                tuple(tuple(w) for w in writers))
            data = manifest.to_bytes()
            self._write_all(checkpoint_dir, manifest, data, new_shared, private)
            self.last_stats = UploadStats(
                snapshot_id, len(manifest.files), sum(f.size for f in manifest.files),
                len(new_shared) + len(private) + 1,
                sum(f.size for _, f in new_shared) + sum(f.size for f in private) + len(data),
                len(new_shared), sum(f.size for _, f in new_shared),
                len(shared) - len(new_shared), sum(f.size for f in shared) - sum(f.size for _, f in new_shared))
            log.info("uploaded snapshot %d of %s: %s", snapshot_id, self.table_bucket, self.last_stats)
            return manifest.to_handle()

    def discard(self, handle: SnapshotHandle, shared_too: bool = False) -> None:
        """Delete the private files and manifest of an upload whose commit was definitely refused;
        ``shared_too``: also the shared SSTs this upload put there (named ``-s{id}``: used by no other
        snapshot), for an upload no later snapshot of this uploader will reuse (a fenced one)."""
        prefix = snapshot_dir(self.table_bucket, handle.snapshot_id) + "/"
        doomed = [p for p in handle.file_paths() if p.startswith(prefix)]
        if shared_too:
            ours = {key: f.path for f in handle.files if (key := parse_shared(f.path)) is not None
                    and f.path == f"{shared_dir(self.table_bucket)}/{shared_name(key, handle.snapshot_id)}"}
            with self._lock:
                for key in ours:
                    self._pending.pop(key, None)
            doomed += ours.values()
        self.storage.delete_many(sorted(doomed))

    # -- internals ------------------------------------------------------------------

    def _crc(self, checkpoint_dir: str, name: str, key: FileKey | None) -> int:
        if key is not None and key in self._crcs:
            return self._crcs[key]
        crc = file_crc32(os.path.join(checkpoint_dir, name))
        if key is not None:
            self._crcs[key] = crc
        return crc

    def _key(self, checkpoint_dir: str, name: str, size: int) -> FileKey | None:
        if not name.endswith(".sst"):
            return None
        return (name, size, fingerprint(os.path.join(checkpoint_dir, name), size))

    def _reusable(self, keys: set[FileKey]) -> dict[FileKey, SnapshotFile]:
        """The SSTs of the latest committed snapshot, and our own earlier uploads, that one listing of
        the shared directory shows with their size: nothing is assumed present (a file deleted behind
        our back, even one the coordinator holds, is uploaded again under a new name)."""
        self._pending = {k: f for k, f in self._pending.items() if k in keys}  # gone from the DB: never again
        if not any(k in self._committed for k in keys) and not self._pending:
            return {}
        listed = self.storage.list_sizes(shared_dir(self.table_bucket))
        found: dict[FileKey, SnapshotFile] = {}
        for key in keys:
            seen = [f for f in (self._committed.get(key), self._pending.get(key))
                    if f is not None and listed.get(f.path) == f.size]
            if seen:
                found[key] = seen[0]
        self._pending = {k: f for k, f in self._pending.items() if found.get(k) == f}
        return found

    def _write_all(self, checkpoint_dir: str, manifest: Manifest, data: bytes,
                   new_shared: list[tuple[FileKey, ManifestFile]], private: list[ManifestFile]) -> None:
        written: list[str] = []  # private paths this call may have created (deleted on failure)
        guard = threading.Lock()

        def put_shared(key: FileKey, f: ManifestFile) -> None:
            self.storage.upload_file(f.path, os.path.join(checkpoint_dir, f.local_name))
            with guard:
                self._pending[key] = SnapshotFile(f.path, f.size)

        def put_private(path: str, body: bytes | None, local: str = "") -> None:
            if body is None:
                with open(local, "rb") as fh:
                    body = fh.read()
            try:
                self.storage.write_new(path, body)
            except StorageExists:
                raise  # someone else's object: never delete it
            except BaseException:
                with guard:
                    written.append(path)  # may exist anyway (a lost reply)
                raise
            with guard:
                written.append(path)

        tasks = [lambda k=k, f=f: put_shared(k, f) for k, f in new_shared]
        tasks += [lambda f=f: put_private(f.path, None, os.path.join(checkpoint_dir, f.local_name)) for f in private]
        try:
            run_all(tasks, self.io_threads)
            put_private(manifest.path, data)
        except BaseException:
            if written:
                try:
                    self.storage.delete_many(sorted(written))
                except errors.StorageError as exc:
                    log.warning("could not delete %d files of failed snapshot %d of %s: %s",
                                len(written), manifest.snapshot_id, self.table_bucket, exc)
            raise


def upload_and_commit(uploader: SnapshotUploader, commit: Callable[[SnapshotHandle], None], checkpoint_dir: str,
                      snapshot_id: int, log_offset: int, writers: tuple[tuple[int, ...], ...] = ()) -> SnapshotHandle:
    """Upload, then ``commit(handle)`` (e.g. ``AdminClient.commit_kv_snapshot``), then advance the base.

    A refused commit (invalid request, not found) discards the upload; a fenced one (taken under a leader
    epoch older than the bucket's latest data loss, or by a server that is no longer a replica) also the
    new shared SSTs only it uses; any other error may have committed it, so its files stay (at worst orphans).
    """
    handle = uploader.upload(checkpoint_dir, snapshot_id, log_offset, writers)
    try:
        commit(handle)
    except (errors.InvalidRequestError, errors.NotFoundError):
        uploader.discard(handle)
        raise
    except errors.FencedLeaderEpochError as exc:
        log.warning("snapshot %d of %s is refused by the coordinator, its uploaded files are deleted: %s",
                    snapshot_id, uploader.table_bucket, exc.message)
        uploader.discard(handle, shared_too=True)
        raise
    uploader.mark_committed(handle)
    return handle


# --- helpers ------------------------------------------------------------------------------

def _scan(checkpoint_dir: str) -> list[tuple[str, int]]:
    """``(name, size)`` of the checkpoint's files, sorted by name."""
    found = []
    with os.scandir(checkpoint_dir) as entries:
        for entry in entries:
            if _SKIPPED.match(entry.name):
                continue
            if not entry.is_file(follow_symlinks=False):
                raise errors.InvalidRequestError(f"unexpected {entry.path} in a checkpoint (not a plain file)")
            found.append((entry.name, entry.stat().st_size))
    if not any(name.startswith("CURRENT") for name, _ in found):
        raise errors.InvalidRequestError(f"{checkpoint_dir} is not a RocksDB checkpoint (no CURRENT)")
    return sorted(found)


