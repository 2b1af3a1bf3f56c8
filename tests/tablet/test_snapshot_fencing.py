"""The tablet's half of snapshot fencing: a leader's checkpoint is stamped with the epoch it was taken under,
a follower's is refused, and a fenced commit deletes the upload (tablet/snapshot.py, tablet/bucket_reads.py).
Real RocksDB and changelog in temp dirs, file:// remote storage; no processes."""

from __future__ import annotations

import os

import pytest

from common import errors
from common.kvsnapshot import shared_dir
from tablet.snapshot import SnapshotUploader, upload_and_commit
from tests.tablet.test_bucket import bucket_dir, rows  # noqa: F401  (fixture)
from tests.tablet.test_bucket_replicated import open_store
from tests.tablet.test_snapshot_upload import TB, Bucket, file_storage  # noqa: F401  (fixture)

pytestmark = pytest.mark.unit


def test_a_leaders_checkpoint_carries_its_epoch_and_a_followers_is_refused(bucket_dir):  # noqa: F811
    with open_store(bucket_dir) as store:
        store.become_leader(4)
        store.write(rows((1, "a", 1.0)))
        store.advance_high_watermark(1)
        assert store.leader_checkpoint(os.path.join(bucket_dir, "cp1")) == (1, 4)
        store.become_follower(5)  # deposed: its data may be a history the new leader does not have
        with pytest.raises(errors.NotLeaderError, match="follows"):
            store.leader_checkpoint(os.path.join(bucket_dir, "cp2"))
        assert not os.path.exists(os.path.join(bucket_dir, "cp2"))
        assert store.checkpoint(os.path.join(bucket_dir, "cp3")) == 1  # a plain checkpoint does not care


def test_a_fenced_commit_deletes_what_only_its_upload_put_there(tmp_path, file_storage):  # noqa: F811
    bucket = Bucket(tmp_path / "db")
    try:
        bucket.write(range(200))
        uploader = SnapshotUploader(file_storage, TB)
        first = upload_and_commit(uploader, lambda h: None, bucket.checkpoint(), 1, bucket.offset)
        bucket.write(range(200, 400))  # a new SST: uploaded by snapshot 2 alone
        before = set(file_storage.list(shared_dir(TB)))

        def fenced(_handle):
            raise errors.FencedLeaderEpochError("taken under leader epoch 3, before the data loss at leader epoch 4")

        with pytest.raises(errors.FencedLeaderEpochError):
            upload_and_commit(uploader, fenced, bucket.checkpoint(), 2, bucket.offset)
        assert uploader.last_stats.new_shared_files >= 1 and uploader.last_stats.reused_shared_files >= 1
        remaining = set(file_storage.list(f"kv/{TB.table_id}/{TB.bucket}"))
        assert not any("/snap-2/" in p for p in remaining)  # private files and manifest
        assert set(file_storage.list(shared_dir(TB))) == before  # its new SST went, snapshot 1's stayed
        assert all(file_storage.exists(p) for p in first.file_paths())
        assert uploader.base == first
        retried = upload_and_commit(uploader, lambda h: None, bucket.checkpoint(), 3, bucket.offset)
        assert all(file_storage.exists(p) for p in retried.file_paths())  # nothing it reused was deleted
    finally:
        bucket.close()
