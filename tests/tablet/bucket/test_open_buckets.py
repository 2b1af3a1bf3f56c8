"""Buckets whose files are open only while needed: an LRU of open buckets per tablet server bounds the
file descriptors, idle buckets are parked and reopened on demand, transparently for every operation;
an operation in progress or an open snapshot (a live scan) pins its bucket. Real RocksDB and changelogs."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvlease.tablet.bucket.open_buckets import OpenBuckets
from kvlease.tablet.bucket.store import BucketStore
from kvlease.tablet.store.kvstore import FDS_PER_OPEN_BUCKET
from tests.tablet.bucket.test_bucket import TABLE, bucket_dir, fold, keys, kv_rows, log_records, rows, state  # noqa: F401
from tests.support.paths import REPO

pytestmark = pytest.mark.unit


def open_fds(under: str) -> int:
    """This process's open fds on files below ``under`` (not all its fds: other tests' background threads
    open and close their own meanwhile)."""
    root = os.path.realpath(under) + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        count += (target + os.sep).startswith(root)
    return count


class Buckets:
    """``n`` lazily opened bucket stores sharing one OpenBuckets budget."""

    def __init__(self, base_dir: str, n: int, capacity: int) -> None:
        self.budget = OpenBuckets(capacity)
        self.stores = [BucketStore.open(os.path.join(base_dir, str(i)), TABLE, segment_bytes=1 << 20, fsync=False,
                                        budget=self.budget, lazy=True) for i in range(n)]

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def buckets(bucket_dir: str):
    made: list[Buckets] = []

    def make(n: int, capacity: int) -> Buckets:
        made.append(Buckets(bucket_dir, n, capacity))
        return made[-1]

    yield make
    for b in made:
        b.close()


def test_more_buckets_than_the_cap_keep_fds_bounded_and_every_bucket_serves(buckets, bucket_dir):
    b = buckets(40, capacity=4)
    assert open_fds(bucket_dir) == 0  # a lazily opened bucket holds no file yet
    for i, store in enumerate(b.stores):
        store.write(rows((i, f"v{i}", float(i)), (1000 + i, "x", None)))
        assert len(b.budget) <= 4
        assert 0 < open_fds(bucket_dir) <= 4 * FDS_PER_OPEN_BUCKET
    for i, store in enumerate(b.stores):  # every bucket reopens for its lookup
        found, got = store.lookup(keys(i, 1000 + i, 5000))
        assert found.tolist() == [True, True, False]
        assert got.to_pylist()[0] == {"id": i, "name": f"v{i}", "score": float(i)}
        assert 0 < open_fds(bucket_dir) <= 4 * FDS_PER_OPEN_BUCKET
    assert len(b.budget) <= 4


def test_the_offsets_of_a_parked_bucket_are_known_without_opening_it(buckets):
    b = buckets(3, capacity=1)
    first = b.stores[0]
    first.write(rows((1, "a", 1.0), (2, "b", 2.0)))
    b.stores[1].write(rows((1, "a", 1.0)))
    assert not first.is_open  # parked: least recently used
    assert (first.log_end_offset, first.applied_offset, first.list_offsets()) == (2, 2, (0, 2))
    assert not first.is_open and len(b.budget) == 1


def test_a_parked_bucket_reopens_for_every_operation(buckets, bucket_dir):
    b = buckets(2, capacity=1)
    store, other = b.stores

    def park() -> None:
        other.lookup(keys(1))  # the other bucket opens: this one is the least recently used
        assert not store.is_open

    store.write(rows((1, "a", 1.0), (2, "b", 2.0)))
    park()
    assert store.write(rows((1, "A", 1.5)), keys(2)) == (2, 5)  # -U +U -D
    park()
    assert store.lookup(keys(1, 2))[0].tolist() == [True, False]
    park()
    assert [e.base_offset for e in store.read_log(0, 1 << 20)] == [0, 2]
    park()
    entries, end = store.fetch_log(2, 1 << 20)
    assert len(entries) == 1 and end == 5
    park()
    assert store.offset_for_timestamp(0) == 0
    park()
    assert [s.base_offset for s in store.log_segments()] == [0]
    park()
    assert state(store) == {1: (1, "A", 1.5)}  # snapshot + iter_rows
    park()
    target = os.path.join(bucket_dir, "checkpoint")
    assert store.checkpoint(target) == 5
    park()
    assert store.truncate_log_before(5) == 0  # one segment: the active one is never deleted
    park()
    assert fold(log_records(store)) == kv_rows(store)


def test_an_open_snapshot_pins_its_bucket_and_a_closed_one_frees_it(buckets):
    b = buckets(6, capacity=2)
    scanned = b.stores[0]
    scanned.write(rows(*[(i, f"v{i}", None) for i in range(100)]))
    snapshot = scanned.snapshot()
    rows_seen = scanned.iter_rows(snapshot)
    first = [next(rows_seen) for _ in range(10)]
    for store in b.stores[1:]:  # the others come and go around the pinned one
        store.write(rows((1, "x", None)))
    assert scanned.is_open
    assert len(first) + len(list(rows_seen)) == 100  # the scan reads on, undisturbed
    snapshot.close()
    for store in b.stores[1:3]:
        store.lookup(keys(1))
    assert not scanned.is_open and len(b.budget) <= 2


def test_concurrent_writers_on_more_buckets_than_the_cap_lose_nothing(buckets):
    b = buckets(12, capacity=3)
    expected: list[dict[int, str]] = [{} for _ in b.stores]
    locks = [threading.Lock() for _ in b.stores]
    failures: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for step in range(60):
                i = rng.randrange(len(b.stores))
                ids = rng.sample(range(50), 5)
                with locks[i]:  # this bucket's expected state follows its writes in order
                    b.stores[i].write(rows(*[(k, f"{seed}-{step}", None) for k in ids]))
                    expected[i].update({k: f"{seed}-{step}" for k in ids})
                if step % 7 == 0:
                    b.stores[rng.randrange(len(b.stores))].lookup(keys(*range(50)))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    for store, want in zip(b.stores, expected):
        assert {k: v[1] for k, v in state(store).items()} == want
        assert fold(log_records(store)) == kv_rows(store)
    assert len(b.budget) <= 3


def test_a_closed_bucket_leaves_the_budget_and_stays_closed(buckets):
    b = buckets(2, capacity=2)
    store = b.stores[0]
    store.write(rows((1, "a", 1.0)))
    assert len(b.budget) == 1
    store.close()
    assert len(b.budget) == 0 and not store.is_open
    with pytest.raises(Exception, match="closed"):
        store.lookup(keys(1))


def test_a_failed_bucket_is_not_reopened_under_an_open_snapshot(bucket_dir, monkeypatch):
    from kvlease.tablet.bucket.files import Backoff

    now = [100.0]
    store = BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=True, backoff=Backoff(1.0, 1.0),
                             monotonic=lambda: now[0])
    try:
        store.write(rows(*[(i, "a", None) for i in range(50)]))
        snapshot = store.snapshot()
        real_writev = os.writev

        def disk_full(fd, buffers):
            monkeypatch.setattr(os, "writev", real_writev)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "writev", disk_full)
        with pytest.raises(Exception, match="No space left"):
            store.write(rows((100, "b", None)))
        now[0] += 5
        assert not store.files.repair()  # the snapshot keeps the failed files open...
        with pytest.raises(Exception, match="failed earlier"):
            store.write(rows((100, "b", None)))
        assert len(list(store.iter_rows(snapshot))) == 50  # ...and readable
        snapshot.close()
        assert store.write(rows((100, "b", None))) == (50, 51)  # reopened on this use
        assert fold(log_records(store)) == kv_rows(store)
    finally:
        store.close()


def test_the_automatic_open_bucket_capacity_leaves_a_quarter_of_the_fd_limit():
    from kvlease.tablet.bucket.open_buckets import AUTO_MAX_OPEN, open_capacity

    assert open_capacity(7, limit=20_000) == 7  # configured
    assert open_capacity(0, limit=20_000) == 15_000 // FDS_PER_OPEN_BUCKET  # worst case 75% of the fds
    assert open_capacity(0, limit=1024) == 768 // FDS_PER_OPEN_BUCKET
    assert open_capacity(0, limit=1 << 20) == AUTO_MAX_OPEN
    assert open_capacity(0, limit=16) == 1


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
def test_a_server_process_raises_its_soft_open_file_limit_to_the_hard_one():
    code = ("import resource; from common.process import raise_open_file_limit; "
            "print(raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run(["prlimit", "--nofile=256:2048", "--", sys.executable, "-c", code], capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.stdout.split() == ["2048", "2048", "2048"]
