"""Pure and single-process pieces of the replica rebuild: the bandwidth throttle (a fake clock), the manifest's
checksums and writers (old manifests still load), damage detection on real RocksDB and changelog files, the
writer seed carried through an install."""

from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace

import pytest

from kvlease.common import errors
from kvlease.common.checksum import file_crc32
from kvlease.common.kvsnapshot import Manifest, ManifestFile, check_file
from kvlease.common.logentry import CorruptLogError
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
from kvlease.common.storage import open_storage
from kvlease.tablet.bucket import damage as bucket_damage
from kvlease.tablet.log import writer_sequences
from kvlease.tablet.log.sequences import WriterBatch
from kvlease.tablet.replication.rebuild import Rebuilder
from kvlease.tablet.replication.throttle import Throttle
from kvlease.tablet.store.kvstore import BucketInUseError, BucketStoreError, KvStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_gives_a_second_s_worth_at_once_then_the_rate():
    clock, stop = FakeClock(), threading.Event()
    throttle = Throttle(1000, stop, clock=clock)
    assert throttle.delay(600) == 0.0
    assert throttle.delay(600) == pytest.approx(0.2)  # 400 left: 200 more bytes at 1000/s
    clock.now += 0.2
    assert throttle.delay(600) == 0.0
    clock.now += 10  # the bucket holds one second's worth at most
    assert throttle.delay(1000) == 0.0
    assert throttle.delay(1) == pytest.approx(0.001)


def test_a_file_bigger_than_the_bucket_waits_for_a_full_one_and_its_debt_bounds_the_next():
    clock, stop = FakeClock(), threading.Event()
    throttle = Throttle(1000, stop, clock=clock)
    assert throttle.delay(5000) == 0.0  # full bucket: taken, 4000 in debt
    assert throttle.delay(1) == pytest.approx(4.001)
    clock.now += 4.001
    assert throttle.delay(1) == 0.0


def test_unlimited_and_a_stop_end_the_wait():
    stop = threading.Event()
    assert Throttle(0, stop).take(10**12)
    slow = Throttle(1, stop)
    slow.delay(1)
    stop.set()
    assert slow.take(10**6) is False  # returns at once: the server stops
    with pytest.raises(ValueError):
        Throttle(-1, stop)


def manifest(**extra) -> Manifest:
    files = (ManifestFile("kv/1/0/snap-2/CURRENT", "CURRENT", 16, **extra),)
    return Manifest(TableBucket(1, 0), 2, 30, files, 1234, ((7, 0, 0, 3, 4, 99),) if extra else ())


def test_new_manifests_carry_checksums_and_writers_and_old_ones_still_load():
    new = manifest(crc32=0xDEADBEEF)
    assert Manifest.from_bytes(new.to_bytes()) == new
    old_doc = json.loads(new.to_bytes())
    del old_doc["writers"], old_doc["files"][0]["crc32"]
    old = Manifest.from_bytes(json.dumps(old_doc).encode())
    assert old.files[0].crc32 is None and old.writers == ()
    assert "crc32" not in json.loads(manifest().to_bytes())["files"][0]  # none given: none written
    bad = {**old_doc, "writers": [[1, 2]]}
    with pytest.raises(errors.InvalidSnapshotError):
        Manifest.from_bytes(json.dumps(bad).encode())


def test_a_downloaded_file_is_checked_by_size_and_by_checksum_when_the_manifest_has_one(tmp_path):
    storage = open_storage(f"file://{tmp_path}/remote")
    local = tmp_path / "CURRENT"
    local.write_bytes(b"MANIFEST-000005\n")
    good = file_crc32(str(local))
    check_file(storage, ManifestFile("p", "CURRENT", 16, good), str(local))
    check_file(storage, ManifestFile("p", "CURRENT", 16), str(local))  # an old manifest: size only
    with pytest.raises(errors.StorageError, match="CRC-32"):
        check_file(storage, ManifestFile("p", "CURRENT", 16, good ^ 1), str(local))
    with pytest.raises(errors.StorageError, match="17"):
        check_file(storage, ManifestFile("p", "CURRENT", 17, good), str(local))


def test_a_durable_download_fsyncs_each_file_before_its_rename_and_the_directory_last(tmp_path, monkeypatch):
    """A rebuild's download (``durable``) leaves nothing for the install to flush: each file is synced by its
    I/O thread under its temp name, the directory once all are in place; a plain download syncs nothing."""
    from kvlease.common import kvsnapshot
    from tests.support.snapshot_manifests import snapshot

    storage = open_storage(f"file://{tmp_path}/remote")
    tb = TableBucket(5, 0)
    files = [SnapshotFile(f"kv/5/0/shared/{n:06d}.sst", 100 + n) for n in range(3)]
    handle = snapshot(storage, tb, 1, 10, files)
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    kvsnapshot.download(storage, handle, str(tmp_path / "plain"))
    assert synced == []
    kvsnapshot.download(storage, handle, str(tmp_path / "durable"), durable=True)
    target = str(tmp_path / "durable")
    assert sorted(synced[:-1]) == [f"{target}/{n:06d}.sst.part" for n in range(3)]
    assert synced[-1] == target
    assert sorted(os.listdir(target)) == [f"{n:06d}.sst" for n in range(3)]


def open_error(path: str) -> BaseException:
    try:
        KvStore(path).close()
    except errors.KvLeaseError as exc:
        return exc
    raise AssertionError(f"{path} opened")


def test_damage_is_corruption_a_reopen_cannot_cure_not_a_passing_failure(tmp_path):
    path = str(tmp_path / "kv")
    kv = KvStore(path)
    kv.close()
    with open(os.path.join(path, "CURRENT"), "w") as fh:
        fh.write("garbage\n")
    assert bucket_damage.is_damage(open_error(path))
    assert not bucket_damage.is_damage(errors.KvLeaseError("cannot open RocksDB x: IO error: No space left"))
    assert not bucket_damage.is_damage(None)
    assert bucket_damage.is_damage(BucketStoreError("applied past the end", dir="d", applied=9, end_offset=3))
    assert bucket_damage.is_damage(CorruptLogError("changelog x: CRC mismatch"))


def test_damaged_files_are_moved_aside_replacing_an_earlier_damage(tmp_path):
    bucket = tmp_path / "b"
    for round_ in (1, 2):
        (bucket / "kv").mkdir(parents=True)
        (bucket / "kv" / "CURRENT").write_text(f"round {round_}")
        (bucket / "leader-epochs.json").write_text("{}")
        target = bucket_damage.move_aside(str(bucket), "test")
        assert (bucket / "damaged" / "kv" / "CURRENT").read_text() == f"round {round_}"
        assert not (bucket / "kv").exists() and target == str(bucket / "damaged")
    assert bucket_damage.move_aside(str(bucket), "nothing there") is None


def test_the_writer_seed_round_trips_and_an_empty_one_removes_the_file(tmp_path):
    batches = [(7, 3, 3, 20, 24, 5), (7, 1, 2, 10, 14, 4)]
    writer_sequences.save_seed(str(tmp_path), batches, fsync=False)
    assert writer_sequences.load_seed(str(tmp_path)) == (WriterBatch(7, 1, 2, 10, 14, 4), WriterBatch(7, 3, 3, 20, 24, 5))
    writer_sequences.save_seed(str(tmp_path), [], fsync=False)
    assert writer_sequences.load_seed(str(tmp_path)) == ()


class _InUseStore:
    """A replica's store whose files are in use for the first ``busy`` installs."""

    def __init__(self, busy: int) -> None:
        self.busy, self.installs = busy, []

    def install_snapshot(self, target, log_offset, writers, synced=False) -> None:
        self.installs.append(log_offset)
        if len(self.installs) <= self.busy:
            raise BucketInUseError("bucket /x is in use: its files cannot be replaced now")


class _Replica:
    def __init__(self, store) -> None:
        self.store, self.closed, self.leads = store, False, False
        self.fetch_lock = threading.Lock()
        self.tb = TableBucket(1, 0)
        self.table = type("T", (), {"table_id": 1})()


def _rebuilder(clock) -> Rebuilder:
    return Rebuilder(storage=None, admin=None, stop=threading.Event(), monotonic=clock)


def _manifest_at(log_offset: int) -> Manifest:
    return Manifest(TableBucket(1, 0), 1, log_offset, (), 0, ())


def test_an_install_waits_while_the_replicas_files_are_in_use_then_installs_that_snapshot():
    clock = FakeClock()
    store = _InUseStore(busy=2)
    assert _rebuilder(clock)._install_when_free(_Replica(store), "/download", _manifest_at(100)) is True
    assert store.installs == [100, 100, 100]


def test_files_that_stay_in_use_end_the_wait_with_bucket_in_use():
    clock = FakeClock()
    store = _InUseStore(busy=10**6)
    rebuilder = _rebuilder(clock)
    rebuilder._stop.wait = lambda s: (setattr(clock, "now", clock.now + 1.0), False)[1]  # 1 s a retry
    with pytest.raises(BucketInUseError):
        rebuilder._install_when_free(_Replica(store), "/download", _manifest_at(100))
    assert 5 <= len(store.installs) <= 7  # INSTALL_WAIT_S (5 s) of retries


def test_a_replica_in_use_is_rebuilt_later_from_the_oldest_snapshot_never_from_a_newer_one(monkeypatch):
    """Its files in use say nothing against the snapshot: skipping to a newer one would start its changelog
    later than its leader's, and the older snapshots (leased, perhaps) could not be read with its log."""
    rebuilder = _rebuilder(FakeClock())
    older = SnapshotHandle(TableBucket(1, 0), 3, 100, "m3")
    newer = SnapshotHandle(TableBucket(1, 0), 5, 300, "m5")
    monkeypatch.setattr(rebuilder, "_kept", lambda table_id, refresh: [SimpleNamespace(handle=newer),
                                                                        SimpleNamespace(handle=older)])
    tried = []

    def install(replica, handle, why):
        tried.append(handle.snapshot_id)
        raise BucketInUseError("bucket /x is in use: its files cannot be replaced now")

    monkeypatch.setattr(rebuilder, "_install", install)
    assert rebuilder.rebuild(_Replica(_InUseStore(0)), 0, "fresh") is None
    assert tried == [3]


def test_a_rebuild_queued_when_the_fetchers_stop_is_dropped_and_queued_again_after_a_resume(monkeypatch):
    """A follower's rebuild queued, not begun, when its fetchers stopped: busy for ever, its fetches skipped, it
    never rejoined the ISR after the resume."""
    rebuilder = _rebuilder(FakeClock())
    replica = _Replica(_InUseStore(0))
    rebuilt = threading.Event()
    monkeypatch.setattr(rebuilder, "rebuild", lambda r, log_start, why: rebuilt.set() or 0)
    with rebuilder._cond:  # queued, not begun: as due() leaves it when the fetchers stop before its thread runs
        rebuilder._busy.add(id(replica))
        rebuilder._due[id(replica)] = (replica, (0, "fresh"))
    rebuilder._stop.set()  # the fetchers stop
    rebuilder.stop()
    assert not rebuilder.busy(replica)
    rebuilder._stop.clear()  # resumed: the fetcher finds it fresh and asks again
    rebuilder.due(replica, 0, "fresh")
    assert rebuilt.wait(5)
    rebuilder._stop.set()
    rebuilder.stop()


def test_the_leases_of_installed_snapshots_are_released_after_the_hand_back_and_a_failure_ends_nothing():
    """An installed snapshot's lease is released by the worker thread after the bucket is back with its fetcher
    (a coordinator call off the rebuild's path); a release that fails (the server stops) must not end that thread."""
    rebuilder = _rebuilder(FakeClock())
    released = []

    class Lease:
        def __init__(self, id_, fail):
            self.id, self.fail = id_, fail

        def release(self):
            released.append(self.id)
            if self.fail:
                raise RuntimeError("channel closed")

    rebuilder._held.extend([Lease("a", False), Lease("b", True), Lease("c", False)])
    rebuilder.release_held()
    assert sorted(released) == ["a", "b", "c"] and rebuilder._held == []
