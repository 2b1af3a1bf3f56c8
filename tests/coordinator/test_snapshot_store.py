"""Tier 1: the completed-snapshot store: retention, leases, shared files, commit checks."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.coordinator.snapshots import SnapshotStore
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket

pytestmark = pytest.mark.unit

B0 = TableBucket(7, 0)
B1 = TableBucket(7, 1)
OTHER = TableBucket(8, 0)
SHARED = "kv/7/0/shared/base.sst"


def snap(sid: int, bucket: TableBucket = B0, log_offset: int | None = None, shared: bool = True,
         extra: tuple[str, ...] = ()) -> SnapshotHandle:
    files = [SnapshotFile(f"kv/{bucket.table_id}/{bucket.bucket}/private/{sid}.sst", 10)]
    if shared:
        files.append(SnapshotFile(SHARED if bucket == B0 else f"kv/{bucket}/shared.sst", 100))
    files += [SnapshotFile(path, 1) for path in extra]
    return SnapshotHandle(bucket, sid, sid * 100 if log_offset is None else log_offset,
                          f"kv/{bucket.table_id}/{bucket.bucket}/snap-{sid}/_METADATA", tuple(files), 1_000 + sid)


def never(tb: TableBucket, sid: int) -> bool:
    return False


def leased_set(*pairs: tuple[TableBucket, int]):
    held = set(pairs)
    return lambda tb, sid: (tb, sid) in held


def store_with(*handles: SnapshotHandle, num_retained: int = 2) -> SnapshotStore:
    store = SnapshotStore(num_retained)
    for handle in handles:
        assert store.check_commit(handle)
        store.add(handle)
    store.validate()
    return store


def ids(handles) -> list[int]:
    return [h.snapshot_id for h in handles]


def test_num_retained_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SnapshotStore(0)


def test_retention_keeps_the_newest_num_retained() -> None:
    store = store_with(*(snap(i) for i in (1, 2, 3, 4)), num_retained=2)
    assert ids(store.reclaimable(B0, never)) == [2, 1]  # newest first
    assert [store.is_retained(B0, i) for i in (1, 2, 3, 4)] == [False, False, True, True]
    assert store.latest(B0).snapshot_id == 4
    assert ids(store.bucket_snapshots(B0)) == [1, 2, 3, 4]


def test_retention_counts_per_bucket() -> None:
    store = store_with(snap(1), snap(2), snap(1, B1), num_retained=1)
    assert ids(store.reclaimable(B0, never)) == [1]
    assert store.reclaimable(B1, never) == []
    assert store.reclaimable(OTHER, never) == []  # an unknown bucket has nothing


def test_reclaimable_excludes_leased_snapshots() -> None:
    store = store_with(*(snap(i) for i in (1, 2, 3, 4)), num_retained=1)
    assert ids(store.reclaimable(B0, leased_set((B0, 2)))) == [3, 1]
    assert ids(store.reclaimable(B0, leased_set((B0, 1), (B0, 2), (B0, 3)))) == []
    # a lease on a retained one changes nothing; a lease on another bucket's id is not this one
    assert ids(store.reclaimable(B0, leased_set((B0, 4), (B1, 3)))) == [3, 2, 1]


def test_a_leased_snapshot_becomes_reclaimable_when_the_lease_goes() -> None:
    store = store_with(snap(1), snap(2), snap(3), num_retained=1)
    held = {(B0, 1)}
    for handle in store.reclaimable(B0, lambda tb, sid: (tb, sid) in held):
        store.remove(handle)
    assert ids(store.bucket_snapshots(B0)) == [1, 3]
    store.validate(is_leased=lambda tb, sid: (tb, sid) in held, leased=held)
    held.clear()
    assert ids(store.reclaimable(B0, never)) == [1]


def test_remove_keeps_a_shared_file_while_any_kept_snapshot_uses_it() -> None:
    s1, s2, s3 = snap(1), snap(2), snap(3)
    store = store_with(s1, s2, s3, num_retained=2)
    assert store.file_refcount(SHARED) == 3

    freed = store.remove(s1)
    assert freed == sorted([s1.metadata_path, "kv/7/0/private/1.sst"])
    assert SHARED not in freed
    assert store.file_refcount(SHARED) == 2
    assert not store.has_snapshot(B0, 1)
    store.validate()

    assert SHARED not in store.remove(s2)
    assert SHARED in store.remove(s3)  # the last user goes: now the shared file goes too
    assert store.file_refcount(SHARED) == 0
    assert list(store.all()) == []
    store.validate()


def test_remove_of_an_unknown_snapshot_returns_nothing() -> None:
    s1 = snap(1)
    store = store_with(s1)
    assert store.remove(snap(9)) == []
    assert store.remove(snap(1, B1)) == []
    assert store.remove(s1) != []
    assert store.remove(s1) == []  # twice: nothing the second time
    store.validate()


def test_check_commit_of_the_same_snapshot_again_is_an_idempotent_no() -> None:
    store = store_with(snap(1), snap(2))
    assert store.check_commit(snap(2)) is False
    assert store.check_commit(snap(1)) is False  # also an older one, if identical
    assert store.check_commit(snap(3)) is True
    assert store.check_commit(snap(1, B1)) is True  # another bucket starts from scratch


@pytest.mark.parametrize("handle", [
    snap(2, log_offset=999),                                    # same id, other log offset
    snap(2, extra=("kv/7/0/private/other.sst",)),               # same id, other files
    snap(2, shared=False),
])
def test_check_commit_of_a_conflicting_duplicate_is_invalid(handle: SnapshotHandle) -> None:
    store = store_with(snap(1), snap(2))
    with pytest.raises(errors.InvalidSnapshotError) as info:
        store.check_commit(handle)
    assert info.value.code == errors.ErrorCode.INVALID_SNAPSHOT


@pytest.mark.parametrize("handle", [
    snap(3, log_offset=500),   # older than the latest (4)
    snap(5, log_offset=399),   # newer id but its log offset is below the latest's (400)
    snap(-1, B1),              # negative id on an empty bucket
    snap(1, B1, log_offset=-5),
])
def test_check_commit_rejects_older_lower_or_negative(handle: SnapshotHandle) -> None:
    store = store_with(snap(2), snap(4))
    with pytest.raises(errors.InvalidSnapshotError):
        store.check_commit(handle)


def test_check_commit_accepts_an_equal_log_offset() -> None:
    store = store_with(snap(4))
    assert store.check_commit(snap(5, log_offset=400)) is True


def test_remove_table_returns_all_its_handles_and_files() -> None:
    table7 = [snap(1), snap(2), snap(1, B1), snap(2, B1)]
    other = snap(1, OTHER)
    store = store_with(*table7, other, num_retained=5)
    handles, files = store.remove_table(7)
    assert sorted(handles, key=lambda h: (h.bucket.bucket, h.snapshot_id)) == table7
    expected = sorted({path for h in table7 for path in h.file_paths()})
    assert files == expected
    assert store.table_buckets(7) == []
    assert store.table_buckets(8) == [OTHER]
    assert store.has_snapshot(OTHER, 1)
    assert all(store.file_refcount(path) == 0 for path in expected)
    store.validate()
    assert store.remove_table(7) == ([], [])


def test_validate_with_leases_finds_a_missing_leased_snapshot_and_a_kept_reclaimable_one() -> None:
    store = store_with(snap(1), snap(2), snap(3), num_retained=1)
    with pytest.raises(AssertionError, match="reclaimable"):
        store.validate(is_leased=never)
    store.validate(is_leased=leased_set((B0, 1), (B0, 2)))
    with pytest.raises(AssertionError, match="not stored"):
        store.validate(leased=[(B0, 9)])


def test_validate_catches_a_corrupted_file_refcount() -> None:
    store = store_with(snap(1), snap(2))
    store.validate()
    store._file_refs[SHARED] -= 1  # corrupt the private index
    with pytest.raises(AssertionError, match="file refcounts"):
        store.validate()


def test_validate_catches_a_leaked_file_refcount() -> None:
    store = store_with(snap(1))
    store._file_refs["kv/ghost.sst"] += 1
    with pytest.raises(AssertionError):
        store.validate()


def test_remove_goes_by_the_stored_handle_not_the_callers_copy() -> None:
    # Regression: remove() decremented the files of the handle it was given; a
    # copy that differed from the stored one (same bucket and id, other files)
    # returned a file the store never had and leaked the refcount of the real ones.
    stored = snap(1, extra=("kv/7/0/private/1-b.sst",))
    store = store_with(stored, snap(2))
    stale = snap(1, extra=("kv/7/0/private/not-mine.sst",))
    freed = store.remove(stale)
    assert freed == sorted([stored.metadata_path, "kv/7/0/private/1.sst", "kv/7/0/private/1-b.sst"])
    assert store.file_refcount("kv/7/0/private/1-b.sst") == 0
    store.validate()


# -- snapshots of a lost history (an unclean election) -------------------------------------------------------

def test_discarded_snapshots_leave_the_kept_list_and_their_files_stay_while_leased():
    from kvlease.common.data_loss import UNCLEAN, DataLoss
    loss = DataLoss(UNCLEAN, 5, 250, 400, 0, 0, 2, newest_snapshot_id=3)  # snapshots 1..3 at offsets 100..300
    assert [loss.lost_history(sid, sid * 100) for sid in (1, 2, 3)] == [False, False, True]
    assert not DataLoss(UNCLEAN, 5, -1, 400, 0, 0, 2, newest_snapshot_id=3).lost_history(3, 300)  # unresolved
    assert not loss.lost_history(4, 500)  # the new leader's own snapshots come after it
    assert loss.next_snapshot_id == 4

    store = store_with(snap(1), snap(2), snap(3), num_retained=3)
    leased = leased_set((B0, 3))
    dropped = store.discard(B0, lambda h: loss.lost_history(h.snapshot_id, h.log_offset))
    assert [h.snapshot_id for h in dropped] == [3]
    assert store.discard(B0, lambda h: loss.lost_history(h.snapshot_id, h.log_offset)) == []  # idempotent
    assert store.latest(B0).snapshot_id == 2 and [h.snapshot_id for h in store.bucket_snapshots(B0)] == [1, 2]
    assert not store.has_snapshot(B0, 3) and store.holds(B0, 3)  # not leased anew; its lease reads on
    assert store.file_refcount("kv/7/0/private/3.sst") == 1  # its files stay while leased
    assert store.reclaimable(B0, leased) == []
    store.validate(leased, leased=[(B0, 3)])
    assert store.check_commit(snap(4, log_offset=260))  # the new leader's commit above the kept latest
    store.add(snap(4, log_offset=260))
    (gone,) = store.reclaimable(B0, never)  # the lease ended: it goes
    assert gone.snapshot_id == 3 and "kv/7/0/private/3.sst" in store.remove(gone)
    assert not store.holds(B0, 3) and store.file_refcount(SHARED) == 3
    store.validate(never)


def test_a_dropped_table_removes_its_discarded_snapshots_too():
    store = store_with(snap(1), snap(2), num_retained=2)
    store.discard(B0, lambda h: h.snapshot_id == 2)
    handles, files = store.remove_table(7)
    assert sorted(h.snapshot_id for h in handles) == [1, 2] and SHARED in files
    assert list(store.all()) == [] and store.table_buckets(7) == []


@pytest.mark.parametrize("seed", range(5))
def test_the_latest_ids_of_physical_tables_follow_commits_discards_removals_and_drops(seed) -> None:
    """latest_ids (what lease acquire --latest takes) against each bucket's max kept id, after random
    commits, discards, removals and table/partition drops; validate() checks the index too."""
    import random
    rng, store, next_id = random.Random(seed), SnapshotStore(2), {}
    buckets = [TableBucket(7, b, p) for p in (20, 21) for b in range(3)] + [TableBucket(9, b) for b in range(2)]
    for _ in range(300):
        tb, op = rng.choice(buckets), rng.random()
        if op < 0.55:
            sid = next_id[tb] = next_id.get(tb, -1) + 1
            store.add(snap(sid, tb, log_offset=sid, shared=False))
            for handle in store.reclaimable(tb, never):
                store.remove(handle)
        elif op < 0.7 and store.latest(tb) is not None:
            store.discard(tb, lambda h: h.snapshot_id == store.latest(tb).snapshot_id)
            for handle in store.discarded(tb):
                store.remove(handle)
        elif op < 0.8 and store.bucket_snapshots(tb):
            store.remove(rng.choice(store.bucket_snapshots(tb)))
        elif op < 0.83:
            store.remove_table(tb.table_id, tb.partition_id)
        store.validate()
        for physical in ([20], [21], [20, 21], [9], [5]):
            expected = {b: max(h.snapshot_id for h in store.bucket_snapshots(b)) for b in buckets  # not the index
                        if b.physical_id in physical and store.bucket_snapshots(b)}
            assert store.latest_ids(physical) == expected
