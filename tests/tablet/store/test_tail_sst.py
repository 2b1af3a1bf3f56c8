"""A run of changelog entries as one SST file (tablet/store/tail_sst.py) against applying them record by record
(``KvStore.apply_records``, a follower's apply): real RocksDB in temp dirs, random records of every change type
over a few keys (updates, deletes of present and absent keys, re-inserts, -U before-images), on top of rows the
tail overwrites and rows it leaves alone; then the whole path of a rebuilt replica (a snapshot installed, the tail
appended, its SST ingested) against the leader's rows."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from kvlease.common.errors import InvalidRequestError
from kvlease.common.logentry import ChangeType, decode_entry, encode_payload, frame_header, read_header, record_batch
from kvlease.tablet.store import tail_sst
from kvlease.tablet.store.kvstore import KvStore
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
def test_ingesting_the_sst_of_a_tail_gives_the_rows_and_offset_of_applying_it(tmp_path, seed):
    rng = random.Random(seed)
    frames = random_tail(rng, 100, rng.randint(1, 12))
    entries = [decode_entry(f) for f in frames]
    applied, ingested = base_store(str(tmp_path / "applied")), base_store(str(tmp_path / "ingested"))
    try:
        applied.apply_records([e.records for e in entries], entries[-1].next_offset)
        expected = kv_rows(applied)
        sst = tail_sst.build(frames, 100, str(tmp_path / "tail.sst"))
        assert sst is not None and sst.from_offset == 100 and sst.next_offset == entries[-1].next_offset
        ingested.ingest(sst.path, sst.key_range, sst.next_offset)
        assert kv_rows(ingested) == expected
        assert ingested.applied_offset == applied.applied_offset == sst.next_offset
        for key in [b"k%d" % i for i in range(45)]:  # point reads too (the Bloom filters of the ingested file)
            assert ingested.get([key]) == applied.get([key])
    finally:
        applied.close()
        ingested.close()
    reopened = KvStore(str(tmp_path / "ingested"))  # closed (flushed) and opened again: the same
    try:
        assert reopened.applied_offset == sst.next_offset and kv_rows(reopened) == expected
    finally:
        reopened.close()


def test_what_the_sst_cannot_hold_exactly_is_left_to_the_plain_apply(tmp_path):
    frames = [frame(10, [0, 0], [b"a", b"b"], [b"1", b"2"]), frame(12, [3], [b"a"], [None])]
    assert tail_sst.build(frames, 9, str(tmp_path / "a.sst")) is None  # not from the offset asked
    assert tail_sst.build(frames[1:] + frames[:1], 12, str(tmp_path / "b.sst")) is None  # not contiguous
    assert tail_sst.build([frame(10, [1], [b"a"], [b"old"])], 10, str(tmp_path / "c.sst")) is None  # -U only
    assert tail_sst.build([frame(10, [0], [b"a"], [None])], 10, str(tmp_path / "d.sst")) is None  # a put, no value
    assert not os.listdir(tmp_path)
    sst = tail_sst.build(frames, 10, str(tmp_path / "e.sst"))
    assert sst is not None and (sst.next_offset, sst.keys, sst.key_range) == (13, 2, (b"a", b"b"))


def test_a_rebuilt_replica_ingesting_its_tail_holds_the_leaders_rows_across_the_snapshot_boundary(
        bucket_dir, leader_dir):  # noqa: F811
    """Updates, deletes and re-inserts of keys in the snapshot and after it; part of the tail ingested, the rest
    applied from the log as the fetcher would; then the follower keeps following."""
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
    leader.write(rows((7, "d7", 4.0), (8, "d8", 5.0)))  # after what the SST holds
    leader.advance_high_watermark(leader.log_end_offset)
    tail = leader.fetch_log(offset, 1 << 30)[0]
    follower = open_store(bucket_dir)
    try:
        follower.become_follower(1)
        follower.install_snapshot(checkpoint, offset)
        follower.append_replicated(tail)
        in_sst = [f for f in tail if tail_sst_end(f) <= middle]
        sst = tail_sst.build(in_sst, offset, os.path.join(leader_dir, "tail.sst"))
        assert sst is not None and sst.next_offset == middle
        with pytest.raises(InvalidRequestError, match="cannot be ingested"):
            follower.ingest_tail(tail_sst.TailSst(sst.path, offset + 1, sst.next_offset, None, 0))
        assert follower.ingest_tail(sst) == middle == follower.applied_offset == follower.high_watermark
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


def tail_sst_end(frame_bytes: bytes) -> int:
    header = read_header(memoryview(frame_bytes), 0, len(frame_bytes))
    return header.base_offset + header.count


def state_rows(store) -> dict[bytes, bytes]:
    with store.snapshot() as snapshot:
        return dict(store.iter_rows(snapshot))
