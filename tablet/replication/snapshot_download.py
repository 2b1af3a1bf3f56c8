"""Downloading a remote snapshot for a replica rebuild: bounded in bandwidth, checked, abortable.

``common.kvsnapshot.download`` (each file to a temp name, renamed once
checked), with what a tablet server's rebuild needs on top:

- the bytes of each file are taken from the server's :class:`~kvlease.tablet.replication.throttle.Throttle`
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

import threading
from typing import Callable

from kvlease.common import errors, kvsnapshot
from kvlease.common.kvsnapshot import Manifest, ManifestFile
from kvlease.common.model import SnapshotHandle
from kvlease.common.storage import RemoteStorage
from kvlease.tablet.replication.throttle import Throttle


class Aborted(errors.KvLeaseError):
    """The download stopped because the server is stopping."""


def download(storage: RemoteStorage, handle: SnapshotHandle, target_dir: str, *, throttle: Throttle,
             stop: threading.Event, on_file: Callable[[int], None] = lambda n: None,
             io_threads: int = 8, durable: bool = True) -> Manifest:
    """Download the snapshot ``handle`` into ``target_dir`` (missing or empty) as a checkpoint directory;
    returns its manifest. Raises StorageNotFound, StorageError (also a wrong size or checksum),
    InvalidSnapshotError, Aborted; nothing stays in ``target_dir`` then. ``durable``: each file is fsynced as
    soon as it is checked, by its I/O thread (the flush of one file overlaps the download of the others)."""
    def before_file(manifest: Manifest, f: ManifestFile) -> None:
        if stop.is_set() or not throttle.take(f.size):
            raise Aborted(f"the download of snapshot {manifest.snapshot_id} of {manifest.bucket} was stopped")

    return kvsnapshot.download(storage, handle, target_dir, io_threads=io_threads, before_file=before_file,
                               on_file=on_file, durable=durable)
