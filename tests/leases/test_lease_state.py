"""Tier 1: the pure lease state machine, driven event by event: the requests.

Acquire, renew, release and drop, and failed writes (bad input: test_lease_checks.py); the harness
(a fake catalog, a real SnapshotStore, ``validate()`` after every step) is in
``tests/support/lease_harness.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.common.model import Lease
from kvlease.leases.refcount import RefcountIndex
from kvlease.leases.state import (AcquireOutcome, LeasesExpired, PersistLease, ReleaseOutcome, Reply, SnapshotsFreed,
                                  WriteDone, WriteFailed)
from tests.support.lease_harness import T1, T2, Harness, freed_by, of_type, only_error, reply_of, tb

pytestmark = pytest.mark.unit


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
    (write,) = of_type(out, PersistLease)
    assert dict(write.after.buckets) == {tb(T1, 0): 5}
    out = h.handle(WriteDone(write.write_id))
    unavailable = {tb(T1, 1): 3, tb(T1, 2): 1, tb(T1, 3): 0}
    assert reply_of(out) == Reply(ev.event_id, AcquireOutcome(11_000, {tb(T1, 0): 5}, unavailable))
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
    assert reply_of(out).result == AcquireOutcome(24_000, {}, {tb(T1, 0): 99})
    assert h.state.get("L") == Lease("L", 24_000, {tb(T1, 0): 5})
    assert not freed_by(out)


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
    assert not of_type(out, SnapshotsFreed)
    assert h.state.refs.holders(tb(T1, 0), 5) == {"M"}
    assert h.state.refs.holders(tb(T1, 0), 6) == {"L"}


def test_acquiring_the_snapshot_a_lease_already_holds_changes_no_table(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T2, 0), 1)
    h.lease("L", {tb(T1, 0): 5})
    out = h.handle(h.acquire("L", {tb(T1, 0): 5, tb(T2, 0): 1}))
    (write,) = of_type(out, PersistLease)
    assert write.changed_tables == frozenset({T2})
    out = h.handle(WriteDone(write.write_id))
    assert not freed_by(out)
    assert h.state.refs.holders(tb(T1, 0), 5) == {"L"}


# --- two leases, release, drop ---------------------------------------------------------

def test_a_snapshot_is_freed_only_when_the_last_lease_lets_go(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("L", {tb(T1, 0): 5})
    h.lease("M", {tb(T1, 0): 5})
    assert h.state.refs.holders(tb(T1, 0), 5) == {"L", "M"}

    out = h.run(h.release("L", tb(T1, 0)))
    assert not of_type(out, SnapshotsFreed)
    assert reply_of(out).result == ReleaseOutcome(released=True, lease_remains=False)  # L held one bucket: gone
    assert h.state.get("L") is None
    assert h.state.refs.holders(tb(T1, 0), 5) == {"M"}

    out = h.run(h.drop("M"))
    assert freed_by(out) == {(tb(T1, 0), 5)}
    assert reply_of(out).result is True
    assert h.state.leases == {}
    assert h.state.refs == RefcountIndex()


def test_release_of_buckets_not_held_replies_released_false_and_writes_nothing(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    lease = h.lease("L", {tb(T1, 0): 5})
    ev = h.release("L", tb(T1, 1), tb(T2, 0))
    assert h.handle(ev) == [Reply(ev.event_id, ReleaseOutcome(released=False, lease_remains=True))]
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
    assert out == [SnapshotsFreed(((tb(T2, 1), 3),)), Reply(ev.event_id, ReleaseOutcome(True, True))]
    assert h.state.get("L") == after

    ev = h.release("L", tb(T1, 0), tb(T1, 3))  # with a bucket it does not hold: released all the same
    out = h.handle(ev)
    assert out == [PersistLease((ev.event_id, 0), "release", after, None, frozenset({T1}))]
    out = h.handle(WriteDone((ev.event_id, 0)))
    assert out == [SnapshotsFreed(((tb(T1, 0), 5),)), Reply(ev.event_id, ReleaseOutcome(True, False))]
    assert h.state.get("L") is None
    assert h.state.refs == RefcountIndex()


def test_release_of_an_unknown_lease_replies_released_false_without_a_write(h: Harness) -> None:
    ev = h.release("nope", tb(T1, 0))
    assert h.handle(ev) == [Reply(ev.event_id, ReleaseOutcome(released=False, lease_remains=False))]
    assert h.state.leases == {} and not h.state.busy("nope")


def test_a_retried_release_of_the_last_bucket_replies_released_false(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("L", {tb(T1, 0): 5})
    first = h.release("L", tb(T1, 0))
    out = h.run(first)
    assert reply_of(out) == Reply(first.event_id, ReleaseOutcome(released=True, lease_remains=False))
    assert freed_by(out) == {(tb(T1, 0), 5)}
    retry = replace(first, event_id=h.next_id())  # the same request again (its answer was lost)
    assert h.handle(retry) == [Reply(retry.event_id, ReleaseOutcome(released=False, lease_remains=False))]
    assert h.state.leases == {}


def test_release_of_held_and_not_held_buckets_frees_the_held_ones(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    lease = h.lease("L", {tb(T1, 0): 5, tb(T1, 1): 6})
    out = h.run(h.release("L", tb(T1, 0), tb(T1, 2), tb(T2, 1)))
    assert reply_of(out).result == ReleaseOutcome(released=True, lease_remains=True)
    assert freed_by(out) == {(tb(T1, 0), 5)}
    assert h.state.get("L") == replace(lease, buckets={tb(T1, 1): 6})


@pytest.mark.parametrize("bucket, error", [
    (tb(99, 0), errors.TableNotExistError),
    (tb(T1, 4), errors.BucketOutOfRangeError),
    (tb(T1, -1), errors.BucketOutOfRangeError),
    (tb(T1, 0, partition_id=0), errors.InvalidRequestError),
])
@pytest.mark.parametrize("lease_id", ["L", "unknown"])
def test_release_of_a_bad_bucket_is_a_typed_error_for_known_and_unknown_leases(h: Harness, bucket, error,
                                                                                lease_id: str) -> None:
    h.commit(tb(T1, 0), 5)
    lease = h.lease("L", {tb(T1, 0): 5})
    only_error(h.handle(h.release(lease_id, tb(T1, 0), bucket)), error)  # one bad bucket spoils the request
    assert h.state.leases == {"L": lease}


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
    assert freed_by(out) == {(tb(T1, 0), 5), (tb(T2, 1), 3)}
    assert out[-1] == Reply(ev.event_id, True)
    assert h.state.get("L") is None
    assert h.state.refs == RefcountIndex()


# --- renew -----------------------------------------------------------------------------

def test_renew_of_an_unknown_lease_is_an_error_and_creates_nothing(h: Harness) -> None:
    err = only_error(h.handle(h.renew("ghost")), errors.LeaseNotFoundError)
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


# --- a lease past its deadline, before the expiry timer ran -----------------------------------

@pytest.fixture
def expired(h: Harness):
    """Lease "L" on (T1/0, 5) and (T2/1, 3), its deadline (11_000) passed; the timer has not run."""
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.commit(tb(T2, 1), 3)
    lease = h.lease("L", {tb(T1, 0): 5, tb(T2, 1): 3}, 10_000)
    h.now = lease.expiration_time  # expired at its deadline itself, as for the timer
    return lease


def dropping(h: Harness, ev, lease: Lease) -> list[object]:
    """Handle ``ev``: it must first persist dropping the expired ``lease``; then complete it."""
    out = h.handle(ev)
    assert out == [PersistLease((ev.event_id, 0), "expire", lease, None, frozenset(lease.tables()))]
    assert h.state.get(lease.lease_id) == lease  # persist, then apply
    return out + h.handle(WriteDone((ev.event_id, 0)))


def test_renew_past_the_deadline_is_lease_not_found_and_drops_the_lease(h: Harness, expired: Lease) -> None:
    ev = h.renew("L", 30_000)
    out = dropping(h, ev, expired)
    assert isinstance(reply_of(out).error, errors.LeaseNotFoundError)
    assert reply_of(out).error.code == errors.ErrorCode.LEASE_NOT_FOUND
    assert "expired" in reply_of(out).error.message
    assert of_type(out, LeasesExpired) == [LeasesExpired(("L",))]
    assert freed_by(out) == {(tb(T1, 0), 5), (tb(T2, 1), 3)}
    assert h.state.leases == {} and h.state.refs == RefcountIndex()


def test_renew_past_the_deadline_is_lease_not_found_even_if_dropping_it_fails(h: Harness, expired: Lease) -> None:
    ev = h.renew("L")
    (write,) = of_type(h.handle(ev), PersistLease)
    out = h.handle(WriteFailed(write.write_id, errors.StorageError("no")))
    assert isinstance(reply_of(out).error, errors.LeaseNotFoundError)
    assert h.state.get("L") == expired  # the timer or the next request drops it


def test_renew_one_ms_before_the_deadline_still_renews(h: Harness, expired: Lease) -> None:
    h.now = expired.expiration_time - 1
    assert reply_of(h.run(h.renew("L", 5_000))).result == h.now + 5_000


def test_acquire_past_the_deadline_starts_a_new_lease(h: Harness, expired: Lease) -> None:
    h.now += 500
    ev = h.acquire("L", {tb(T1, 1): 6, tb(T1, 2): 9}, 20_000)  # 9 does not exist
    out = h.handle(ev)
    fresh = Lease("L", h.now + 20_000, {tb(T1, 1): 6})
    assert out == [PersistLease((ev.event_id, 0), "reacquire", expired, fresh, frozenset({T1, T2}))]
    assert h.state.get("L") == expired and h.state.is_protected(tb(T1, 1), 6)
    out = h.handle(WriteDone((ev.event_id, 0)))
    assert reply_of(out).result == AcquireOutcome(h.now + 20_000, {tb(T1, 1): 6}, {tb(T1, 2): 9})
    assert freed_by(out) == {(tb(T1, 0), 5), (tb(T2, 1), 3)}  # the old buckets' refcounts are freed
    assert of_type(out, LeasesExpired) == [LeasesExpired(("L",))]
    assert h.state.get("L") == fresh
    assert h.state.refs == RefcountIndex.from_leases([fresh])


def test_acquire_past_the_deadline_of_a_bucket_it_held_holds_only_that_one(h: Harness, expired: Lease) -> None:
    out = h.run(h.acquire("L", {tb(T1, 0): 5}, 20_000))
    assert reply_of(out).error is None
    assert h.state.get("L") == Lease("L", h.now + 20_000, {tb(T1, 0): 5})
    assert freed_by(out) == {(tb(T2, 1), 3)}
    assert h.state.refs.holders(tb(T1, 0), 5) == {"L"}


def test_acquire_past_the_deadline_of_only_unavailable_snapshots_drops_the_lease(h: Harness, expired: Lease) -> None:
    ev = h.acquire("L", {tb(T1, 3): 42})
    out = dropping(h, ev, expired)
    assert reply_of(out).result == AcquireOutcome(0, {}, {tb(T1, 3): 42})
    assert h.state.leases == {}


def test_a_failed_reacquire_keeps_the_expired_lease(h: Harness, expired: Lease) -> None:
    ev = h.acquire("L", {tb(T1, 1): 6})
    (write,) = of_type(h.handle(ev), PersistLease)
    failure = errors.StorageError("no")
    out = h.handle(WriteFailed(write.write_id, failure))
    assert reply_of(out).error is failure
    assert freed_by(out) == {(tb(T1, 1), 6)}  # it only protected the new snapshot while in flight
    assert h.state.get("L") == expired


def test_release_past_the_deadline_replies_released_false_and_drops_the_lease(h: Harness, expired: Lease) -> None:
    out = dropping(h, h.release("L", tb(T1, 0)), expired)
    assert reply_of(out).result == ReleaseOutcome(released=False, lease_remains=False)
    assert freed_by(out) == {(tb(T1, 0), 5), (tb(T2, 1), 3)}
    assert h.state.leases == {}


def test_drop_past_the_deadline_replies_false_and_drops_the_lease(h: Harness, expired: Lease) -> None:
    out = dropping(h, h.drop("L"), expired)
    assert reply_of(out).result is False
    assert h.state.leases == {}


def test_live_hides_a_lease_past_its_deadline(h: Harness, expired: Lease) -> None:
    h.commit(tb(T1, 2), 1)
    other = h.lease("M", {tb(T1, 2): 1})
    assert h.state.live("L", h.now) is None and h.state.get("L") == expired
    assert h.state.live("L", h.now - 1) == expired
    assert h.state.live_leases(h.now) == [other]
    assert h.state.live_leases(h.now - 1) == [expired, other]


def test_an_event_without_now_ms_is_refused(h: Harness, expired: Lease) -> None:
    for event in (replace(h.renew("L"), now_ms=None), replace(h.release("L", tb(T1, 0)), now_ms=None)):
        with pytest.raises(ValueError, match="now_ms"):
            h.state.handle(event)


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
    (write,) = of_type(h.handle(event), PersistLease)
    failure = errors.StorageError("zookeeper said no")
    out = h.handle(WriteFailed(write.write_id, failure))
    assert out[-1] == Reply(event.event_id, error=failure)
    assert of_type(out, Reply) == [out[-1]]
    assert (dict(h.state.leases), h.state.refs.as_dict()) == (leases, refs)
    assert not freed_by(out) & {(tb(T1, 0), 5), (tb(T2, 0), 1)}  # still held by L: never reported freed
    assert not h.state.busy(write.lease_id)
    # the lease is usable again afterwards
    assert reply_of(h.run(h.renew("L"))).error is None
