"""Downloading a remote snapshot for a replica rebuild: bounded in bandwidth, checked, abortable.

Like ``common.kvsnapshot.download`` (each file to a temp name, renamed once
checked), with what a tablet server's rebuild needs on top:

- the bytes of each file are taken from the server's :class:`~tablet.replication.throttle.Throttle`
  (``replica.rebuild.max-bytes-per-s``) before it is fetched;
- each file is checked against the manifest: its size, and its CRC-32 when
  the manifest carries one (manifests written before checksums do not);
- ``stop`` is checked before every file: a stopping server aborts the
  download (:class:`Aborted`) instead of waiting for it;
- ``on_file(bytes)`` is told of every file downloaded (progress counters,
  the lease's renewal).

On any failure the files written in ``target_dir`` are removed.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

from common import errors
from common.kvsnapshot import Manifest, ManifestFile, check_file, read_manifest, run_all
from common.model import SnapshotHandle
from common.storage import RemoteStorage
from tablet.replication.throttle import Throttle


class Aborted(errors.KvLeaseError):
    """The download stopped because the server is stopping."""


def download(storage: RemoteStorage, handle: SnapshotHandle, target_dir: str, *, throttle: Throttle,
             stop: threading.Event, on_file: Callable[[int], None] = lambda n: None,
             io_threads: int = 8) -> Manifest:
    """Download the snapshot ``handle`` into ``target_dir`` (missing or empty) as a checkpoint directory;
    returns its manifest. Raises StorageNotFound, StorageError (also a wrong size or checksum),
    InvalidSnapshotError, Aborted; nothing stays in ``target_dir`` then."""
    manifest = read_manifest(storage, handle.metadata_path)
    os.makedirs(target_dir, exist_ok=True)
    if os.listdir(target_dir):
        raise errors.InvalidRequestError(f"download target {target_dir} is not empty")

    def fetch(f: ManifestFile) -> None:
        if stop.is_set() or not throttle.take(f.size):
            raise Aborted(f"the download of snapshot {manifest.snapshot_id} of {manifest.bucket} was stopped")
        final = os.path.join(target_dir, f.local_name)
        tmp = f"{final}.part"
        storage.download_file(f.path, tmp)
        check_file(storage, f, tmp)
        os.replace(tmp, final)
        on_file(f.size)

    try:
        run_all([lambda f=f: fetch(f) for f in manifest.files], io_threads)
    except BaseException:
        for name in os.listdir(target_dir):
            os.unlink(os.path.join(target_dir, name))
        raise
    return manifest

