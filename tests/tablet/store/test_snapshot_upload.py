"""Snapshot upload, manifest and download (``tablet/store/snapshot.py``) on file:// and s3://.

The ``file`` cases are tier 1 (tmp_path + FileStorage, no processes); the
``s3`` cases run against the local moto endpoint (the coordinator's cases, on
ZooKeeper: test_snapshot_leased.py).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import random
import time

import pytest
from rocksdict import Checkpoint, Options, Rdict, WriteBatch

from kvlease.common import errors
from kvlease.common.config import Config
from kvlease.common.storage import (MULTIPART_BYTES, FileStorage, RemoteStorage, StorageError, StorageExists,
                                    open_storage)
from kvlease.common.model import TableBucket
from kvlease.tablet.store import snapshot as sn
from kvlease.common import kvsnapshot as ks
from kvlease.common.kvsnapshot import download, open_read_only, read_manifest
from kvlease.tablet.store.snapshot import SnapshotUploader, upload_and_commit

TB = TableBucket(7, 3)
_CHECKPOINTS = itertools.count(1)


# --- helpers ------------------------------------------------------------------------------

def key(i: int, prefix: bytes = b"k") -> bytes:
    return prefix + b"%09d" % i


def value(i: int, version: int) -> bytes:
    """~60 bytes, half of them incompressible (like real rows, unlike b"x" * 60)."""
    return b"v%d-%09d-" % (version, i) + hashlib.blake2b(b"%d/%d" % (version, i), digest_size=32).digest()


class Bucket:
    """A RocksDB with the rows we expect it to hold."""

    def __init__(self, path) -> None:
        self.path = str(path)
        self.db = Rdict(self.path, Options(raw_mode=True))
        self.rows: dict[bytes, bytes] = {}
        self.offset = 0

    def write(self, ids, version: int = 0, prefix: bytes = b"k") -> None:
        batch = WriteBatch(raw_mode=True)
        for i in ids:
            k, v = key(i, prefix), value(i, version)
            batch.put(k, v)
            self.rows[k] = v
            self.offset += 1
        self.db.write(batch)
        self.db.flush()

    def checkpoint(self) -> str:
        target = f"{self.path}-cp{next(_CHECKPOINTS)}"
        Checkpoint(self.db).create_checkpoint(target)
        return target

    def close(self) -> None:
        self.db.close()


def ssts(checkpoint_dir: str) -> set[str]:
    return {n for n in os.listdir(checkpoint_dir) if n.endswith(".sst")}


def assert_handle_matches_storage(storage: RemoteStorage, handle, checkpoint_dir: str) -> None:
    """Every file of the checkpoint is in the handle, each remote object has its size."""
    manifest = read_manifest(storage, handle.metadata_path)
    assert manifest.to_handle() == handle
    assert {f.local_name for f in manifest.files} == set(os.listdir(checkpoint_dir))
    for f in manifest.files:
        assert os.path.getsize(os.path.join(checkpoint_dir, f.local_name)) == f.size
        assert len(storage.read(f.path)) == f.size
        if f.local_name.endswith(".sst"):
            assert f.path.startswith(ks.shared_dir(TB) + "/")
        else:  # in the upload's own directory, named by the leader epoch and a random token
            assert re.fullmatch(rf"{ks.snapshot_dir(TB, manifest.snapshot_id)}/e-?\d+-[0-9a-f]{{8}}/"
                                rf"{re.escape(f.local_name)}", f.path), f.path


class FailingStorage(RemoteStorage):
    """Delegates to a real storage; a write to a path containing ``fail_on`` raises."""

    def __init__(self, inner: RemoteStorage, fail_on: str = "") -> None:
        self.inner, self.uri, self.fail_on = inner, inner.uri, fail_on

    def _check(self, path):
        if self.fail_on and self.fail_on in path:
            raise StorageError(f"injected failure writing {path}")

    def read(self, path):
        return self.inner.read(path)

    def write_new(self, path, data):
        self._check(path)
        self.inner.write_new(path, data)

    def put(self, path, data):
        self._check(path)
        self.inner.put(path, data)

    def delete(self, path):
        self.inner.delete(path)

    def list(self, prefix):
        return self.inner.list(prefix)

    def list_sizes(self, prefix):
        return self.inner.list_sizes(prefix)

    def exists(self, path):
        return self.inner.exists(path)


@pytest.fixture(params=[pytest.param("file", marks=pytest.mark.unit), pytest.param("s3", marks=pytest.mark.s3)])
def storage(request, tmp_path) -> RemoteStorage:
    if request.param == "file":
        return FileStorage(f"file://{tmp_path}/remote", fsync=False)
    config = Config({**request.getfixturevalue("s3_overrides")}, env={})  # only the s3 case starts moto
    return open_storage(config["remote.data.dir"], config)


@pytest.fixture
def file_storage(tmp_path) -> FileStorage:
    return FileStorage(f"file://{tmp_path}/remote", fsync=False)


def two_snapshots(storage, tmp_path, rows=100_000, changed=0.01):
    """Snapshot 1 of ``rows`` rows; then change ``changed`` of them, flush, snapshot 2."""
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(rows))
    cp1 = bucket.checkpoint()
    uploader = SnapshotUploader(storage, TB, clock_ms=lambda: 42)
    h1 = uploader.upload(cp1, 1, bucket.offset)
    s1 = uploader.last_stats
    uploader.mark_committed(h1)
    shared1 = storage.list(ks.shared_dir(TB))
    bucket.write(random.Random(1).sample(range(rows), int(rows * changed)), version=1)
    cp2 = bucket.checkpoint()
    h2 = uploader.upload(cp2, 2, bucket.offset)
    bucket.close()
    return uploader, (cp1, h1, s1, shared1), (cp2, h2, uploader.last_stats), bucket.rows


# --- upload ---------------------------------------------------------------------------------

def test_second_snapshot_uploads_only_the_new_ssts(storage, tmp_path):
    _, (cp1, h1, s1, shared1), (cp2, h2, s2), _ = two_snapshots(storage, tmp_path)
    # snapshot 1: every SST, then the private files and the manifest
    assert s1.new_shared_files == len(ssts(cp1)) and s1.reused_shared_files == 0
    assert len(shared1) == len(ssts(cp1))
    assert s1.uploaded_files == len(os.listdir(cp1)) + 1
    assert_handle_matches_storage(storage, h1, cp1)
    assert h1.metadata_path == "kv/7/3/snap-1/_METADATA" and h1.log_offset == 100_000
    # snapshot 2: only the SST the flush made; the old ones are the very same objects
    new = ssts(cp2) - ssts(cp1)
    assert s2.new_shared_files == len(new) >= 1
    assert s2.reused_shared_files == len(ssts(cp1) & ssts(cp2))
    assert s2.uploaded_bytes < 0.05 * s1.uploaded_bytes, (s1, s2)
    shared2 = storage.list(ks.shared_dir(TB))
    assert set(shared1) < set(shared2) and len(shared2) == len(shared1) + len(new)
    by_name_1 = {f.local_name: f.path for f in read_manifest(storage, h1.metadata_path).files}
    by_name_2 = {f.local_name: f.path for f in read_manifest(storage, h2.metadata_path).files}
    assert all(by_name_2[n] == by_name_1[n] for n in ssts(cp1) & ssts(cp2))
    assert_handle_matches_storage(storage, h2, cp2)
    # the handle lists every remote file the snapshot uses: nothing else under snap-2/
    assert set(storage.list(ks.snapshot_dir(TB, 2))) == {p for p in h2.file_paths() if "/snap-2/" in p}


def test_download_restores_exactly_the_rows(storage, tmp_path):
    _, _, (_, h2, _), rows = two_snapshots(storage, tmp_path)
    target = tmp_path / "restored"
    manifest = download(storage, h2, str(target))
    assert manifest.snapshot_id == 2 and manifest.log_offset == 101_000
    db = open_read_only(str(target))
    try:
        assert dict(db.items()) == rows
    finally:
        db.close()
    # by manifest path too, and never into a non-empty directory
    assert download(storage, h2.metadata_path, str(tmp_path / "again")) == manifest
    with pytest.raises(errors.InvalidRequestError, match="not empty"):
        download(storage, h2, str(target))


@pytest.mark.parametrize("fail_on", ["/shared/", "/MANIFEST-", "/_METADATA"])
def test_a_failed_upload_leaves_no_private_files_and_no_manifest(storage, tmp_path, fail_on):
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(5000))
    bucket.write(range(5000, 6000))
    cp = bucket.checkpoint()
    bucket.close()
    uploader = SnapshotUploader(FailingStorage(storage, fail_on), TB)
    with pytest.raises(StorageError, match="injected"):
        uploader.upload(cp, 1, bucket.offset)
    assert storage.list(ks.snapshot_dir(TB, 1)) == []
    assert not storage.exists(ks.manifest_path(TB, 1))
    # the same id works once storage does; SSTs that made it up are reused, not sent again
    uploaded = len(storage.list(ks.shared_dir(TB)))
    uploader.storage.fail_on = ""
    handle = uploader.upload(cp, 1, bucket.offset)
    assert uploader.last_stats.reused_shared_files == uploaded
    assert uploader.last_stats.new_shared_files == len(ssts(cp)) - uploaded
    assert_handle_matches_storage(storage, handle, cp)


@pytest.mark.unit
def test_a_restarted_uploader_seeds_from_the_committed_manifest(file_storage, tmp_path):
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(20_000))
    h1 = SnapshotUploader(file_storage, TB).upload(bucket.checkpoint(), 1, bucket.offset)
    bucket.write(range(100), version=1)
    cp2 = bucket.checkpoint()
    bucket.close()
    base = read_manifest(file_storage, h1.metadata_path).to_handle()  # what a restarted server finds
    restarted = SnapshotUploader(file_storage, TB, base=base)
    restarted.upload(cp2, 2, bucket.offset)
    assert restarted.last_stats.new_shared_files == 1
    assert restarted.last_stats.reused_shared_files == len(ssts(cp2)) - 1


@pytest.mark.unit
def test_an_sst_no_committed_snapshot_uses_is_not_assumed_present(file_storage, tmp_path):
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(10_000))
    cp1 = bucket.checkpoint()
    bucket.write(range(100), version=1)
    cp2 = bucket.checkpoint()
    bucket.close()
    uploader = SnapshotUploader(file_storage, TB)
    h1 = uploader.upload(cp1, 1, 10_000)
    uploader.discard(h1)  # say the commit was refused: snapshot 1 was never committed
    file_storage.delete_many(file_storage.list(ks.shared_dir(TB)))  # and its SSTs were cleaned up
    h2 = uploader.upload(cp2, 2, 10_100)
    assert uploader.last_stats.reused_shared_files == 0
    assert uploader.last_stats.new_shared_files == len(ssts(cp2))
    assert all(file_storage.exists(p) for p in h2.file_paths())
    assert file_storage.list(ks.snapshot_dir(TB, 1)) == []


def test_committed_ssts_deleted_or_cut_short_behind_the_uploaders_back_are_uploaded_again(storage, tmp_path):
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(20_000))
    bucket.write(range(20_000, 30_000))
    cp1 = bucket.checkpoint()
    uploader = SnapshotUploader(storage, TB)
    uploader.mark_committed(uploader.upload(cp1, 1, bucket.offset))
    assert len(ssts(cp1)) == 2
    missing, short = storage.list(ks.shared_dir(TB))
    storage.delete(missing)
    storage.put(short, storage.read(short)[:-1])
    bucket.write(range(100), version=1)
    cp2 = bucket.checkpoint()
    bucket.close()
    h2 = uploader.upload(cp2, 2, bucket.offset)
    assert (uploader.last_stats.new_shared_files, uploader.last_stats.reused_shared_files) == (3, 0)
    assert not {missing, short} & h2.file_paths()  # under new names: the damaged objects are not reused
    assert_handle_matches_storage(storage, h2, cp2)


@pytest.mark.unit
def test_a_recreated_db_never_matches_the_old_ssts(file_storage, tmp_path):
    first = Bucket(tmp_path / "db")
    first.write(range(1000))
    uploader = SnapshotUploader(file_storage, TB)
    uploader.mark_committed(uploader.upload(first.checkpoint(), 1, 1000))
    first.close()
    Rdict.destroy(first.path)
    second = Bucket(tmp_path / "db")  # same path, same file numbers, other content
    second.write(range(1000), version=5)
    cp = second.checkpoint()
    second.close()
    old = {p.rsplit("/", 1)[-1].split("-")[0] for p in file_storage.list(ks.shared_dir(TB))}
    assert {n.removesuffix(".sst") for n in ssts(cp)} == old  # the names collide...
    uploader.upload(cp, 2, 2000)
    assert uploader.last_stats.reused_shared_files == 0  # ...the fingerprints do not


@pytest.mark.unit
def test_snapshot_ids_must_be_new(file_storage, tmp_path):
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(100))
    cp = bucket.checkpoint()
    bucket.close()
    file_storage.put(ks.manifest_path(TB, 1), b"someone else's")
    uploader = SnapshotUploader(file_storage, TB)
    with pytest.raises(StorageExists):
        uploader.upload(cp, 1, 100)
    assert file_storage.read(ks.manifest_path(TB, 1)) == b"someone else's"
    assert file_storage.list(ks.snapshot_dir(TB, 1)) == [ks.manifest_path(TB, 1)]
    uploader.mark_committed(uploader.upload(cp, 2, 100))
    with pytest.raises(errors.InvalidSnapshotError, match="not newer"):
        uploader.upload(cp, 2, 100)


@pytest.mark.unit
def test_upload_and_commit_discards_only_a_refused_snapshot(file_storage, tmp_path):
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(100))
    cp = bucket.checkpoint()
    bucket.close()
    uploader = SnapshotUploader(file_storage, TB)

    def refuse(handle):
        raise errors.InvalidSnapshotError("no")

    def lose(handle):
        raise errors.OutcomeUnknownError("timed out")

    with pytest.raises(errors.InvalidSnapshotError):
        upload_and_commit(uploader, refuse, cp, 1, 100)
    assert file_storage.list(ks.snapshot_dir(TB, 1)) == [] and uploader.base is None
    with pytest.raises(errors.OutcomeUnknownError):
        upload_and_commit(uploader, lose, cp, 2, 100)
    assert file_storage.exists(ks.manifest_path(TB, 2)) and uploader.base is None  # may be committed
    committed = []
    handle = upload_and_commit(uploader, committed.append, cp, 3, 100)
    assert committed == [handle] and uploader.base == handle


@pytest.mark.unit
def test_manifest_round_trip_and_bad_manifests():
    m = ks.Manifest(TableBucket(1, 2, partition_id=4), 9, 77,
                    (ks.ManifestFile("kv/1/p4/2/snap-9/CURRENT", "CURRENT", 16),), 5)
    assert ks.Manifest.from_bytes(m.to_bytes()) == m
    assert m.path == "kv/1/p4/2/snap-9/_METADATA"
    for bad in (b"{", b'{"version": 2}', m.to_bytes().replace(b'"CURRENT"', b'"../x"')):
        with pytest.raises(errors.InvalidSnapshotError):
            ks.Manifest.from_bytes(bad)
    assert sn.parse_shared(ks.shared_dir(TB) + "/" + sn.shared_name(("000012.sst", 345, 0xAB), 6)) == (
        "000012.sst", 345, 0xAB)
    assert sn.parse_shared("kv/7/3/snap-1/CURRENT") is None


# --- measurement -----------------------------------------------------------------------------

@pytest.mark.slow
def test_measure_one_percent_change_of_a_million_rows(file_storage, tmp_path):
    """``pytest tests/tablet/store/test_snapshot_upload.py -m slow -s`` prints the figures in docs/snapshots.md."""
    rows, rounds = 1_000_000, 10
    bucket = Bucket(tmp_path / "db")
    bucket.write(range(rows))
    uploader = SnapshotUploader(file_storage, TB)
    t0 = time.perf_counter()
    uploader.mark_committed(uploader.upload(bucket.checkpoint(), 1, bucket.offset))
    full, full_s = uploader.last_stats, time.perf_counter() - t0
    rng = random.Random(1)
    later = []
    for sid in range(2, 2 + rounds):
        bucket.write(rng.sample(range(rows), rows // 100), version=sid)
        t0 = time.perf_counter()
        uploader.mark_committed(uploader.upload(bucket.checkpoint(), sid, bucket.offset))
        later.append((uploader.last_stats, time.perf_counter() - t0))
    bucket.close()
    second, second_s = later[0]
    print(f"\nfull: {full.uploaded_bytes:,} B, {full.uploaded_files} objects, {full_s:.2f}s; "
          f"after 1%: {second.uploaded_bytes:,} B, {second.uploaded_files} objects "
          f"({second.new_shared_files} new SST of {second.new_shared_bytes:,} B, {second.reused_shared_files} "
          f"reused), {second_s:.2f}s; ratio {second.uploaded_bytes / full.uploaded_bytes:.4f}")
    for stats, secs in later:
        print(f"  snapshot {stats.snapshot_id}: {stats.uploaded_bytes:>12,} B uploaded "
              f"({stats.uploaded_bytes / full.uploaded_bytes:.3f} of full), {stats.new_shared_files} new SST, "
              f"{stats.reused_shared_files} reused, snapshot size {stats.bytes:,} B, {secs:.2f}s")
    total = sum(stats.uploaded_bytes for stats, _ in later)
    print(f"  {rounds} snapshots of 1% each: {total:,} B = {total / full.uploaded_bytes:.3f} x the full upload")
    assert second.uploaded_bytes < 0.05 * full.uploaded_bytes


@pytest.mark.s3
def test_big_files_go_up_and_down_in_parts_on_s3(s3_config, tmp_path):
    storage = open_storage(s3_config["remote.data.dir"], s3_config)
    big = tmp_path / "big.sst"
    data = os.urandom(MULTIPART_BYTES + 12345)
    big.write_bytes(data)
    storage.upload_file("kv/1/0/shared/big.sst", str(big))
    assert storage.read("kv/1/0/shared/big.sst") == data
    etag = storage.client.head_object(Bucket=storage.bucket, Key=storage._key("kv/1/0/shared/big.sst"))["ETag"]
    assert etag.endswith('-2"')  # a multipart upload of two parts
    storage.download_file("kv/1/0/shared/big.sst", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data
    with pytest.raises(errors.StorageError, match="does not exist"):
        storage.download_file("kv/1/0/shared/missing.sst", str(tmp_path / "missing"))
