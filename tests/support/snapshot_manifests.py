"""Test helper: a real ``_METADATA`` manifest on remote storage for a snapshot handle.

The coordinator accepts a ``CommitKvSnapshot`` only when the snapshot's
manifest exists at its path and agrees with the commit, and every file it
names exists with its size (:mod:`kvlease.coordinator.snapshot_checks`); tests that
commit made-up snapshots write them first.
"""

from __future__ import annotations

import posixpath

from kvlease.common import config as cfg
from kvlease.common.kvsnapshot import Manifest, ManifestFile, bucket_dir, manifest_path
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.storage import RemoteStorage, open_storage


def storage_of(config: cfg.Config) -> RemoteStorage:
    return open_storage(config[cfg.REMOTE_DATA_DIR], config)


def write_manifest(storage: RemoteStorage | cfg.Config, handle: SnapshotHandle) -> SnapshotHandle:
    """Write (or overwrite) the manifest the handle names, and each of its files under its bucket's own
    directory that is not there with its size yet (zero bytes of that size); returns the handle."""
    if isinstance(storage, cfg.Config):
        storage = storage_of(storage)
    inside = f"{bucket_dir(handle.bucket)}/"
    ours = [f for f in handle.files if f.path.startswith(inside) and "/../" not in f.path]
    listed = {}
    for directory in {f.path.rsplit("/", 1)[0] for f in ours}:
        listed.update(storage.list_sizes(directory))
    for f in ours:
        if listed.get(f.path) != f.size:
            storage.put(f.path, bytes(f.size))
    files = tuple(ManifestFile(f.path, posixpath.basename(f.path), f.size) for f in handle.files)
    manifest = Manifest(handle.bucket, handle.snapshot_id, handle.log_offset, files, 0)
    storage.put(handle.metadata_path or manifest.path, manifest.to_bytes())
    return handle


def snapshot(storage: RemoteStorage | cfg.Config, tb: TableBucket, snapshot_id: int, log_offset: int,
             files=()) -> SnapshotHandle:
    """A handle at the snapshot's own manifest path, its manifest written."""
    return write_manifest(storage, SnapshotHandle(tb, snapshot_id, log_offset, manifest_path(tb, snapshot_id),
                                                  tuple(files)))


def commit_snapshot(client, tb: TableBucket, snapshot_id: int, log_offset: int, files=()) -> SnapshotHandle:
    """Write the manifest on the cluster's remote storage (as its coordinator names it), then commit."""
    handle = snapshot(client.coordinator_info().remote_storage(), tb, snapshot_id, log_offset, files)
    client.commit_kv_snapshot(handle)
    return handle
