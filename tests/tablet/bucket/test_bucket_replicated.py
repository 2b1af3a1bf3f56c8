"""A replicated bucket's store (real RocksDB and changelog in temp dirs): writes wait in the pre-write
buffer until the high watermark passes them, followers copy the leader's log byte for byte, truncation,
leader epochs, reopening. The replication shell on top is tested elsewhere."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Iterator
from unittest import mock

import pytest

from kvlease.common.errors import FencedLeaderEpochError, InvalidRequestError, NotLeaderError
from kvlease.common.logentry import CorruptLogError
from kvlease.tablet.bucket.files import Backoff
from kvlease.tablet.bucket.store import BucketStore, BucketStoreError
from kvlease.tablet.log import epoch_file
from kvlease.tablet.log.epochs import EpochCache, EpochEnd, Truncation
from tests.tablet.bucket.test_bucket import (TABLE, D, I, UA, UB, bucket_dir, changes, fold, keys, kv_rows,  # noqa: F401
                                      log_records, rows, state)

pytestmark = pytest.mark.unit


@pytest.fixture
def other_dir(kvlease_tmp: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="bucket-", dir=kvlease_tmp)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def open_store(dir: str, replicated: bool = True, segment_bytes: int = 1 << 20) -> BucketStore:
    return BucketStore.open(dir, TABLE, segment_bytes=segment_bytes, fsync=False, replicated=replicated)


def raw_log(store: BucketStore) -> list[bytes]:
    return store.fetch_log(0, 1 << 30, committed=False)[0] if store.log_end_offset else []


def replicate(leader: BucketStore, follower: BucketStore, max_bytes: int = 300) -> int:
    """Copy the leader's log beyond the follower's end, a few entries at a time; returns the follower's end."""
    while follower.log_end_offset < leader.log_end_offset:
        entries, _end = leader.fetch_log(follower.log_end_offset, max_bytes, committed=False)
        follower.append_replicated(entries)
    return follower.log_end_offset


def test_a_buffered_write_is_invisible_until_the_high_watermark_passes_it(bucket_dir):
    with open_store(bucket_dir) as store:
        assert store.write(rows((1, "a", 1.0), (2, "b", 2.0))) == (0, 2)
        assert store.log_end_offset == 2 and store.high_watermark == 0 and store.applied_offset == 0
        found, _ = store.lookup(keys(1, 2))
        assert not found.any()
        assert kv_rows(store) == {}
        with store.snapshot() as snapshot:
            assert snapshot.log_offset == 0
        assert store.checkpoint(os.path.join(bucket_dir, "cp")) == 0
        assert store.fetch_log(0, 1 << 20) == ([], 0)
        assert len(store.fetch_log(0, 1 << 20, committed=False)[0]) == 1
        assert store.list_offsets() == (0, 0)
        assert store.offset_for_timestamp(0) == 0
        assert store.advance_high_watermark(1) == 1  # mid-entry: the entry is not applied yet
        assert store.applied_offset == 0 and store.fetch_log(0, 1 << 20) == ([], 1)
        assert store.advance_high_watermark(99) == 2  # capped at the log end
        assert state(store) == {1: (1, "a", 1.0), 2: (2, "b", 2.0)}
        assert store.list_offsets() == (0, 2) and len(store.fetch_log(0, 1 << 20)[0]) == 1
        assert store.advance_high_watermark(1) == 2  # never backwards


def test_before_images_read_through_the_buffer(bucket_dir):
    with open_store(bucket_dir) as store:
        store.write(rows((1, "a", 1.0)))  # +I
        store.write(rows((1, "b", 2.0), (2, "x", 0.0), (2, "y", 0.0)))  # -U/+U of the buffered insert; a key twice
        store.write(None, keys(1, 404))  # -D of a buffered row; 404 exists nowhere
        store.write(rows((1, "c", 3.0)), keys(2))  # key 1 is absent (deleted by a buffered write)
        assert kv_rows(store) == {}
        assert changes(store) == [
            (0, I, 1, (1, "a", 1.0)),
            (1, UB, 1, (1, "a", 1.0)), (2, UA, 1, (1, "b", 2.0)), (3, I, 2, (2, "x", 0.0)),
            (4, UB, 2, (2, "x", 0.0)), (5, UA, 2, (2, "y", 0.0)),
            (6, D, 1, (1, "b", 2.0)),
            (7, I, 1, (1, "c", 3.0)), (8, D, 2, (2, "y", 0.0)),
        ]
        assert store.advance_high_watermark(6) == 6
        assert state(store) == {1: (1, "b", 2.0), 2: (2, "y", 0.0)}
        store.write(rows((2, "z", 1.0)))  # key 2: deleted by a buffered write, committed in RocksDB
        assert changes(store, 9) == [(9, I, 2, (2, "z", 1.0))]
        assert store.advance_high_watermark(store.log_end_offset) == 10
        assert state(store) == {1: (1, "c", 3.0), 2: (2, "z", 1.0)}
        assert kv_rows(store) == fold(log_records(store))


def test_not_replicated_the_high_watermark_is_the_log_end(bucket_dir):
    with open_store(bucket_dir, replicated=False) as store:
        store.write(rows((1, "a", 1.0)))
        assert store.high_watermark == store.log_end_offset == store.applied_offset == 1
        assert store.advance_high_watermark(0) == 1
        assert store.fetch_log(0, 1 << 20)[1] == 1 and state(store) == {1: (1, "a", 1.0)}
        with pytest.raises(InvalidRequestError, match="not replicated"):
            store.append_replicated([])


def test_a_follower_copies_the_leader_byte_for_byte(bucket_dir, other_dir):
    with open_store(bucket_dir, segment_bytes=700) as leader, open_store(other_dir, segment_bytes=700) as follower:
        leader.become_leader(4)
        for i in range(12):
            leader.write(rows((i % 5, f"v{i}", float(i)), (100 + i, "n", 0.0)), writer=(9, i))
            if i % 4 == 3:
                leader.write(None, keys(i % 5))
        replicate(leader, follower)
        assert raw_log(follower) == raw_log(leader)
        assert [s.base_offset for s in follower.log_segments()] == [s.base_offset for s in leader.log_segments()]
        assert kv_rows(follower) == {} and follower.high_watermark == 0
        assert follower.epochs == leader.epochs == EpochCache([(4, 0)]) and follower.last_epoch == 4
        end = leader.log_end_offset
        assert leader.advance_high_watermark(end) == follower.advance_high_watermark(end) == end
        assert kv_rows(follower) == kv_rows(leader) == fold(log_records(leader))


def test_append_replicated_refuses_a_gap_and_a_damaged_entry(bucket_dir, other_dir):
    with open_store(bucket_dir) as leader, open_store(other_dir) as follower:
        for i in range(3):
            leader.write(rows((i, "a", 0.0)))
        frames = raw_log(leader)
        with pytest.raises(InvalidRequestError, match="starts at offset 1 but this log ends at 0"):
            follower.append_replicated(frames[1:])
        damaged = bytearray(frames[0])
        damaged[-1] ^= 0xFF
        with pytest.raises(CorruptLogError, match="CRC"):
            follower.append_replicated([bytes(damaged)])
        with pytest.raises(InvalidRequestError, match="starts at offset 2 but this log ends at 1"):
            follower.append_replicated([frames[0], frames[2]])
        assert follower.log_end_offset == 0
        assert follower.append_replicated(frames) == 3 and raw_log(follower) == frames


def test_truncate_to_cuts_uncommitted_entries_durably_and_refuses_committed_ones(bucket_dir):
    with open_store(bucket_dir, segment_bytes=400) as store:
        for i in range(10):
            store.write(rows((i, "a", 0.0), (i + 100, "b", 0.0)))  # entries of 2 records
        store.advance_high_watermark(6)
        segments = len(store.log_segments())
        with pytest.raises(InvalidRequestError, match="records below 6 are committed"):
            store.truncate_to(5)
        assert store.truncate_to(11) == 10  # the entry holding offset 11 goes whole
        assert len(store.log_segments()) < segments
        assert store.log_end_offset == 10 and store.high_watermark == 6
        assert store.write(rows((50, "new", 0.0))) == (10, 11)
        assert store.truncate_to(99) == 11  # at or past the end: nothing
    with open_store(bucket_dir, segment_bytes=400) as store:
        assert store.log_end_offset == 11 and store.high_watermark == store.applied_offset == 6
        assert store.advance_high_watermark(11) == 11
        assert set(state(store)) == {0, 1, 2, 100, 101, 102, 3, 4, 103, 104, 50}
        assert store.truncate_to(11) == 11


def test_reopening_a_replicated_store_leaves_uncommitted_entries_out_of_rocksdb(bucket_dir):
    with open_store(bucket_dir) as store:
        store.write(rows((1, "a", 1.0)))
        store.write(rows((2, "b", 2.0)))
        store.advance_high_watermark(1)
        store.files.park()  # parked and reopened: the high watermark known still holds
        assert store.lookup(keys(1, 2))[0].tolist() == [True, False]
        assert store.high_watermark == 1 and store.log_end_offset == 2
    with open_store(bucket_dir) as store:  # a new store: the high watermark is what RocksDB applied
        assert store.replayed == (1, 1)
        assert store.high_watermark == store.applied_offset == 1 and store.log_end_offset == 2
        assert state(store) == {1: (1, "a", 1.0)}
        store.write(rows((2, "c", 3.0)))  # before-image from the entry still in the log (rebuilt buffer)
        assert changes(store, 2) == [(2, UB, 2, (2, "b", 2.0)), (3, UA, 2, (2, "c", 3.0))]
        store.advance_high_watermark(4)
        assert state(store) == {1: (1, "a", 1.0), 2: (2, "c", 3.0)}


def test_the_epoch_cache_is_checkpointed_reloaded_and_rebuilt(bucket_dir):
    with open_store(bucket_dir) as store:
        assert store.last_epoch == -1 and store.epochs == EpochCache()
        store.become_leader(1)
        store.write(rows((1, "a", 0.0)))
        store.become_leader(3)
        assert store.epochs == EpochCache([(1, 0), (3, 1)]) and store.last_epoch == 1
        store.write(rows((2, "b", 0.0)))
        with pytest.raises(FencedLeaderEpochError):
            store.become_leader(2)
        assert store.end_offset_for(2) == EpochEnd(1, 1) and store.end_offset_for(3) == EpochEnd(3, 2)
    with open_store(bucket_dir) as store:
        assert store.epochs == EpochCache([(1, 0), (3, 1)]) and store.last_epoch == 3
    os.unlink(epoch_file.path_in(bucket_dir))
    with open_store(bucket_dir) as store:
        assert store.epochs == EpochCache([(1, 0), (3, 1)])
    assert os.path.exists(epoch_file.path_in(bucket_dir))
    with open(epoch_file.path_in(bucket_dir), "wb") as fh:
        fh.write(b"{not json")
    with open_store(bucket_dir) as store:
        assert store.epochs == EpochCache([(1, 0), (3, 1)])
        store.truncate_to(1)
        assert store.epochs == EpochCache([(1, 0)])
    with open_store(bucket_dir) as store:
        assert store.epochs == EpochCache([(1, 0)]) and store.log_end_offset == 1


def write_records(store: BucketStore, first_id: int, count: int) -> None:
    for i in range(count):  # one record per entry
        store.write(rows((first_id + i, "r", 0.0)))


def test_a_diverged_follower_truncates_where_its_epochs_part_from_the_leaders(bucket_dir, other_dir):
    with open_store(bucket_dir) as leader, open_store(other_dir) as follower:
        leader.become_leader(1)
        write_records(leader, 0, 10)
        leader.become_leader(3)
        write_records(leader, 1000, 4)
        entries, _ = leader.fetch_log(0, 1 << 20, committed=False)
        follower.append_replicated(entries[:8])
        follower.advance_high_watermark(8)
        follower.become_leader(2)  # led under epoch 2 for a while, its writes never committed
        write_records(follower, 500, 4)
        assert leader.epochs == EpochCache([(1, 0), (3, 10)])
        assert follower.epochs == EpochCache([(1, 0), (2, 8)])
        follower.become_follower(3)
        answer = leader.end_offset_for(follower.last_epoch)
        assert answer == EpochEnd(1, 10)
        step = follower.truncation_for(answer)
        assert step == Truncation(8, True)
        assert follower.truncate_to(step.offset) == 8
        assert follower.epochs == EpochCache([(1, 0)])
        replicate(leader, follower)
        assert raw_log(follower) == raw_log(leader) and follower.epochs == leader.epochs
        follower.advance_high_watermark(14)
        leader.advance_high_watermark(14)
        assert kv_rows(follower) == kv_rows(leader) and 500 not in state(follower)


def test_a_parked_replica_answers_a_fetch_round_from_memory_and_opens_only_to_apply(bucket_dir, other_dir):
    # what a fetch round asks: the follower its log end and last epoch, the leader its offsets and the end of
    # the follower's epoch; an unchanged HW applies nothing. Parked, both answer the same without opening.
    with open_store(bucket_dir) as leader, open_store(other_dir) as follower:
        leader.become_leader(1)
        write_records(leader, 0, 3)
        leader.become_leader(2)
        write_records(leader, 100, 2)
        leader.write(rows((200, "x", 0.0), (201, "y", 0.0)))  # one entry of two records: [5, 7)
        replicate(leader, follower)
        follower.become_follower(2)
        assert follower.advance_high_watermark(6) == 6  # inside the last entry: applied up to 5 only
        leader.advance_high_watermark(6)

        def asked():
            return (follower.log_end_offset, follower.last_epoch, follower.high_watermark, follower.list_offsets(),
                    leader.end_offset_for(1), leader.end_offset_for(2), leader.list_offsets(), leader.log_end_offset)

        expected = (7, 2, 6, (0, 6), EpochEnd(1, 3), EpochEnd(2, 7), (0, 6), 7)
        assert asked() == expected and follower.applied_offset == 5
        assert follower.files.park() and leader.files.park()
        assert asked() == expected
        assert follower.advance_high_watermark(6) == 6 and follower.advance_high_watermark(4) == 6
        assert not follower.is_open and not leader.is_open and follower.applied_offset == 5

        assert follower.advance_high_watermark(7) == 7 and follower.is_open  # an entry to apply: it opens
        leader.advance_high_watermark(7)
        assert follower.applied_offset == 7 and kv_rows(follower) == kv_rows(leader)
        assert follower.files.park() and follower.advance_high_watermark(7) == 7 and not follower.is_open
    with open_store(other_dir) as reopened:  # what memory answered is what the files hold
        assert (reopened.log_end_offset, reopened.last_epoch, reopened.applied_offset) == (7, 2, 7)


def test_a_promoted_follower_answers_a_resent_batch_with_its_original_offsets(bucket_dir, other_dir):
    with open_store(bucket_dir) as leader, open_store(other_dir) as follower:
        leader.become_leader(1)
        assert leader.write(rows((1, "a", 0.0)), writer=(7, 0)) == (0, 1)
        assert leader.write(rows((1, "b", 0.0), (2, "c", 0.0)), writer=(7, 1)) == (1, 4)
        replicate(leader, follower)
        follower.become_leader(2)
        assert follower.write(rows((1, "b", 0.0), (2, "c", 0.0)), writer=(7, 1)) == (1, 4)
        assert follower.log_end_offset == 4
        assert follower.write(rows((3, "d", 0.0)), writer=(7, 2)) == (4, 5)
        assert follower.epochs == EpochCache([(1, 0), (2, 4)])


def test_a_write_that_reaches_the_store_after_it_became_a_follower_is_not_appended(bucket_dir):
    """The leadership check of a client write runs before the store's write lock: a push that makes
    the replica a follower in between must not let the write in, stamped with the NEW leader's epoch
    (seen in the rolling-restart drill: the entry then matched the new leader's epoch, so no
    divergence check found it, and the replica's log differed below the high watermark for good)."""
    with open_store(bucket_dir) as store:
        store.become_leader(1)
        assert store.write(rows((1, "a", 0.0))) == (0, 1)
        store.become_follower(2)
        with pytest.raises(NotLeaderError, match="follows its leader now"):
            store.write(rows((2, "b", 0.0)), writer=(7, 0))
        assert store.log_end_offset == 1 and store.epochs == EpochCache([(1, 0)])
        store.become_leader(3)  # leading again: writes go in under the new epoch
        assert store.write(rows((2, "b", 0.0)), writer=(7, 0)) == (1, 2)
        assert store.epochs == EpochCache([(1, 0), (3, 1)])


def test_writes_and_high_watermark_advances_run_concurrently(bucket_dir):
    with open_store(bucket_dir) as store:
        errors: list[BaseException] = []

        def writer(first: int) -> None:
            try:
                for i in range(40):
                    store.write(rows((first + i % 7, f"w{i}", float(i))))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(n * 100,)) for n in range(3)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            store.advance_high_watermark(store.log_end_offset)
        for t in threads:
            t.join()
        assert not errors
        assert store.advance_high_watermark(store.log_end_offset) == store.log_end_offset
        assert kv_rows(store) == fold(log_records(store))


class LogModel:
    """The model of a replicated bucket: its entries as {key id: name or None (deleted)} and the high watermark."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int, dict[int, str | None]]] = []  # (base, next, changes)
        self.applied = 0

    @property
    def end(self) -> int:
        return self.entries[-1][1] if self.entries else 0

    def fold(self, upto: int) -> dict[int, str]:
        state: dict[int, str] = {}
        for _base, nxt, changed in self.entries:
            if nxt > upto:
                break
            for key, name in changed.items():
                if name is None:
                    state.pop(key, None)
                else:
                    state[key] = name
        return state

    def write(self, base: int, nxt: int, ups: dict[int, str], dels: list[int]) -> None:
        if nxt > base:
            self.entries.append((base, nxt, {**ups, **dict.fromkeys(dels)}))

    def expected_count(self, ups: dict[int, str], dels: list[int]) -> int:
        latest = self.fold(self.end)
        count = sum(2 if k in latest else 1 for k in ups)
        after = {**latest, **ups}
        return count + sum(1 for k in dels if k in after)

    def truncate(self, offset: int) -> None:
        self.entries = [e for e in self.entries if e[1] <= offset]


@pytest.mark.parametrize("seed", range(4))
def test_random_writes_advances_truncations_and_reopens_match_a_model(bucket_dir, seed):
    import random
    rng = random.Random(seed)
    model = LogModel()
    store = open_store(bucket_dir, segment_bytes=600)
    try:
        for step in range(60):
            op = rng.random()
            if op < 0.55:
                ups = {k: f"s{step}k{k}" for k in rng.sample(range(12), rng.randint(0, 3))}
                dels = [k for k in rng.sample(range(12), rng.randint(0, 2)) if k not in ups]
                count = model.expected_count(ups, dels)
                upserts = rows(*[(k, name, 0.0) for k, name in ups.items()])
                base, nxt = store.write(upserts, keys(*dels) if dels else None)
                assert (base, nxt) == (model.end, model.end + count)
                model.write(base, nxt, ups, dels)
            elif op < 0.75:
                boundaries = [model.applied] + [e[1] for e in model.entries if e[1] > model.applied]
                target = rng.choice(boundaries)
                assert store.advance_high_watermark(target) == target
                model.applied = target
            elif op < 0.9:
                boundaries = [model.applied] + [e[1] for e in model.entries if e[1] > model.applied]
                target = rng.choice(boundaries)
                assert store.truncate_to(target) == target
                model.truncate(target)
            else:
                store.close()
                store = open_store(bucket_dir, segment_bytes=600)
            assert store.log_end_offset == model.end and store.high_watermark == model.applied
            assert {k: v[1] for k, v in state(store).items()} == model.fold(model.applied)
        store.advance_high_watermark(model.end)
        assert {k: v[1] for k, v in state(store).items()} == model.fold(model.end)
        assert kv_rows(store) == fold(log_records(store))
    finally:
        store.close()


def _two_entries_one_committed(bucket_dir: str, clock: list[float]) -> BucketStore:
    """A replicated store on ``clock`` (a reopen backoff of 1 s) with entries 0 and 1, the high watermark at 1."""
    store = BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False, replicated=True,
                             backoff=Backoff(1.0, 8.0), monotonic=lambda: clock[0])
    store.write(rows((1, "a", 1.0)))
    store.write(rows((2, "b", 2.0)))
    assert store.advance_high_watermark(1) == 1
    return store


def test_a_high_watermark_that_moves_while_the_files_cannot_open_is_replayed_by_the_reopen(bucket_dir):
    """The leader's HW moves (the writes are acknowledged) while its files cannot open (a full disk): the reopen
    replays up to that HW, though nothing moves it again (the last writes of a load)."""
    clock = [1000.0]
    store = _two_entries_one_committed(bucket_dir, clock)
    try:
        store.files.fail(OSError(28, "No space left on device"))
        clock[0] += 2  # past the backoff: the next use reopens, and that open fails
        with mock.patch("kvlease.tablet.bucket.files.KvStore", side_effect=BucketStoreError("disk full")):
            with pytest.raises(BucketStoreError):
                store.advance_high_watermark(2)  # the follower has entry 2: acknowledged
        clock[0] += 10
        assert store.lookup(keys(1, 2))[0].tolist() == [True, True]  # reopened, replayed up to 2
        assert store.applied_offset == store.high_watermark == 2
    finally:
        store.close()


def test_failed_files_behind_the_high_watermark_refuse_reads_until_reopened(bucket_dir):
    """Failed files still serve reads, but not while RocksDB lacks entries the high watermark committed (their
    apply failed): a lookup and a snapshot (scans; prefix reads check the same) refuse instead of going back."""
    clock = [1000.0]
    store = _two_entries_one_committed(bucket_dir, clock)
    try:
        with mock.patch("kvlease.tablet.store.kvstore.KvStore.commit", side_effect=OSError(28, "No space left")):
            with pytest.raises(BucketStoreError, match="applying the changelog up to the high watermark 2"):
                store.advance_high_watermark(2)
        with pytest.raises(BucketStoreError, match=r"before applying changelog records 1\.\.2"):
            store.lookup(keys(1))
        with pytest.raises(BucketStoreError, match="committed"):
            store.snapshot()
        clock[0] += 2  # past the backoff: reopened, replayed up to the high watermark
        assert store.lookup(keys(1, 2))[0].tolist() == [True, True]
    finally:
        store.close()
