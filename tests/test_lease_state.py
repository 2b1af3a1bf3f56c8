"""Tier 1: the pure lease state machine, driven event by event.

A fake catalog answers table questions from a dict and snapshot questions from
a real SnapshotStore. Every step calls ``state.validate()``. Time is an int.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from common import errors
from coordinator.snapshots import SnapshotStore
from common.model import Lease, SnapshotFile, SnapshotHandle, TableBucket
from leases.refcount import RefcountIndex
from leases.state import (
    Acquire, AcquireOutcome, Deferred, Drop, Expire, LeasesExpired, LeaseState, PersistLease, Release,
    RemoveTable, Renew, Reply, Restore, SnapshotsFreed, WriteDone, WriteFailed,
)

pytestmark = pytest.mark.unit

MAX_MS = 60_000
T1, T2, T3 = 1, 2, 3  # T1 has 4 buckets, T2 has 2, T3 has 1


def tb(table_id: int, bucket: int, partition_id: int | None = None) -> TableBucket:
    return TableBucket(table_id, bucket, partition_id)


class FakeCatalog:
    def __init__(self, store: SnapshotStore, tables: dict[int, int]) -> None:
        self.store = store
        self.tables = tables

    def bucket_count(self, table_id: int) -> int | None:
        return self.tables.get(table_id)

    def has_snapshot(self, bucket: TableBucket, snapshot_id: int) -> bool:
        return self.store.has_snapshot(bucket, snapshot_id)


class Harness:
    def __init__(self, num_retained: int = 2) -> None:
        self.store = SnapshotStore(num_retained)
        self.catalog = FakeCatalog(self.store, {T1: 4, T2: 2, T3: 1})
        self.state = LeaseState(self.catalog, max_duration_ms=MAX_MS)
        self._ids = itertools.count(1)
        self.now = 1_000

    def next_id(self) -> int:
        return next(self._ids)

    def commit(self, bucket: TableBucket, sid: int) -> SnapshotHandle:
        handle = SnapshotHandle(bucket, sid, log_offset=sid * 10, metadata_path=f"{bucket}/{sid}.meta",
                                files=(SnapshotFile(f"{bucket}/shared.sst", 1), SnapshotFile(f"{bucket}/{sid}.sst", 1)))
        assert self.store.check_commit(handle)
        self.store.add(handle)
        return handle

    def handle(self, *events: object) -> list[object]:
        out = self.state.handle(*events)
        self.state.validate()
        return out

    # event builders (time = the harness clock)
    def acquire(self, lease_id: str, snaps: dict, duration: int = 10_000) -> Acquire:
        return Acquire(lease_id, dict(snaps), duration, self.now, event_id=self.next_id())

    def renew(self, lease_id: str, duration: int = 10_000) -> Renew:
        return Renew(lease_id, duration, self.now, event_id=self.next_id())

    def release(self, lease_id: str, *buckets: TableBucket) -> Release:
        return Release(lease_id, frozenset(buckets), event_id=self.next_id())

    def drop(self, lease_id: str) -> Drop:
        return Drop(lease_id, event_id=self.next_id())

    def run(self, event: object) -> list[object]:
        """Handle the event and complete every write it asks for; all instructions in order."""
        out = self.handle(event)
        result = list(out)
        for write in [i for i in out if isinstance(i, PersistLease)]:
            result.extend(self.handle(WriteDone(write.write_id)))
        return result

    def lease(self, lease_id: str, snaps: dict, duration: int = 10_000) -> Lease:
        """Acquire and complete; the lease as stored."""
        out = self.run(self.acquire(lease_id, snaps, duration))
        assert _reply(out).error is None, out
        return self.state.get(lease_id)

    def snapshot(self) -> tuple[dict, dict]:
        return dict(self.state.leases), self.state.refs.as_dict()


def _of(out: list[object], cls: type) -> list:
    return [i for i in out if isinstance(i, cls)]


def _reply(out: list[object]) -> Reply:
    replies = _of(out, Reply)
    assert len(replies) == 1, out
    return replies[0]


def _freed(out: list[object]) -> set[tuple[TableBucket, int]]:
    return {snap for i in _of(out, SnapshotsFreed) for snap in i.snapshots}


def _only_error(out: list[object], cls: type) -> errors.KvLeaseError:
    assert len(out) == 1 and isinstance(out[0], Reply), out
    assert isinstance(out[0].error, cls), out[0].error
    return out[0].error


@pytest.fixture
def h() -> Harness:
    return Harness()


# --- acquire -------------------------------------------------------------------------

def test_acquire_creates_the_lease_only_after_write_done(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    ev = h.acquire("L", {tb(T1, 0): 5}, 10_000)
    out = h.handle(ev)
    expected = Lease("L", 11_000, {tb(T1, 0): 5})
    assert out == [PersistLease((ev.event_id, 0), "acquire", None, expected, frozenset({T1}))]
    assert h.state.get("L") is None
    assert h.state.refs == RefcountIndex()
    assert h.state.busy("L")

    out = h.handle(WriteDone((ev.event_id, 0)))
    assert out == [Reply(ev.event_id, AcquireOutcome(11_000, {tb(T1, 0): 5}, {}))]
    assert h.state.get("L") == expected
    assert h.state.refs.holders(tb(T1, 0), 5) == {"L"}
    assert not h.state.busy("L")


def test_acquire_reports_unavailable_snapshots_and_does_not_lease_them(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    deleted = h.commit(tb(T1, 2), 1)
    h.store.remove(deleted)
    ev = h.acquire("L", {tb(T1, 0): 5, tb(T1, 1): 3, tb(T1, 2): 1, tb(T1, 0 + 3): 0})
    out = h.handle(ev)
    (write,) = _of(out, PersistLease)
    assert dict(write.after.buckets) == {tb(T1, 0): 5}
    out = h.handle(WriteDone(write.write_id))
    unavailable = {tb(T1, 1): 3, tb(T1, 2): 1, tb(T1, 3): 0}
    assert _reply(out) == Reply(ev.event_id, AcquireOutcome(11_000, {tb(T1, 0): 5}, unavailable))
    for bucket, sid in unavailable.items():
        assert not h.state.refs.is_leased(bucket, sid)
    assert dict(h.state.get("L").buckets) == {tb(T1, 0): 5}


def test_acquire_of_only_unavailable_snapshots_for_a_new_lease_writes_nothing(h: Harness) -> None:
    ev = h.acquire("L", {tb(T1, 0): 9, tb(T2, 1): 0})
    out = h.handle(ev)
    assert out == [Reply(ev.event_id, AcquireOutcome(0, {}, {tb(T1, 0): 9, tb(T2, 1): 0}))]
    assert h.state.get("L") is None
    assert not h.state.busy("L")
    assert h.state.refs == RefcountIndex()


def test_acquire_of_only_unavailable_snapshots_on_an_existing_lease_keeps_its_buckets(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("L", {tb(T1, 0): 5})
    h.now = 4_000
    out = h.run(h.acquire("L", {tb(T1, 0): 99}, 20_000))
    assert _reply(out).result == AcquireOutcome(24_000, {}, {tb(T1, 0): 99})
    assert h.state.get("L") == Lease("L", 24_000, {tb(T1, 0): 5})
    assert not _freed(out)


def test_acquire_on_an_existing_lease_replaces_the_bucket_snapshot_and_moves_expiration(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 0), 6)
    h.commit(tb(T1, 1), 2)
    before = h.lease("L", {tb(T1, 0): 5, tb(T1, 1): 2}, 10_000)
    h.now = 5_000
    ev = h.acquire("L", {tb(T1, 0): 6}, 20_000)
    out = h.handle(ev)
    after = Lease("L", 25_000, {tb(T1, 0): 6, tb(T1, 1): 2})
    assert out == [PersistLease((ev.event_id, 0), "acquire", before, after, frozenset({T1}))]
    out = h.handle(WriteDone((ev.event_id, 0)))
    assert out == [SnapshotsFreed(((tb(T1, 0), 5),)),
                   Reply(ev.event_id, AcquireOutcome(25_000, {tb(T1, 0): 6}, {}))]
    assert h.state.get("L") == after
    assert not h.state.refs.is_leased(tb(T1, 0), 5)
    assert h.state.refs.holders(tb(T1, 0), 6) == {"L"}


def test_replacing_a_snapshot_another_lease_holds_does_not_free_it(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 0), 6)
    h.lease("L", {tb(T1, 0): 5})
    h.lease("M", {tb(T1, 0): 5})
    out = h.run(h.acquire("L", {tb(T1, 0): 6}))
    assert not _of(out, SnapshotsFreed)
    assert h.state.refs.holders(tb(T1, 0), 5) == {"M"}
    assert h.state.refs.holders(tb(T1, 0), 6) == {"L"}


def test_acquiring_the_snapshot_a_lease_already_holds_changes_no_table(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T2, 0), 1)
    h.lease("L", {tb(T1, 0): 5})
    out = h.handle(h.acquire("L", {tb(T1, 0): 5, tb(T2, 0): 1}))
    (write,) = _of(out, PersistLease)
    assert write.changed_tables == frozenset({T2})
    out = h.handle(WriteDone(write.write_id))
    assert not _freed(out)
    assert h.state.refs.holders(tb(T1, 0), 5) == {"L"}


# --- two leases, release, drop ---------------------------------------------------------

def test_a_snapshot_is_freed_only_when_the_last_lease_lets_go(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("L", {tb(T1, 0): 5})
    h.lease("M", {tb(T1, 0): 5})
    assert h.state.refs.holders(tb(T1, 0), 5) == {"L", "M"}

    out = h.run(h.release("L", tb(T1, 0)))
    assert not _of(out, SnapshotsFreed)
    assert _reply(out).result is False  # L held one bucket: it is gone
    assert h.state.get("L") is None
    assert h.state.refs.holders(tb(T1, 0), 5) == {"M"}

    out = h.run(h.drop("M"))
    assert _freed(out) == {(tb(T1, 0), 5)}
    assert _reply(out).result is True
    assert h.state.leases == {}
    assert h.state.refs == RefcountIndex()


def test_release_of_buckets_not_held_replies_true_and_writes_nothing(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    lease = h.lease("L", {tb(T1, 0): 5})
    ev = h.release("L", tb(T1, 1), tb(T2, 0))
    assert h.handle(ev) == [Reply(ev.event_id, True)]
    assert h.state.get("L") == lease


def test_release_of_the_last_bucket_removes_the_lease(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T2, 1), 3)
    lease = h.lease("L", {tb(T1, 0): 5, tb(T2, 1): 3})

    ev = h.release("L", tb(T2, 1))
    out = h.handle(ev)
    after = Lease("L", lease.expiration_time, {tb(T1, 0): 5})
    assert out == [PersistLease((ev.event_id, 0), "release", lease, after, frozenset({T2}))]
    out = h.handle(WriteDone((ev.event_id, 0)))
    assert out == [SnapshotsFreed(((tb(T2, 1), 3),)), Reply(ev.event_id, True)]
    assert h.state.get("L") == after

    ev = h.release("L", tb(T1, 0), tb(T1, 3))  # with a bucket it does not hold
    out = h.handle(ev)
    assert out == [PersistLease((ev.event_id, 0), "release", after, None, frozenset({T1}))]
    out = h.handle(WriteDone((ev.event_id, 0)))
    assert out == [SnapshotsFreed(((tb(T1, 0), 5),)), Reply(ev.event_id, False)]
    assert h.state.get("L") is None
    assert h.state.refs == RefcountIndex()


def test_release_of_an_unknown_lease_is_lease_not_found(h: Harness) -> None:
    _only_error(h.handle(h.release("nope", tb(T1, 0))), errors.LeaseNotFoundError)


def test_drop_of_an_unknown_lease_replies_false_without_a_write(h: Harness) -> None:
    ev = h.drop("nope")
    assert h.handle(ev) == [Reply(ev.event_id, False)]
    assert h.state.leases == {}


def test_drop_frees_every_snapshot_of_the_lease(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T2, 1), 3)
    lease = h.lease("L", {tb(T1, 0): 5, tb(T2, 1): 3})
    ev = h.drop("L")
    out = h.handle(ev)
    assert out == [PersistLease((ev.event_id, 0), "drop", lease, None, frozenset({T1, T2}))]
    out = h.handle(WriteDone((ev.event_id, 0)))
    assert _freed(out) == {(tb(T1, 0), 5), (tb(T2, 1), 3)}
    assert out[-1] == Reply(ev.event_id, True)
    assert h.state.get("L") is None
    assert h.state.refs == RefcountIndex()


# --- renew -----------------------------------------------------------------------------

def test_renew_of_an_unknown_lease_is_an_error_and_creates_nothing(h: Harness) -> None:
    err = _only_error(h.handle(h.renew("ghost")), errors.LeaseNotFoundError)
    assert err.code == errors.ErrorCode.LEASE_NOT_FOUND
    assert h.state.get("ghost") is None
    assert not h.state.busy("ghost")


def test_renew_moves_only_the_expiration(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    before = h.lease("L", {tb(T1, 0): 5}, 10_000)
    refs = h.state.refs.as_dict()
    h.now = 8_000
    ev = h.renew("L", 30_000)
    out = h.handle(ev)
    after = replace(before, expiration_time=38_000)
    assert out == [PersistLease((ev.event_id, 0), "renew", before, after, frozenset())]
    out = h.handle(WriteDone((ev.event_id, 0)))
    assert out == [Reply(ev.event_id, 38_000)]
    assert h.state.get("L") == after
    assert h.state.refs.as_dict() == refs


# --- failed writes ----------------------------------------------------------------------

@pytest.mark.parametrize("operation", ["acquire-new", "acquire-replace", "renew", "release-one", "release-all",
                                       "drop"])
def test_a_failed_write_changes_nothing_and_replies_the_error(h: Harness, operation: str) -> None:
    for sid in (5, 6):
        h.commit(tb(T1, 0), sid)
    h.commit(tb(T2, 0), 1)
    h.lease("L", {tb(T1, 0): 5, tb(T2, 0): 1})
    h.now = 3_000
    event = {
        "acquire-new": lambda: h.acquire("M", {tb(T1, 0): 5}),
        "acquire-replace": lambda: h.acquire("L", {tb(T1, 0): 6}),
        "renew": lambda: h.renew("L", 50_000),
        "release-one": lambda: h.release("L", tb(T2, 0)),
        "release-all": lambda: h.release("L", tb(T1, 0), tb(T2, 0)),
        "drop": lambda: h.drop("L"),
    }[operation]()
    leases, refs = h.snapshot()
    (write,) = _of(h.handle(event), PersistLease)
    failure = errors.StorageError("zookeeper said no")
    out = h.handle(WriteFailed(write.write_id, failure))
    assert out[-1] == Reply(event.event_id, error=failure)
    assert _of(out, Reply) == [out[-1]]
    assert (dict(h.state.leases), h.state.refs.as_dict()) == (leases, refs)
    assert not _freed(out) & {(tb(T1, 0), 5), (tb(T2, 0), 1)}  # still held by L: never reported freed
    assert not h.state.busy(write.lease_id)
    # the lease is usable again afterwards
    assert _reply(h.run(h.renew("L"))).error is None


# --- bad input ----------------------------------------------------------------------------

BAD_IDS = ["", "a b", "x" * 129, "ü", "../x", "a/b", "a\n", ".", ".."]


@pytest.mark.parametrize("lease_id", BAD_IDS)
def test_bad_lease_ids_are_rejected_by_every_request(h: Harness, lease_id: str) -> None:
    h.commit(tb(T1, 0), 5)
    for event in (h.acquire(lease_id, {tb(T1, 0): 5}), h.renew(lease_id), h.release(lease_id, tb(T1, 0)),
                  h.drop(lease_id)):
        err = _only_error(h.handle(event), errors.InvalidLeaseIdError)
        assert err.code == errors.ErrorCode.INVALID_LEASE_ID
    assert h.state.leases == {}


def test_a_128_character_lease_id_of_every_allowed_character_is_accepted(h: Harness) -> None:
    lease_id = ("A.b_c-1" + "Zz9" * 50)[:128]
    assert len(lease_id) == 128
    h.commit(tb(T1, 0), 5)
    out = h.run(h.acquire(lease_id, {tb(T1, 0): 5}))
    assert _reply(out).error is None
    assert h.state.get(lease_id).buckets == {tb(T1, 0): 5}


@pytest.mark.parametrize("snaps, error", [
    ({}, errors.InvalidRequestError),
    ({tb(99, 0): 1}, errors.TableNotExistError),
    ({tb(T1, 4): 1}, errors.BucketOutOfRangeError),
    ({tb(T1, -1): 1}, errors.BucketOutOfRangeError),
    ({tb(T3, 1): 1}, errors.BucketOutOfRangeError),
    ({tb(T1, 0, partition_id=0): 1}, errors.InvalidRequestError),
    ({tb(T1, 0): -1}, errors.InvalidRequestError),
    ({tb(T1, 0): 5, tb(99, 0): 1}, errors.TableNotExistError),  # one bad bucket spoils the request
])
def test_bad_acquire_requests_are_rejected_without_a_write(h: Harness, snaps: dict, error: type) -> None:
    h.commit(tb(T1, 0), 5)
    err = _only_error(h.handle(h.acquire("L", snaps)), error)
    if error is errors.TableNotExistError:
        assert err.details["table_id"] == 99
    assert h.state.leases == {}
    assert not h.state.busy("L")


@pytest.mark.parametrize("duration", [0, -1, -MAX_MS, MAX_MS + 1])
def test_bad_durations_are_rejected_by_acquire_and_renew(h: Harness, duration: int) -> None:
    h.commit(tb(T1, 0), 5)
    lease = h.lease("L", {tb(T1, 0): 5})
    _only_error(h.handle(h.acquire("M", {tb(T1, 0): 5}, duration)), errors.InvalidLeaseDurationError)
    _only_error(h.handle(h.acquire("L", {tb(T1, 0): 5}, duration)), errors.InvalidLeaseDurationError)
    _only_error(h.handle(h.renew("L", duration)), errors.InvalidLeaseDurationError)
    assert h.state.leases == {"L": lease}


def test_the_maximum_duration_itself_is_accepted(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    assert h.lease("L", {tb(T1, 0): 5}, MAX_MS).expiration_time == h.now + MAX_MS
    assert _reply(h.run(h.renew("L", MAX_MS))).result == h.now + MAX_MS


def test_release_of_no_buckets_is_rejected(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("L", {tb(T1, 0): 5})
    _only_error(h.handle(h.release("L")), errors.InvalidRequestError)
    assert h.state.get("L").buckets == {tb(T1, 0): 5}


# --- writes in flight -------------------------------------------------------------------------

def test_events_for_a_lease_with_a_write_in_flight_are_deferred_then_succeed(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 7)
    first = h.acquire("L", {tb(T1, 0): 5})
    (write,) = _of(h.handle(first), PersistLease)

    acquire = h.acquire("L", {tb(T1, 1): 7})
    drop = h.drop("L")
    assert h.handle(acquire) == [Deferred(acquire)]
    assert h.handle(drop) == [Deferred(drop)]
    assert h.state.get("L") is None

    h.handle(WriteDone(write.write_id))
    assert _reply(h.run(acquire)).result == AcquireOutcome(acquire.now_ms + 10_000, {tb(T1, 1): 7}, {})
    assert h.state.get("L").buckets == {tb(T1, 0): 5, tb(T1, 1): 7}

    renew, release = h.renew("L", 40_000), h.release("L", tb(T1, 0))
    (write,) = _of(h.handle(drop), PersistLease)  # drop in flight now
    assert h.handle(renew, release) == [Deferred(renew), Deferred(release)]
    out = h.handle(WriteDone(write.write_id))
    assert out[-1] == Reply(drop.event_id, True)
    _only_error(h.handle(renew), errors.LeaseNotFoundError)  # handed in again: the lease is gone now


def test_renew_and_release_deferred_behind_an_acquire_apply_after_it(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.lease("L", {tb(T1, 0): 5})
    (write,) = _of(h.handle(h.acquire("L", {tb(T1, 1): 6})), PersistLease)
    renew, release = h.renew("L", 40_000), h.release("L", tb(T1, 0))
    assert h.handle(renew) == [Deferred(renew)]
    assert h.handle(release) == [Deferred(release)]
    h.handle(WriteDone(write.write_id))
    assert _reply(h.run(renew)).result == renew.now_ms + 40_000
    out = h.run(release)
    assert _reply(out).result is True
    assert _freed(out) == {(tb(T1, 0), 5)}
    assert h.state.get("L") == Lease("L", renew.now_ms + 40_000, {tb(T1, 1): 6})


def test_validation_errors_are_answered_even_while_a_write_is_in_flight(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.handle(h.acquire("L", {tb(T1, 0): 5}))
    _only_error(h.handle(h.acquire("L", {tb(T1, 0): 5}, 0)), errors.InvalidLeaseDurationError)
    _only_error(h.handle(h.acquire("L", {tb(99, 0): 5})), errors.TableNotExistError)


# --- expiry -----------------------------------------------------------------------------------

def test_expire_drops_exactly_the_expired_leases(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.commit(tb(T2, 0), 1)
    h.now = 0
    h.lease("A", {tb(T1, 0): 5}, 2_000)
    h.lease("B", {tb(T1, 1): 6, tb(T1, 0): 5}, 3_000)
    h.lease("C", {tb(T2, 0): 1}, 3_001)
    shared = h.lease("D", {tb(T1, 1): 6}, 10_000)

    ev = Expire(3_000, event_id=h.next_id())
    out = h.handle(ev)
    writes = _of(out, PersistLease)
    assert len(out) == len(writes) == 2
    assert {(w.lease_id, w.reason, w.after) for w in writes} == {("A", "expire", None), ("B", "expire", None)}
    assert h.state.leases.keys() == {"A", "B", "C", "D"}  # nothing applied yet

    result = []
    for write in writes:
        result.extend(h.handle(WriteDone(write.write_id)))
    assert sorted(i.lease_ids for i in _of(result, LeasesExpired)) == [("A",), ("B",)]
    assert _freed(result) == {(tb(T1, 0), 5)}  # (T1/1, 6) is still D's
    assert result[-1] == Reply(ev.event_id, None)
    assert h.state.leases.keys() == {"C", "D"}
    assert h.state.get("D") == shared

    ev = Expire(3_000, event_id=h.next_id())
    assert h.handle(ev) == [Reply(ev.event_id, None)]  # nothing more to expire


def test_expire_skips_a_lease_with_a_write_in_flight(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.now = 0
    h.lease("A", {tb(T1, 0): 5}, 1_000)
    h.lease("B", {tb(T1, 1): 6}, 1_000)
    h.now = 2_000
    (renew,) = _of(h.handle(h.renew("B", 5_000)), PersistLease)
    out = h.handle(Expire(2_000, event_id=h.next_id()))
    assert [w.lease_id for w in _of(out, PersistLease)] == ["A"]
    for write in _of(out, PersistLease):
        h.handle(WriteDone(write.write_id))
    h.handle(WriteDone(renew.write_id))
    assert h.state.leases.keys() == {"B"}
    assert h.state.get("B").expiration_time == 7_000


def test_a_failed_expire_write_keeps_that_lease(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.now = 0
    lease = h.lease("A", {tb(T1, 0): 5}, 1_000)
    ev = Expire(1_000, event_id=h.next_id())
    (write,) = _of(h.handle(ev), PersistLease)
    failure = errors.StorageError("nope")
    assert h.handle(WriteFailed(write.write_id, failure)) == [Reply(ev.event_id, error=failure)]
    assert h.state.leases == {"A": lease}
    assert h.state.refs.holders(tb(T1, 0), 5) == {"A"}


# --- dropping a table --------------------------------------------------------------------------

def test_remove_table_takes_the_table_out_of_every_lease(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.commit(tb(T2, 0), 1)
    only_t1 = h.lease("A", {tb(T1, 0): 5, tb(T1, 1): 6})
    both = h.lease("B", {tb(T1, 0): 5, tb(T2, 0): 1})
    only_t2 = h.lease("C", {tb(T2, 0): 1})

    ev = RemoveTable(T1, event_id=h.next_id())
    out = h.handle(ev)
    writes = {w.lease_id: w for w in _of(out, PersistLease)}
    assert len(out) == 2 and writes.keys() == {"A", "B"}
    assert writes["A"] == PersistLease(writes["A"].write_id, "drop-table", only_t1, None, frozenset({T1}))
    assert writes["B"].after == Lease("B", both.expiration_time, {tb(T2, 0): 1})
    assert writes["B"].changed_tables == frozenset({T1})

    result = []
    for write in writes.values():
        result.extend(h.handle(WriteDone(write.write_id)))
    assert _freed(result) == {(tb(T1, 0), 5), (tb(T1, 1), 6)}
    assert result[-1] == Reply(ev.event_id, None)
    assert h.state.leases.keys() == {"B", "C"}
    assert h.state.get("C") == only_t2
    assert all(bucket.table_id != T1 for bucket, _ in h.state.refs.leased())


def test_remove_table_is_deferred_while_a_holder_has_a_write_in_flight(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("A", {tb(T1, 0): 5})
    (write,) = _of(h.handle(h.renew("A")), PersistLease)
    ev = RemoveTable(T1, event_id=h.next_id())
    assert h.handle(ev) == [Deferred(ev)]
    h.handle(WriteDone(write.write_id))
    assert _reply(h.run(ev)) == Reply(ev.event_id, None)
    assert h.state.leases == {}


@pytest.mark.parametrize("existing", [False, True])
def test_remove_table_waits_for_an_acquire_in_flight_that_adds_the_table(h: Harness, existing: bool) -> None:
    # Regression: RemoveTable looked only at applied leases, so an acquire in flight
    # that adds the table landed after it and left a lease pointing at a dropped table.
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T2, 0), 1)
    if existing:
        h.lease("A", {tb(T2, 0): 1})
    (write,) = _of(h.handle(h.acquire("A", {tb(T1, 0): 5})), PersistLease)
    ev = RemoveTable(T1, event_id=h.next_id())
    assert h.handle(ev) == [Deferred(ev)]
    h.handle(WriteDone(write.write_id))
    assert _reply(h.run(ev)).error is None
    assert all(T1 not in lease.tables() for lease in h.state.leases.values())
    assert h.state.leases.keys() == ({"A"} if existing else set())


@pytest.mark.parametrize("failing", [0, 1])
def test_a_partly_failed_remove_table_replies_the_error_and_keeps_the_failed_lease(h: Harness, failing: int) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.lease("A", {tb(T1, 0): 5})
    h.lease("B", {tb(T1, 1): 6})
    ev = RemoveTable(T1, event_id=h.next_id())
    writes = _of(h.handle(ev), PersistLease)
    assert len(writes) == 2
    failure = errors.StorageError("one of two")
    out = []
    for index, write in enumerate(writes):  # the failure comes first or last: the reply says so either way
        if index == failing:
            out += h.handle(WriteFailed(write.write_id, failure))
        else:
            out += h.handle(WriteDone(write.write_id))
    assert _reply(out) == Reply(ev.event_id, error=failure)
    kept = writes[failing].lease_id
    assert h.state.leases.keys() == {kept}  # the other one was written, so it is applied
    assert not h.state.busy(kept)
    # the shell retries the drop; now it completes
    assert _reply(h.run(RemoveTable(T1, event_id=h.next_id()))).error is None
    assert h.state.leases == {}


def test_remove_table_nobody_holds_replies_at_once(h: Harness) -> None:
    h.commit(tb(T2, 0), 1)
    h.lease("C", {tb(T2, 0): 1})
    ev = RemoveTable(T1, event_id=h.next_id())
    assert h.handle(ev) == [Reply(ev.event_id, None)]


# --- failover ----------------------------------------------------------------------------------

def test_restore_grants_grace_to_expired_leases_and_rebuilds_refs(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)  # some state that restore must replace
    h.lease("old", {tb(T1, 0): 5})
    loaded = (
        Lease("past", 500, {tb(T1, 0): 5, tb(T2, 1): 3}),
        Lease("now", 1_000, {tb(T1, 0): 5}),
        Lease("future", 2_000, {tb(T1, 1): 7}),
    )
    ev = Restore(loaded, now_ms=1_000, grace_ms=300, event_id=h.next_id())
    assert h.handle(ev) == [Reply(ev.event_id, 3)]
    assert h.state.leases == {
        "past": replace(loaded[0], expiration_time=1_300),
        "now": replace(loaded[1], expiration_time=1_300),
        "future": loaded[2],
    }
    assert h.state.refs.holders(tb(T1, 0), 5) == {"past", "now"}
    assert h.state.refs.holders(tb(T2, 1), 3) == {"past"}
    assert h.state.refs.holders(tb(T1, 1), 7) == {"future"}
    assert h.state.refs == RefcountIndex.from_leases(loaded)
    # nothing expires before the grace is over
    ev = Expire(1_299, event_id=h.next_id())
    assert h.handle(ev) == [Reply(ev.event_id, None)]


# --- changed tables ------------------------------------------------------------------------------

def test_changed_tables_names_exactly_the_tables_whose_buckets_changed(h: Harness) -> None:
    for bucket, sid in ((tb(T1, 0), 5), (tb(T1, 0), 6), (tb(T2, 0), 1), (tb(T3, 0), 2)):
        h.commit(bucket, sid)
    h.lease("L", {tb(T1, 0): 5, tb(T2, 0): 1})

    def changed(event: object) -> frozenset[int]:
        out = h.handle(event)
        (write,) = _of(out, PersistLease)
        h.handle(WriteDone(write.write_id))
        return write.changed_tables

    assert changed(h.acquire("L", {tb(T3, 0): 2, tb(T2, 0): 1})) == {T3}
    assert changed(h.acquire("L", {tb(T1, 0): 6})) == {T1}
    assert changed(h.acquire("L", {tb(T1, 0): 6, tb(T2, 0): 77})) == frozenset()  # 77 unavailable
    assert changed(h.renew("L")) == frozenset()
    assert changed(h.release("L", tb(T2, 0), tb(T2, 1))) == {T2}
    assert changed(h.drop("L")) == {T1, T3}


# --- protection of snapshots with an acquire in flight ----------------------------------------------

def test_a_snapshot_being_acquired_is_protected_until_the_write_settles(h: Harness) -> None:
    # Regression: refs change only on WriteDone, so reclaiming with refs.is_leased
    # deleted a snapshot whose acquire was in flight; the lease then held a
    # snapshot that no longer existed. is_protected covers writes in flight.
    bucket = tb(T1, 0)
    h.commit(bucket, 5)
    ev = h.acquire("L", {bucket: 5})
    (write,) = _of(h.handle(ev), PersistLease)
    h.commit(bucket, 6)
    h.commit(bucket, 7)  # 5 is no longer among the 2 newest
    assert [s.snapshot_id for s in h.store.reclaimable(bucket, h.state.refs.is_leased)] == [5]
    assert h.store.reclaimable(bucket, h.state.is_protected) == []
    assert h.state.is_protected(bucket, 5)

    h.handle(WriteDone(write.write_id))
    h.store.validate(is_leased=h.state.is_protected, leased=h.state.refs.leased())
    assert h.state.refs.holders(bucket, 5) == {"L"}


def test_a_failed_acquire_frees_the_snapshot_it_protected(h: Harness) -> None:
    bucket = tb(T1, 0)
    h.commit(bucket, 5)
    ev = h.acquire("L", {bucket: 5})
    (write,) = _of(h.handle(ev), PersistLease)
    h.commit(bucket, 6)
    h.commit(bucket, 7)
    failure = errors.StorageError("boom")
    out = h.handle(WriteFailed(write.write_id, failure))
    assert out == [SnapshotsFreed(((bucket, 5),)), Reply(ev.event_id, error=failure)]
    assert not h.state.is_protected(bucket, 5)
    assert [s.snapshot_id for s in h.store.reclaimable(bucket, h.state.is_protected)] == [5]


def test_a_failed_acquire_does_not_free_what_another_write_in_flight_protects(h: Harness) -> None:
    bucket = tb(T1, 0)
    h.commit(bucket, 5)
    (first,) = _of(h.handle(h.acquire("L", {bucket: 5})), PersistLease)
    (second,) = _of(h.handle(h.acquire("M", {bucket: 5})), PersistLease)
    out = h.handle(WriteFailed(first.write_id, errors.StorageError("boom")))
    assert not _of(out, SnapshotsFreed)
    assert h.state.is_protected(bucket, 5)
    h.handle(WriteDone(second.write_id))
    assert h.state.refs.holders(bucket, 5) == {"M"}


# --- validate can fail ---------------------------------------------------------------------------------

def test_validate_catches_refs_that_differ_from_the_leases(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("L", {tb(T1, 0): 5})
    h.state.refs.add("ghost", tb(T1, 0), 5)
    with pytest.raises(AssertionError, match="refcount"):
        h.state.validate()


def test_validate_catches_an_empty_lease(h: Harness) -> None:
    h.state.leases["E"] = Lease("E", 10, {})
    with pytest.raises(AssertionError, match="empty"):
        h.state.validate()
