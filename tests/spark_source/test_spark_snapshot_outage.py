"""A split's snapshot read (spark_source/bootstrap.py ``open_snapshot``) over a remote-storage outage: a
download that fails on the storage (the ``file://`` remote's directory taken away, as the remote-outage drill
does) is tried again within the client's retry budget; a missing file is not retried. Real RocksDB, real
file storage."""

from __future__ import annotations

import os
import threading

import pytest

from kvlease.client.transport import RetryPolicy
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.storage import FileStorage
from kvlease.spark_source.bootstrap import SnapshotGoneError, open_snapshot
from kvlease.tablet.store.snapshot import SnapshotUploader
from tests.tablet.store.test_snapshot_upload import Bucket

pytestmark = pytest.mark.unit

TB = TableBucket(7, 3)


@pytest.fixture
def snapshot(tmp_path):
    """(storage, its root dir, the uploaded snapshot's rows): 500 rows as snapshot 1 at log offset 500."""
    root = tmp_path / "remote"
    storage = FileStorage(f"file://{root}", fsync=False)
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(500))
    SnapshotUploader(storage, TB).upload(bucket.checkpoint(), 1, bucket.offset)
    bucket.close()
    return storage, root, bucket.rows


def values_of(chunks) -> set[bytes]:
    return {value for chunk in chunks for value in chunk}


def test_a_download_during_an_outage_is_tried_again_until_the_storage_is_back(snapshot):
    storage, root, rows = snapshot
    away = root.with_name("remote-away")
    os.rename(root, away)
    root.write_text("not a directory")  # what the remote-outage drill leaves: reads fail with ENOTDIR

    def back() -> None:
        root.unlink()
        os.rename(away, root)
    timer = threading.Timer(0.5, back)
    timer.start()
    try:
        with open_snapshot(storage, TB, 1, what="split 0", retry=RetryPolicy(total_s=10)) as (log_offset, chunks):
            assert log_offset == 500
            assert values_of(chunks) == set(rows.values())
    finally:
        timer.join()


def test_without_a_retry_budget_the_outage_fails_the_read(snapshot):
    storage, root, _rows = snapshot
    os.rename(root, root.with_name("remote-away"))
    root.write_text("not a directory")
    with pytest.raises(errors.StorageError):
        with open_snapshot(storage, TB, 1, what="split 0"):
            pass


def test_a_missing_snapshot_is_not_retried(snapshot):
    storage, _root, _rows = snapshot
    retry = RetryPolicy(total_s=30, sleep=lambda s: pytest.fail("a missing snapshot was retried"))
    with pytest.raises(SnapshotGoneError, match="snapshot 2 is gone"):
        with open_snapshot(storage, TB, 2, what="split 0", retry=retry):
            pass
