"""Remote KV snapshots of one bucket: incremental upload (the format and download: common/kvsnapshot.py).

Layout, naming, failure handling and figures: ``docs/snapshots.md``. In short,
every upload has a tag of its own, ``e{leader epoch}-{random}``. The JSON
manifest goes *first*, created exclusively at ``kv/{t}/{b}/snap-{id}/_METADATA``
(the claim of the id: an upload that finds it taken writes nothing); SSTs go
to ``kv/{t}/{b}/shared/{stem}-{size}-{crc32 of the last 64 KiB}-s{id}-{tag}.sst``
(the tail holds RocksDB's db/session ids, so a re-created DB never matches),
the other checkpoint files to ``kv/{t}/{b}/snap-{id}/{tag}/``. So no two
uploads, of two leaders or one, ever write or delete the same name.
An SST counts as present only if the latest committed snapshot uses it, or
this uploader put it there itself, and in both cases one listing of the shared
directory just before the upload shows it with its size.

``check()`` (given by the caller: ``tablet/replicas/snapshots.py``
``still_leads``) runs before the claim, before every file and before the commit:
a leader deposed meanwhile stops and deletes everything its upload wrote.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable

from kvlease.common import errors
from kvlease.common.checksum import file_crc32
from kvlease.common.storage import RemoteStorage, StorageExists
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
from kvlease.common.kvsnapshot import Manifest, ManifestFile, read_manifest, run_all, shared_dir, snapshot_dir

log = logging.getLogger(__name__)

TAIL_BYTES = 64 << 10  # fingerprinted end of an SST: holds its properties block
_SKIPPED = re.compile(r"^(LOCK|LOG(\.old\..*)?)$")  # lock and info logs are not part of a checkpoint
#: an upload's tag: the leader epoch it was taken under ("e-1": none) and a random token
_TAG = r"e-?\d+-[0-9a-f]+"
_SHARED_NAME = re.compile(r"^(?P<stem>[^/]+?)-(?P<size>\d+)-(?P<crc>[0-9a-f]{8})-s(?P<sid>\d+)"
                          rf"(?:-(?P<tag>{_TAG}))?\.sst$")  # no tag: uploaded before issue 39
_PRIVATE_DIR = re.compile(rf"/snap-(?P<sid>\d+)/(?P<tag>{_TAG})/[^/]+$")

FileKey = tuple[str, int, int]  # (local name, size, crc32 of the tail)

#: ``check()``: raises (NotLeaderError, FencedLeaderEpochError) once the upload's leadership is over
Check = Callable[[], None]
DEPOSED = (errors.NotLeaderError, errors.FencedLeaderEpochError)


def _always() -> None:
    return None


# --- layout -----------------------------------------------------------------------

def new_tag(leader_epoch: int | None) -> str:
    """A tag no other upload has: the leader epoch and 32 random bits (one leadership never reuses a
    snapshot id, so the bits only tell apart uploads of one epoch and id by two lives of one server)."""
    return f"e{-1 if leader_epoch is None else leader_epoch}-{secrets.token_hex(4)}"


def shared_name(key: FileKey, snapshot_id: int, tag: str = "") -> str:
    name, size, crc = key
    return f"{name.removesuffix('.sst')}-{size}-{crc:08x}-s{snapshot_id}{'-' + tag if tag else ''}.sst"


def parse_shared(path: str) -> FileKey | None:
    """The local-file key a shared object was uploaded for; None for any other path."""
    match = _SHARED_NAME.match(path.rsplit("/", 1)[-1])
    if match is None:
        return None
    return (f"{match['stem']}.sst", int(match["size"]), int(match["crc"], 16))


def upload_of(path: str) -> tuple[int, str] | None:
    """``(snapshot id, tag)`` of the upload that wrote this shared SST or private file; None for any other
    path (a manifest, a file named before uploads had tags)."""
    match = _SHARED_NAME.match(path.rsplit("/", 1)[-1])
    if match is None:
        match = _PRIVATE_DIR.search(path)
    if match is None or not match["tag"]:
        return None
    return int(match["sid"]), match["tag"]


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
        #: uploaded by us, used by no committed snapshot we know: (file, when its upload began, ms)
        self._pending: dict[FileKey, tuple[SnapshotFile, int]] = {}
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
               writers: tuple[tuple[int, ...], ...] = (), *, leader_epoch: int | None = None,
               check: Check = _always, reuse_pending_ms: int | None = None) -> SnapshotHandle:
        """Upload the checkpoint; returns the handle to commit (nothing is committed here).

        Each file's manifest entry carries its CRC-32 (an SST's is computed once per uploader);
        ``writers``: the idempotent writers' batches the snapshot holds (``common/kvsnapshot.py``);
        ``leader_epoch``: the epoch the checkpoint was taken under (in the upload's tag).

        The manifest is created first (``write_new``: the claim of the id), then new SSTs and the
        private files go up in parallel, each after ``check()``. On failure the private files and the
        manifest this call wrote are deleted; new shared SSTs stay for the next upload, unless
        ``check()`` failed (a deposed leader uploads nothing again: they go too). An SST this uploader
        put there more than ``reuse_pending_ms`` ago (None: no limit) is not reused: the coordinator
        reclaims unreferenced files after ``kv.snapshot.orphan-grace``.
        Raises StorageError, StorageExists (``snap-{id}`` is taken: nothing was written, use a new id),
        InvalidSnapshotError, and what ``check()`` raises.
        """
        with self._lock:
            if self.base is not None and snapshot_id <= self.base.snapshot_id:
                raise errors.InvalidSnapshotError(
                    f"snapshot {snapshot_id} of {self.table_bucket} is not newer than the committed "
                    f"{self.base.snapshot_id}")
            check()  # before anything is read, fingerprinted or claimed
            tag = new_tag(leader_epoch)
            local = _scan(checkpoint_dir)
            shared: list[ManifestFile] = []
            new_shared: list[tuple[FileKey, ManifestFile]] = []
            private: list[ManifestFile] = []
            keys = {name: self._key(checkpoint_dir, name, size) for name, size in local}
            reuse = self._reusable({key for key in keys.values() if key is not None}, reuse_pending_ms)
            live = set(keys.values())
            self._crcs = {k: v for k, v in self._crcs.items() if k in live}
            for name, size in local:
                key = keys[name]
                crc = self._crc(checkpoint_dir, name, key)
                if key is None:
                    private.append(ManifestFile(f"{snapshot_dir(self.table_bucket, snapshot_id)}/{tag}/{name}", name,
                                                size, crc))
                elif key in reuse:
                    shared.append(ManifestFile(reuse[key].path, name, size, crc))
                else:
                    entry = ManifestFile(f"{shared_dir(self.table_bucket)}/{shared_name(key, snapshot_id, tag)}", name,
                                         size, crc)
                    shared.append(entry)
                    new_shared.append((key, entry))
            manifest = Manifest(self.table_bucket, snapshot_id, log_offset,
                                tuple(sorted(shared + private, key=lambda f: f.local_name)), self.clock_ms(),
                                tuple(tuple(w) for w in writers))
            data = manifest.to_bytes()
            self._write_all(checkpoint_dir, manifest, data, new_shared, private, check)
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
        ``shared_too``: also the shared SSTs this upload put there (named with its tag: used by no other
        snapshot), for an upload no later snapshot of this uploader will reuse (a deposed leader's).

        Only names of this upload go: its private files and SSTs carry its tag, and the manifest (the
        one name ids share) is deleted only if it is still this upload's, read back."""
        origin = next((o for f in handle.files if (o := upload_of(f.path)) is not None
                       and f.path.startswith(snapshot_dir(self.table_bucket, handle.snapshot_id) + "/")), None)
        if origin is None:  # not an upload of this version (no tag): which names are its own is unknown
            log.warning("snapshot %d of %s has no upload tag: its files are left to the coordinator's reclaim",
                        handle.snapshot_id, self.table_bucket)
            return
        doomed = [f.path for f in handle.files if upload_of(f.path) == origin
                  and (shared_too or parse_shared(f.path) is None)]
        if shared_too:
            with self._lock:
                for key in [k for k, (f, _at) in self._pending.items() if f.path in doomed]:
                    del self._pending[key]
        if self._is_ours(handle.metadata_path, handle):
            doomed.append(handle.metadata_path)
        self.storage.delete_many(sorted(doomed))

    def _is_ours(self, manifest_path: str, handle: SnapshotHandle) -> bool:
        """Whether the manifest at ``manifest_path`` is the one of ``handle`` (its files carry the upload's
        tag, so no other upload writes the same list); False if it is gone, or cannot be read."""
        try:
            found = read_manifest(self.storage, manifest_path)
        except (errors.StorageError, errors.InvalidSnapshotError):
            return False
        return sorted((f.path, f.size) for f in found.files) == sorted((f.path, f.size) for f in handle.files)

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

    def _reusable(self, keys: set[FileKey], reuse_pending_ms: int | None) -> dict[FileKey, SnapshotFile]:
        """The SSTs of the latest committed snapshot, and our own earlier uploads (begun within
        ``reuse_pending_ms``), that one listing of the shared directory shows with their size: nothing
        is assumed present (a file deleted behind our back, even one the coordinator holds, is uploaded
        again under a new name)."""
        since = None if reuse_pending_ms is None else self.clock_ms() - reuse_pending_ms
        self._pending = {k: p for k, p in self._pending.items()  # gone from the DB, or too old: never again
                         if k in keys and (since is None or p[1] >= since)}
        if not any(k in self._committed for k in keys) and not self._pending:
            return {}
        listed = self.storage.list_sizes(shared_dir(self.table_bucket))
        found: dict[FileKey, SnapshotFile] = {}
        for key in keys:
            pending = self._pending.get(key)
            seen = [f for f in (self._committed.get(key), pending[0] if pending else None)
                    if f is not None and listed.get(f.path) == f.size]
            if seen:
                found[key] = seen[0]
        self._pending = {k: p for k, p in self._pending.items() if found.get(k) == p[0]}
        return found

    def _write_all(self, checkpoint_dir: str, manifest: Manifest, data: bytes,
                   new_shared: list[tuple[FileKey, ManifestFile]], private: list[ManifestFile], check: Check) -> None:
        check()  # fingerprints and checksums took their time
        self._claim(manifest, data)  # StorageExists: the id is another upload's, nothing of ours is there
        written: list[str] = [manifest.path]  # private paths this call may have created (deleted on failure)
        arrived: list[tuple[FileKey, str]] = []  # new shared SSTs this call may have created
        guard = threading.Lock()
        started_ms = self.clock_ms()

        def put_shared(key: FileKey, f: ManifestFile) -> None:
            check()
            with guard:
                arrived.append((key, f.path))
            self.storage.upload_file(f.path, os.path.join(checkpoint_dir, f.local_name))
            with guard:
                self._pending[key] = (SnapshotFile(f.path, f.size), started_ms)

        def put_private(f: ManifestFile) -> None:
            check()
            with open(os.path.join(checkpoint_dir, f.local_name), "rb") as fh:
                body = fh.read()
            with guard:
                written.append(f.path)  # a name of our own: even a write that failed may have landed
            self.storage.write_new(f.path, body)

        tasks = [lambda k=k, f=f: put_shared(k, f) for k, f in new_shared]
        tasks += [lambda f=f: put_private(f) for f in private]
        try:
            run_all(tasks, self.io_threads)
        except BaseException as exc:
            doomed = list(written)
            if isinstance(exc, DEPOSED):  # no later upload of this uploader reuses them
                doomed += [path for _key, path in arrived]
                with guard:
                    for key, _path in arrived:
                        self._pending.pop(key, None)
                log.warning("snapshot %d of %s stopped, its files are deleted: %s", manifest.snapshot_id,
                            self.table_bucket, getattr(exc, "message", exc))
            try:
                self.storage.delete_many(sorted(doomed))
            except errors.StorageError as err:  # orphans: the coordinator reclaims them after the grace
                log.warning("could not delete %d files of failed snapshot %d of %s: %s",
                            len(doomed), manifest.snapshot_id, self.table_bucket, err)
            raise

    def _claim(self, manifest: Manifest, data: bytes) -> None:
        """Create the manifest, which no upload ever overwrites: the claim of the snapshot id. A reply lost
        on the way is settled by reading the manifest back (its file names carry this upload's tag).
        Raises StorageExists (the id is another upload's) or the write's StorageError (nothing of ours is
        there, or nobody can tell: an orphan the coordinator reclaims)."""
        try:
            self.storage.write_new(manifest.path, data)
        except StorageExists:
            raise
        except errors.StorageError:
            if self._is_ours(manifest.path, manifest.to_handle()):
                return
            raise

def upload_and_commit(uploader: SnapshotUploader, commit: Callable[[SnapshotHandle], None], checkpoint_dir: str,
                      snapshot_id: int, log_offset: int, writers: tuple[tuple[int, ...], ...] = (), *,
                      leader_epoch: int | None = None, check: Check = _always,
                      reuse_pending_ms: int | None = None) -> SnapshotHandle:
    """Upload, ``check()`` once more, then ``commit(handle)`` (e.g. ``AdminClient.commit_kv_snapshot``), then
    advance the base.

    A refused commit (invalid request, not found) discards the upload; a fenced one (taken under a leader
    epoch older than the bucket's current one, or by a server that is no longer a replica), or one whose
    ``check()`` failed before the commit, also the new shared SSTs only it uses; any other error may have
    committed it, so its files stay (at worst orphans, which the coordinator reclaims).
    """
    handle = uploader.upload(checkpoint_dir, snapshot_id, log_offset, writers, leader_epoch=leader_epoch,
                             check=check, reuse_pending_ms=reuse_pending_ms)
    try:
        check()
        commit(handle)
    except (errors.InvalidRequestError, errors.NotFoundError):
        uploader.discard(handle)
        raise
    except DEPOSED as exc:
        log.warning("snapshot %d of %s is not committed (its leadership is over), its uploaded files are "
                    "deleted: %s", snapshot_id, uploader.table_bucket, exc.message)
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


