"""The remote KV snapshot format: where a snapshot's files live, its manifest, and how to fetch it.

Tablet servers write snapshots (``tablet/store/snapshot.py``); readers such as the
Spark source fetch them through the remote storage interface and open them
read-only. Layout under the storage root (also ``docs/snapshots.md``)::

    kv/{table_id}/{bucket}/shared/{sst}        SST files shared between snapshots
    kv/{table_id}/{bucket}/snap-{id}/{tag}/... the snapshot's other files (the upload's own directory)
    kv/{table_id}/{bucket}/snap-{id}/_METADATA its manifest (JSON), created first (docs/snapshots.md)

Manifests written since issue 31 also carry, still as version 1 (older readers
ignore them; older manifests lack them): each file's ``crc32`` (checked by a
download when present) and ``writers``, the idempotent writers' newest batches
below the snapshot's ``log_offset`` (``[writer_id, first_seq, last_seq,
base_offset, last_offset, time_ms]`` each), so a replica rebuilt from the
snapshot still recognises a resent batch the snapshot holds.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Iterable

from kvlease.common import errors
from kvlease.common.checksum import file_crc32
from kvlease.common.fsync import fsync_path
from kvlease.common.storage import RemoteStorage
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket

MANIFEST_NAME = "_METADATA"
MANIFEST_VERSION = 1


# --- layout -----------------------------------------------------------------------

def bucket_dir(tb: TableBucket) -> str:
    part = "" if tb.partition_id is None else f"p{tb.partition_id}/"
    return f"kv/{tb.table_id}/{part}{tb.bucket}"


def shared_dir(tb: TableBucket) -> str:
    return f"{bucket_dir(tb)}/shared"


def snapshot_dir(tb: TableBucket, snapshot_id: int) -> str:
    return f"{bucket_dir(tb)}/snap-{snapshot_id}"


def manifest_path(tb: TableBucket, snapshot_id: int) -> str:
    return f"{snapshot_dir(tb, snapshot_id)}/{MANIFEST_NAME}"

# --- the manifest -----------------------------------------------------------------

@dataclass(frozen=True)
class ManifestFile:
    path: str  # remote, relative to the storage root
    local_name: str  # name inside the checkpoint directory
    size: int
    crc32: int | None = None  # of the whole file (None: a manifest written before checksums)

    def to_json(self) -> dict:
        doc = {"path": self.path, "local_name": self.local_name, "size": self.size}
        if self.crc32 is not None:
            doc["crc32"] = self.crc32
        return doc


@dataclass(frozen=True)
class Manifest:
    bucket: TableBucket
    snapshot_id: int
    log_offset: int
    files: tuple[ManifestFile, ...]
    created_ms: int
    #: ``(writer_id, first_seq, last_seq, base_offset, last_offset, time_ms)`` per batch (module docstring)
    writers: tuple[tuple[int, int, int, int, int, int], ...] = ()

    @property
    def path(self) -> str:
        return manifest_path(self.bucket, self.snapshot_id)

    def to_bytes(self) -> bytes:
        doc = {
            "version": MANIFEST_VERSION, **self.bucket.to_json(), "snapshot_id": self.snapshot_id,
            "log_offset": self.log_offset, "created_ms": self.created_ms,
            "files": [f.to_json() for f in self.files],
        }
        if self.writers:
            doc["writers"] = [list(w) for w in self.writers]
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "") -> "Manifest":
        """Raises InvalidSnapshotError for anything but a well-formed version-1 manifest."""
        try:
            doc = json.loads(data)
            if doc.get("version") != MANIFEST_VERSION:
                raise ValueError(f"unsupported manifest version {doc.get('version')!r}")
            files = tuple(ManifestFile(f["path"], f["local_name"], int(f["size"]),
                                       None if f.get("crc32") is None else int(f["crc32"])) for f in doc["files"])
            writers = tuple(tuple(int(v) for v in w) for w in doc.get("writers", ()))
            if any(len(w) != 6 for w in writers):
                raise ValueError("a writer batch is not [writer_id, first_seq, last_seq, base, last, time_ms]")
            for f in files:
                if not f.local_name or "/" in f.local_name or f.local_name.startswith("."):
                    raise ValueError(f"bad local name {f.local_name!r}")
            return cls(TableBucket.from_json(doc), int(doc["snapshot_id"]), int(doc["log_offset"]), files,
                       int(doc["created_ms"]), writers)
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.InvalidSnapshotError(f"bad snapshot manifest {where}: {exc}") from None

    def to_handle(self) -> SnapshotHandle:
        """The handle to commit: every remote file (shared and private) and the manifest."""
        return SnapshotHandle(self.bucket, self.snapshot_id, self.log_offset, self.path,
                              tuple(SnapshotFile(f.path, f.size) for f in self.files))


def missing_files(storage: RemoteStorage, files: Iterable[SnapshotFile | ManifestFile]
                  ) -> list[tuple[str, int, int | None]]:
    """The files not on remote storage with their size, by path: ``(path, size, size found or None)``.
    One listing per directory they are in (a snapshot's: its bucket's ``shared/`` and its ``snap-{id}/``).
    Raises StorageError."""
    files = sorted(files, key=lambda f: f.path)
    listed: dict[str, int] = {}
    for directory in sorted({f.path.rsplit("/", 1)[0] for f in files}):
        listed.update(storage.list_sizes(directory))
    return [(f.path, f.size, listed.get(f.path)) for f in files if listed.get(f.path) != f.size]


def read_manifest(storage: RemoteStorage, path: str) -> Manifest:
    """Raises StorageNotFound, StorageError, InvalidSnapshotError."""
    return Manifest.from_bytes(storage.read(path), where=path)

# --- download ---------------------------------------------------------------------------

def download(storage: RemoteStorage, source: SnapshotHandle | str, target_dir: str, *,
             io_threads: int = 8, before_file: Callable[[Manifest, ManifestFile], None] = lambda m, f: None,
             on_file: Callable[[int], None] = lambda n: None, durable: bool = False) -> Manifest:
    """Restore a snapshot (a handle or a manifest path) as a checkpoint directory.

    ``target_dir`` must be missing or empty. Each file is fetched to a temp
    name, checked (:func:`check_file`), then renamed. ``before_file(manifest, file)`` runs before each
    file is fetched (it may raise to stop the download), ``on_file(bytes)`` after it is in place.
    ``durable``: each file is fsynced by the I/O thread that fetched it, while the others still download,
    and ``target_dir`` once all are in place (a replica's files: their install finds nothing left to flush).
    Raises StorageNotFound (a file or the manifest is gone), StorageError, InvalidSnapshotError (and
    what ``before_file`` raises); on failure the files written here are removed.
    """
    path = source.metadata_path if isinstance(source, SnapshotHandle) else source
    manifest = read_manifest(storage, path)
    os.makedirs(target_dir, exist_ok=True)
    if os.listdir(target_dir):
        raise errors.InvalidRequestError(f"download target {target_dir} is not empty")

    def fetch(f: ManifestFile) -> None:
        before_file(manifest, f)
        final = os.path.join(target_dir, f.local_name)
        tmp = f"{final}.part"
        storage.download_file(f.path, tmp)
        check_file(storage, f, tmp)
        if durable:
            fsync_path(tmp)
        os.replace(tmp, final)
        on_file(f.size)

    try:
        run_all([lambda f=f: fetch(f) for f in manifest.files], io_threads)
        if durable:
            fsync_path(target_dir)
    except BaseException:
        for name in os.listdir(target_dir):
            os.unlink(os.path.join(target_dir, name))
        raise
    return manifest


def check_file(storage: RemoteStorage, f: ManifestFile, local_path: str) -> None:
    """StorageError unless the local copy of ``f`` has the manifest's size and (if it has one) CRC-32."""
    size = os.path.getsize(local_path)
    if size != f.size:
        raise errors.StorageError(f"{storage.uri}/{f.path} has {size} bytes, the manifest says {f.size}",
                                  path=f.path)
    if f.crc32 is not None and (crc := file_crc32(local_path)) != f.crc32:
        raise errors.StorageError(f"{storage.uri}/{f.path} is corrupt: its CRC-32 is {crc:08x}, the manifest "
                                  f"says {f.crc32:08x}", path=f.path)


def open_read_only(checkpoint_dir: str):
    """A read-only ``rocksdict.Rdict`` (raw bytes) on a downloaded snapshot."""
    from rocksdict import AccessType, Options, Rdict

    return Rdict(checkpoint_dir, Options(raw_mode=True), access_type=AccessType.read_only())


def scan_read_options():
    """``rocksdict.ReadOptions`` for reading a bucket or a snapshot from end to end: each block is read
    once, so the block cache is not filled (it would evict the blocks point lookups reuse, and grow the
    process by the cache's size on the first scan; reading without it is also ~20% faster)."""
    from rocksdict import ReadOptions

    options = ReadOptions()
    options.fill_cache(False)
    return options


# --- helpers ------------------------------------------------------------------------------

def run_all(tasks: Iterable[Callable[[], None]], threads: int) -> None:
    """Run in parallel; on the first failure cancel what has not started, wait for the rest, re-raise."""
    tasks = list(tasks)
    if not tasks:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(tasks))), thread_name_prefix="snapshot-io") as pool:
        futures = [pool.submit(task) for task in tasks]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            for f in futures:
                f.cancel()
            wait(futures)
            raise failed.exception()
