"""The tablet's half of snapshot fencing: a leader's checkpoint is stamped with the epoch it was taken under,
a follower's is refused, a fenced commit deletes the upload, an upload whose leadership ends midway stops and
deletes what it wrote, and two uploads of one snapshot id never touch each other's files (tablet/store/snapshot.py,
tablet/bucket/reads.py). Real RocksDB and changelog in temp dirs, file:// remote storage; no processes."""

from __future__ import annotations

import os

import pytest

from kvlease.common import errors
from kvlease.common.kvsnapshot import shared_dir
from kvlease.common.storage import FileStorage
from kvlease.tablet.store.snapshot import SnapshotUploader, parse_shared, upload_and_commit, upload_of
from tests.tablet.bucket.test_bucket import bucket_dir, rows  # noqa: F401  (fixture)
from tests.tablet.bucket.test_bucket_replicated import open_store
from tests.tablet.store.test_snapshot_upload import TB, Bucket, file_storage  # noqa: F401  (fixture)

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


class LostReplies(FileStorage):
    """A write_new that finds its object taken answers a plain StorageError, not StorageExists: its reply was
    lost (a timeout, a reset connection) after the storage refused it."""

    def write_new(self, path, data):
        if self.exists(path):
            raise errors.StorageError(f"writing {path} timed out")
        super().write_new(path, data)


def test_a_second_upload_of_a_snapshot_id_deletes_nothing_of_the_first_even_when_its_replies_are_lost(tmp_path):
    """Two leaders' uploads of snapshot 2 (a deposed one's after the new one's): the later one claims the id
    first, finds it taken and writes nothing; a lost reply is settled by reading the manifest back, so no file
    of the committed snapshot is ever taken for its own and deleted (the old layout shared every private name
    and deleted what a failed write may have created)."""
    storage = LostReplies(f"file://{tmp_path}/remote", fsync=False)
    new, zombie = Bucket(tmp_path / "new"), Bucket(tmp_path / "zombie")
    try:
        for bucket in (new, zombie):
            bucket.write(range(300))
        committed = upload_and_commit(SnapshotUploader(storage, TB), lambda h: None, new.checkpoint(), 2, new.offset,
                                      leader_epoch=5)
        before = {p: storage.read(p) for p in storage.list(f"kv/{TB.table_id}")}
        assert before.keys() == committed.file_paths()
        late = SnapshotUploader(storage, TB)
        with pytest.raises(errors.StorageError, match="_METADATA timed out"):
            late.upload(zombie.checkpoint(), 2, zombie.offset, leader_epoch=4)
        assert {p: storage.read(p) for p in storage.list(f"kv/{TB.table_id}")} == before
    finally:
        new.close()
        zombie.close()


class ClaimReplyLost(FileStorage):
    """The manifest's write lands, its reply is lost."""

    def write_new(self, path, data):
        super().write_new(path, data)
        if path.endswith("/_METADATA"):
            raise errors.StorageError(f"writing {path} timed out")


def test_a_claim_whose_reply_was_lost_is_recognised_as_its_own(tmp_path):
    storage = ClaimReplyLost(f"file://{tmp_path}/remote", fsync=False)
    bucket = Bucket(tmp_path / "db")
    try:
        bucket.write(range(300))
        handle = upload_and_commit(SnapshotUploader(storage, TB), lambda h: None, bucket.checkpoint(), 1,
                                   bucket.offset, leader_epoch=2)
        assert set(storage.list(f"kv/{TB.table_id}")) == handle.file_paths()
    finally:
        bucket.close()


def test_an_upload_whose_leadership_ends_midway_stops_and_deletes_all_it_wrote(tmp_path, file_storage):  # noqa: F811
    bucket = Bucket(tmp_path / "db")
    try:
        bucket.write(range(200))
        uploader = SnapshotUploader(file_storage, TB, io_threads=1)
        first = upload_and_commit(uploader, lambda h: None, bucket.checkpoint(), 1, bucket.offset, leader_epoch=3)
        bucket.write(range(200, 400))
        bucket.write(range(400, 600))  # two SSTs snapshot 1 lacks
        checks = []

        def leads_for(calls):
            def check():
                checks.append(1)
                if len(checks) > calls:
                    raise errors.NotLeaderError("deposed")
            return check

        for snapshot_id, calls in ((2, 3), (3, 4), (4, None)):  # after the claim and a file, two files; all
            checks.clear()
            cp = bucket.checkpoint()
            if calls is None:  # one at the start, one before the claim, one per new file: only the commit's fails
                calls = 2 + 2 + sum(not f.endswith(".sst") and not f.startswith(("LOCK", "LOG")) for f in os.listdir(cp))
            with pytest.raises(errors.NotLeaderError, match="deposed"):
                upload_and_commit(uploader, lambda h: pytest.fail("committed"), cp, snapshot_id, bucket.offset,
                                  leader_epoch=3, check=leads_for(calls))
            assert (uploader.last_stats.snapshot_id == snapshot_id) == (snapshot_id == 4)  # uploaded whole: once
            assert set(file_storage.list(f"kv/{TB.table_id}")) == first.file_paths()  # the claim and files: gone
        assert uploader.base == first
        retried = upload_and_commit(uploader, lambda h: None, bucket.checkpoint(), 30, bucket.offset, leader_epoch=4)
        assert uploader.last_stats.new_shared_files == 2  # nothing a deposed upload left was taken as present
        assert all(file_storage.exists(p) for p in retried.file_paths())
    finally:
        bucket.close()


@pytest.mark.parametrize("name, origin", [
    ("kv/7/3/shared/000009-44830123-1a2b3c4d-s12-e4-0a1b2c3d.sst", (12, "e4-0a1b2c3d")),
    ("kv/7/3/snap-12/e-1-0a1b2c3d/CURRENT", (12, "e-1-0a1b2c3d")),
    ("kv/7/3/shared/000009-44830123-1a2b3c4d-s12.sst", None),  # named before uploads had tags
    ("kv/7/3/snap-12/CURRENT", None),
    ("kv/7/3/snap-12/_METADATA", None),
])
def test_the_upload_a_file_came_from(name, origin):
    assert upload_of(name) == origin
    if name.endswith(".sst"):
        assert parse_shared(name) == ("000009.sst", 44830123, 0x1a2b3c4d)
