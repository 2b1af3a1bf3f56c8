"""A leased snapshot's files on remote storage, with the real coordinator on ZooKeeper.

:class:`kvlease.coordinator.controller.Controller` commits snapshots uploaded by
``tablet/store/snapshot.py`` (file:// and s3://): past retention, a leased snapshot
keeps every object until it is released, and then only its own go. The
upload helpers are shared from test_snapshot_upload.py.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from kvlease.common import kvsnapshot as ks
from kvlease.common.kvsnapshot import download, open_read_only
from kvlease.common.model import TableBucket
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column, TableSpec
from kvlease.common.zk import make_client
from kvlease.coordinator import requests as rq
from kvlease.coordinator.controller import Controller
from kvlease.coordinator.fencing import FencedWriter, bump_epoch
from kvlease.leases import state as ls
from kvlease.ops.wait import wait_until
from kvlease.tablet.store.snapshot import SnapshotUploader, upload_and_commit
from tests.tablet.store.test_snapshot_upload import Bucket


def call(controller: Controller, request):
    future: Future = Future()
    assert not controller.process([(request, future)])
    return future.result(timeout=0)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def coordinator(request, make_config):
    config = make_config() if request.param == "file" else make_config(request.getfixturevalue("s3_overrides"))
    storage = open_storage(config["remote.data.dir"], config)
    zk = make_client(config)
    ctrl = Controller(zk, storage, num_retained=2, max_lease_ms=86_400_000, grace_ms=30_000,
                      clock_ms=lambda: 1_000_000)
    _epoch, version = bump_epoch(zk)
    ctrl.reinitialize(FencedWriter(zk, version))
    yield ctrl, storage
    ctrl.close()
    zk.stop()
    zk.close()


def test_a_leased_snapshot_keeps_its_files_until_released(coordinator, tmp_path):
    ctrl, storage = coordinator
    spec = TableSpec("db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
    tb = TableBucket(call(ctrl, rq.CreateTable(spec)).table_id, 0)
    uploader = SnapshotUploader(storage, tb)

    def snapshot(sid):
        return upload_and_commit(uploader, lambda h: call(ctrl, rq.CommitSnapshot(h)),
                                 bucket.checkpoint(), sid, bucket.offset)

    def shared(handle):
        return {f.path for f in handle.files if "/shared/" in f.path}

    bucket = Bucket(tmp_path / "db")
    bucket.write(range(2000), prefix=b"a")  # SST A: kept by every snapshot
    bucket.write(range(2000), prefix=b"b")  # SST B: compacted away before snapshot 2
    h1 = snapshot(1)
    assert call(ctrl, ls.Acquire("L", {tb: 1}, 60_000)).unavailable == {}
    bucket.write(range(0, 2000, 10), version=1, prefix=b"b")
    bucket.db.compact_range(b"b", b"c")  # B + the update -> C
    h2 = snapshot(2)
    bucket.write(range(500), prefix=b"c")  # SST D
    h3 = snapshot(3)
    bucket.close()
    only_1 = shared(h1) - shared(h2) - shared(h3)
    in_all = shared(h1) & shared(h2) & shared(h3)
    assert len(only_1) == 1 and len(in_all) == 1  # B, and A
    assert uploader.last_stats.new_shared_files == 1  # snapshot 3 sent only D

    # past retention (2) but leased: snapshot 1 keeps every object
    assert ctrl.snapshots.has_snapshot(tb, 1)
    for path in h1.file_paths():
        assert storage.exists(path), path
    assert len(storage.read(h1.metadata_path)) > 0

    assert call(ctrl, ls.Release("L", frozenset({tb}))) == ls.ReleaseOutcome(released=True, lease_remains=False)
    assert not ctrl.snapshots.has_snapshot(tb, 1)
    wait_until(lambda: not storage.list(ks.snapshot_dir(tb, 1)) and not any(map(storage.exists, only_1)), 10.0,
               "snapshot 1's files deleted")
    # exactly the files of the kept snapshots remain, shared ones included
    assert set(storage.list(ks.bucket_dir(tb))) == h2.file_paths() | h3.file_paths()
    assert in_all <= set(storage.list(ks.shared_dir(tb)))
    target = tmp_path / "restored"
    download(storage, h3, str(target))
    db = open_read_only(str(target))
    try:
        assert dict(db.items()) == bucket.rows
    finally:
        db.close()
