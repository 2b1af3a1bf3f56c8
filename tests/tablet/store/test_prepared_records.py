"""Changelog records applied from a write prepared ahead (``KvStore.prepare_records``, then ``commit``) against applying
them (``KvStore.apply_records``, a follower's apply): real RocksDB in temp dirs, random records of every change type
over a few keys (updates, deletes of present and absent keys, re-inserts, -U before-images), on top of rows the
tail overwrites and rows it leaves alone; then the whole path of a rebuilt replica (a snapshot installed, the tail
appended, part of it applied from a prepared write, the rest from the log) against the leader's rows."""

from __future__ import annotations

import os
import random

import numpy as np
import pyarrow as pa
import pytest

from kvlease.common.errors import InvalidRequestError
from kvlease.common.logentry import ChangeType, decode_entry, encode_payload, frame_header, read_header, record_batch
from kvlease.tablet.store.kvstore import BucketStoreError, KvStore
from tests.tablet.bucket.test_bucket import bucket_dir, keys, rows  # noqa: F401
from tests.tablet.bucket.test_bucket_replicated import open_store
from tests.tablet.store.test_snapshot_install import leader_dir  # noqa: F401

pytestmark = pytest.mark.unit

TYPES = [ChangeType.INSERT, ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER, ChangeType.DELETE]


def frame(base: int, types: list[int], keys: list[bytes], values: list[bytes | None]) -> bytes:
    payload = encode_payload(record_batch(np.array(types, np.int8), keys, values)).to_pybytes()
    return frame_header(base, len(types), payload, 0, leader_epoch=1) + payload


def random_tail(rng: random.Random, base: int, entries: int) -> list[bytes]:
    """Entries of random records over 40 keys (some absent from the base rows, some of every length)."""
    frames = []
    for _ in range(entries):
        n = rng.randint(1, 30)
        types = [int(rng.choice(TYPES)) for _ in range(n)]
        ks = [b"k%d" % rng.randrange(40) if rng.random() < 0.9 else bytes([rng.randrange(256)]) * rng.randint(1, 3)
              for _ in range(n)]
        values = [None if t == ChangeType.DELETE else os.urandom(rng.randint(0, 20)) for t in types]
        frames.append(frame(base, types, ks, values))
        base += n
    return frames


def kv_rows(kv: KvStore) -> dict[bytes, bytes]:
    with kv.snapshot(kv.applied_offset) as snapshot:
        return dict(snapshot.rows())


def base_store(path: str) -> KvStore:
    """A RocksDB with rows k0..k29 applied up to offset 100, flushed (the rows are in SST files, as a snapshot's)."""
    kv = KvStore(path)
    kv.write([b"k%d" % i for i in range(30)], [b"base-%d" % i for i in range(30)], [], 100)
    kv.flush()
    return kv


@pytest.mark.parametrize("seed", range(8))
def test_a_prepared_write_gives_the_rows_and_offset_of_applying_the_records(tmp_path, seed):
    rng = random.Random(seed)
    records = [decode_entry(f).records for f in random_tail(rng, 100, rng.randint(1, 12))]
    end = 100 + sum(r.num_rows for r in records)
    applied, prepared = base_store(str(tmp_path / "applied")), base_store(str(tmp_path / "prepared"))
    try:
        applied.apply_records(records, end)
        expected = kv_rows(applied)
        prepared.commit(KvStore.prepare_records(records), end)  # built without the store, committed after
        assert kv_rows(prepared) == expected and prepared.applied_offset == applied.applied_offset == end
        for key in [b"k%d" % i for i in range(45)]:
            assert prepared.get([key]) == applied.get([key])
        covered = prepared._ranges.maybe_stored(pa.array(list(expected), pa.binary()))  # what a write looks up
        assert covered is not None and covered.all()
    finally:
        applied.close()
        prepared.close()
    reopened = KvStore(str(tmp_path / "prepared"))  # closed (flushed) and opened again: the same
    try:
        assert reopened.applied_offset == end and kv_rows(reopened) == expected
    finally:
        reopened.close()


def test_a_put_without_a_value_is_refused_as_the_apply_refuses_it(tmp_path):
    records = [decode_entry(frame(10, [0, 0], [b"a", b"b"], [b"1", None])).records]
    with pytest.raises(BucketStoreError, match="has no value"):
        KvStore.prepare_records(records, "the tail")
    assert KvStore.prepare_records([decode_entry(frame(10, [1, 3], [b"a", b"b"], [b"1", None])).records]) \
        .key_range == (b"a", b"b")  # -U and -D: a range all the same (the apply adds every key it is given)


def test_a_rebuilt_replica_applying_its_prepared_tail_holds_the_leaders_rows_across_the_snapshot_boundary(
        bucket_dir, leader_dir):  # noqa: F811
    """Updates, deletes and re-inserts of keys in the snapshot and after it; part of the tail from a prepared write,
    the rest applied from the log as the fetcher would; then the follower keeps following."""
    leader = open_store(leader_dir)
    leader.become_leader(1)
    leader.write(rows(*[(i, f"a{i}", float(i)) for i in range(50)]))
    leader.write(rows((3, "b3", 0.5)), keys(4, 5))
    leader.advance_high_watermark(leader.log_end_offset)
    checkpoint = os.path.join(leader_dir, "cp")
    offset = leader.checkpoint(checkpoint)
    leader.write(rows((3, "c3", 1.0), (60, "c60", 2.0)), keys(6, 999))  # tail: update, insert, delete, absent
    leader.write(rows((4, "c4", 1.5), (6, "again", 3.0)))  # a key deleted in the snapshot, one in the tail
    leader.write(None, keys(60, 7))
    middle = leader.log_end_offset
    leader.write(rows((7, "d7", 4.0), (8, "d8", 5.0)))  # after what the prepared write holds
    leader.advance_high_watermark(leader.log_end_offset)
    tail = leader.fetch_log(offset, 1 << 30)[0]
    follower = open_store(bucket_dir)
    try:
        follower.become_follower(1)
        follower.install_snapshot(checkpoint, offset)
        follower.append_replicated(tail)
        staged = [decode_entry(f).records for f in tail if tail_end(f) <= middle]
        write = KvStore.prepare_records(staged)
        with pytest.raises(InvalidRequestError, match="cannot be applied"):
            follower.apply_prepared(write, offset + 1, middle)
        assert follower.apply_prepared(write, offset, middle) == middle == follower.applied_offset
        assert follower.high_watermark == middle
        follower.advance_high_watermark(leader.high_watermark)  # the rest, from the log
        assert follower.applied_offset == leader.applied_offset
        assert state_rows(follower) == state_rows(leader)
        follower.close()
        follower = open_store(bucket_dir)  # reopened: the same rows, the log replays nothing wrong
        assert state_rows(follower) == state_rows(leader)
        leader.write(rows((9, "e9", 6.0)), keys(3))
        leader.advance_high_watermark(leader.log_end_offset)
        follower.append_replicated(leader.fetch_log(follower.log_end_offset, 1 << 30)[0])
        follower.advance_high_watermark(leader.high_watermark)
        assert state_rows(follower) == state_rows(leader)
    finally:
        follower.close()
        leader.close()


def tail_end(frame_bytes: bytes) -> int:
    header = read_header(memoryview(frame_bytes), 0, len(frame_bytes))
    return header.base_offset + header.count


def state_rows(store) -> dict[bytes, bytes]:
    with store.snapshot() as snapshot:
        return dict(store.iter_rows(snapshot))
