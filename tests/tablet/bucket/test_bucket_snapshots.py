"""BucketStore snapshots and checkpoints: a consistent view with its log offset, read while writes go on.

Split from test_bucket.py (its fixtures and helpers are shared from there).
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time

import pytest
from rocksdict import AccessType, Options, Rdict

from kvlease.common.errors import InvalidRequestError
from kvlease.tablet.bucket.store import BucketStoreError, checkpoint_log_offset
from kvlease.tablet.scan import batch as scan_batch
from tests.tablet.bucket.test_bucket import (  # noqa: F401 - the fixtures bucket_dir and store, and shared helpers
    bucket_dir, fold, keys, kv_rows, log_records, rows, state, store)

pytestmark = pytest.mark.unit


# --- snapshots ---------------------------------------------------------------------------------

def test_snapshot_is_consistent_and_carries_the_log_offset(store):
    store.write(rows(*[(i, f"n{i}", float(i)) for i in range(10)]))
    snapshot = store.snapshot()
    assert snapshot.log_offset == store.log_end_offset == 10
    expected = kv_rows(store)
    store.write(rows((3, "changed", 0.0), (100, "new", 0.0)), keys(0, 5))
    store._kv.flush_rows()  # also after a flush
    assert dict(store.iter_rows(snapshot)) == expected
    # key ranges: from_key inclusive, upper exclusive, resume with key + b"\0"
    ordered = sorted(expected)
    assert [k for k, _ in store.iter_rows(snapshot, from_key=ordered[2], upper=ordered[5])] == ordered[2:5]
    assert [k for k, _ in store.iter_rows(snapshot, from_key=ordered[8] + b"\x00")] == ordered[9:]
    assert list(store.iter_rows(snapshot, from_key=b"\xff" * 9)) == []
    snapshot.close()
    with pytest.raises(BucketStoreError, match="closed"):
        list(store.iter_rows(snapshot))


def assert_values_read_are(store, snapshot, start, budget, rows: dict[bytes, bytes]) -> None:
    """A ValueReader on ``snapshot``'s values iterator, from ``start`` to the end, reads ``rows``
    (key -> value, in key order): their values, and each batch's last key is the key of its last row."""
    reader = scan_batch.ValueReader(store.key_of_value, start)
    batches = []
    while not batches or batches[-1].has_more:
        batches.append(reader.read(snapshot.values(), snapshot.seekable(), budget))
    keys = list(rows)
    assert [v for b in batches for v in b.values()] == list(rows.values())
    ends = itertools.accumulate(b.count for b in batches)
    assert [b.last_key for b in batches if b.count] == [keys[end - 1] for end, b in zip(ends, batches) if b.count]
    assert reader.key_misses == 0  # the codec gave every last key


def test_a_snapshots_values_iterator_reads_the_state_of_its_snapshot(store):
    store.write(rows(*[(i, f"n{i}", float(i)) for i in range(2000)]))
    expected = kv_rows(store)
    ordered = sorted(expected)
    assert all(store.key_of_value(expected[k]) == k for k in ordered)  # a value tells its key
    start = ordered[10] + b"\x00"
    snapshot = store.snapshot(values_from=start)
    store.write(rows((11, "changed", 0.0), (5000, "new", 0.0)), keys(12, 1999))
    store._kv.flush_rows()  # also after a flush
    assert_values_read_are(store, snapshot, start, 3000, {k: expected[k] for k in ordered[11:]})
    snapshot.close()
    with pytest.raises(BucketStoreError, match="closed"):
        snapshot.values()
    with store.snapshot() as plain, pytest.raises(BucketStoreError, match="without a values iterator"):
        plain.values()


def test_a_snapshots_scan_leaves_the_block_cache_to_lookups(store):
    store.write(rows(*[(i, "x" * 100, float(i)) for i in range(20_000)]))
    store._kv.flush()  # the rows in SST files, read through the block cache

    def cached() -> int:
        return store._kv._db.property_int_value("rocksdb.block-cache-usage")

    before = cached()
    with store.snapshot(values_from=b"") as snapshot:
        assert sum(1 for _ in store.iter_rows(snapshot)) == 20_000
        assert sum(1 for _ in snapshot.values()) == 20_000
    assert cached() == before  # a scan reads each block once: it does not fill the cache
    found, _ = store.lookup(keys(*range(0, 20_000, 97)))
    assert found.all() and cached() > before  # lookups do


def test_snapshot_reads_many_rows_and_a_new_iter_rows_ends_the_old_one(store):
    store.write(rows(*[(i, "x" * 10, None) for i in range(3000)]))
    with store.snapshot() as snapshot:
        first = store.iter_rows(snapshot)
        assert len([next(first) for _ in range(5)]) == 5
        assert sum(1 for _ in store.iter_rows(snapshot)) == 3000
        with pytest.raises(BucketStoreError, match="re-positioned"):
            list(first)


def test_snapshot_of_an_empty_bucket(store):
    with store.snapshot() as snapshot:
        assert snapshot.log_offset == 0
        assert list(store.iter_rows(snapshot)) == []


def test_snapshots_under_concurrent_writes_match_the_log_prefix(store):
    """Snapshot + log offset are taken atomically: the rows equal the fold of the log below the offset."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                ids = rng.sample(range(300), rng.randint(1, 40))
                store.write(rows(*[(i, f"{seed}-{rng.random()}", None) for i in ids]),
                            keys(*rng.sample(range(300), rng.randint(0, 10))))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(2)]
    for t in threads:
        t.start()
    try:
        checked = 0
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline or checked < 5:
            with store.snapshot(values_from=b"") as snapshot:
                seen = dict(store.iter_rows(snapshot))
                offset = snapshot.log_offset
                assert_values_read_are(store, snapshot, b"", 5000, seen)  # the same state
            records = log_records(store)
            prefix, total = [], 0
            for r in records:
                if total >= offset:
                    break
                prefix.append(r.slice(0, offset - total))
                total += r.num_rows
            assert fold(prefix) == seen
            checked += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors


# --- checkpoints -------------------------------------------------------------------------------

def read_checkpoint(path: str) -> dict[bytes, bytes]:
    db = Rdict(path, Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return dict(db.items())
    finally:
        db.close()


def test_checkpoint_plus_changelog_from_its_offset_is_the_current_state(store, bucket_dir):
    store.write(rows(*[(i, f"n{i}", float(i)) for i in range(50)]))
    store.write(rows((3, "three", 3.3)), keys(4))
    target = os.path.join(bucket_dir, "cp1")
    offset = store.checkpoint(target)
    assert offset == store.log_end_offset == 53
    assert checkpoint_log_offset(target) == offset
    store.write(rows((3, "again", 0.0), (60, "new", 0.0)), keys(5, 6, 60))
    store.write(rows((5, "back", 5.0)))
    restored = fold(log_records(store, offset), initial=read_checkpoint(target))
    assert restored == kv_rows(store)
    # not a hit by accident: the checkpoint alone is the old state
    assert read_checkpoint(target) != kv_rows(store)
    with pytest.raises(InvalidRequestError, match="exists"):
        store.checkpoint(target)


def test_checkpoint_of_an_empty_bucket(store, bucket_dir):
    target = os.path.join(bucket_dir, "cp0")
    assert store.checkpoint(target) == 0
    assert read_checkpoint(target) == {} and checkpoint_log_offset(target) == 0
