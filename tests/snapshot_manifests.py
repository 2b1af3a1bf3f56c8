"""Test helper: a real ``_METADATA`` manifest on remote storage for a snapshot handle.

The coordinator accepts a ``CommitKvSnapshot`` only when the snapshot's
manifest exists at its path and agrees with the commit
(:mod:`coordinator.snapshot_checks`); tests that commit made-up snapshots
write one first.
"""

from __future__ import annotations

import posixpath

from common import config as cfg
from common.kvsnapshot import Manifest, ManifestFile, manifest_path
from common.model import SnapshotHandle, TableBucket
from common.storage import RemoteStorage, open_storage


def storage_of(config: cfg.Config) -> RemoteStorage:
    return open_storage(config[cfg.REMOTE_DATA_DIR], config)


def write_manifest(storage: RemoteStorage | cfg.Config, handle: SnapshotHandle) -> SnapshotHandle:
    """Write (or overwrite) the manifest the handle names; returns the handle."""
    if isinstance(storage, cfg.Config):
        storage = storage_of(storage)
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
