"""Tier 1: the pure lease state machine, driven event by event: writes over time.

Events meeting writes in flight, expiry, dropping a table, failover (restore),
which tables a write changes, protection of snapshots being acquired, and
``validate()`` itself. The harness is in ``tests/support/lease_harness.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.common.model import Lease
from kvlease.leases.refcount import RefcountIndex
from kvlease.leases.state import (AcquireOutcome, Deferred, Expire, LeasesExpired, LeaseState, PersistLease,
                                  ReleaseOutcome, RemoveTable, Reply, Restore, RestoreOutcome, SnapshotsFreed,
                                  WriteDone, WriteFailed)
from tests.support.lease_harness import MAX_MS, T1, T2, T3, Harness, freed_by, of_type, only_error, reply_of, tb

pytestmark = pytest.mark.unit


@pytest.fixture
def h() -> Harness:
    return Harness()


# --- writes in flight -------------------------------------------------------------------------

def test_events_for_a_lease_with_a_write_in_flight_are_deferred_then_succeed(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 7)
    first = h.acquire("L", {tb(T1, 0): 5})
    (write,) = of_type(h.handle(first), PersistLease)

    acquire = h.acquire("L", {tb(T1, 1): 7})
    drop = h.drop("L")
    assert h.handle(acquire) == [Deferred(acquire)]
    assert h.handle(drop) == [Deferred(drop)]
    assert h.state.get("L") is None

    h.handle(WriteDone(write.write_id))
    assert reply_of(h.run(acquire)).result == AcquireOutcome(acquire.now_ms + 10_000, {tb(T1, 1): 7}, {})
    assert h.state.get("L").buckets == {tb(T1, 0): 5, tb(T1, 1): 7}

    renew, release = h.renew("L", 40_000), h.release("L", tb(T1, 0))
    (write,) = of_type(h.handle(drop), PersistLease)  # drop in flight now
    assert h.handle(renew, release) == [Deferred(renew), Deferred(release)]
    out = h.handle(WriteDone(write.write_id))
    assert out[-1] == Reply(drop.event_id, True)
    only_error(h.handle(renew), errors.LeaseNotFoundError)  # handed in again: the lease is gone now


def test_renew_and_release_deferred_behind_an_acquire_apply_after_it(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.lease("L", {tb(T1, 0): 5})
    (write,) = of_type(h.handle(h.acquire("L", {tb(T1, 1): 6})), PersistLease)
    renew, release = h.renew("L", 40_000), h.release("L", tb(T1, 0))
    assert h.handle(renew) == [Deferred(renew)]
    assert h.handle(release) == [Deferred(release)]
    h.handle(WriteDone(write.write_id))
    assert reply_of(h.run(renew)).result == renew.now_ms + 40_000
    out = h.run(release)
    assert reply_of(out).result == ReleaseOutcome(released=True, lease_remains=True)
    assert freed_by(out) == {(tb(T1, 0), 5)}
    assert h.state.get("L") == Lease("L", renew.now_ms + 40_000, {tb(T1, 1): 6})


def test_validation_errors_are_answered_even_while_a_write_is_in_flight(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.handle(h.acquire("L", {tb(T1, 0): 5}))
    only_error(h.handle(h.acquire("L", {tb(T1, 0): 5}, 0)), errors.InvalidLeaseDurationError)
    only_error(h.handle(h.acquire("L", {tb(99, 0): 5})), errors.TableNotExistError)


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
    writes = of_type(out, PersistLease)
    assert len(out) == len(writes) == 2
    assert {(w.lease_id, w.reason, w.after) for w in writes} == {("A", "expire", None), ("B", "expire", None)}
    assert h.state.leases.keys() == {"A", "B", "C", "D"}  # nothing applied yet

    result = []
    for write in writes:
        result.extend(h.handle(WriteDone(write.write_id)))
    assert sorted(i.lease_ids for i in of_type(result, LeasesExpired)) == [("A",), ("B",)]
    assert freed_by(result) == {(tb(T1, 0), 5)}  # (T1/1, 6) is still D's
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
    h.now = 900  # B is renewed before its deadline; the write is still in flight at 2_000
    (renew,) = of_type(h.handle(h.renew("B", 5_000)), PersistLease)
    out = h.handle(Expire(2_000, event_id=h.next_id()))
    assert [w.lease_id for w in of_type(out, PersistLease)] == ["A"]
    for write in of_type(out, PersistLease):
        h.handle(WriteDone(write.write_id))
    h.handle(WriteDone(renew.write_id))
    assert h.state.leases.keys() == {"B"}
    assert h.state.get("B").expiration_time == 5_900


def test_a_failed_expire_write_keeps_that_lease(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.now = 0
    lease = h.lease("A", {tb(T1, 0): 5}, 1_000)
    ev = Expire(1_000, event_id=h.next_id())
    (write,) = of_type(h.handle(ev), PersistLease)
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
    writes = {w.lease_id: w for w in of_type(out, PersistLease)}
    assert len(out) == 2 and writes.keys() == {"A", "B"}
    assert writes["A"] == PersistLease(writes["A"].write_id, "drop-table", only_t1, None, frozenset({T1}))
    assert writes["B"].after == Lease("B", both.expiration_time, {tb(T2, 0): 1})
    assert writes["B"].changed_tables == frozenset({T1})

    result = []
    for write in writes.values():
        result.extend(h.handle(WriteDone(write.write_id)))
    assert freed_by(result) == {(tb(T1, 0), 5), (tb(T1, 1), 6)}
    assert result[-1] == Reply(ev.event_id, None)
    assert h.state.leases.keys() == {"B", "C"}
    assert h.state.get("C") == only_t2
    assert all(bucket.table_id != T1 for bucket, _ in h.state.refs.leased())


def test_remove_table_is_deferred_while_a_holder_has_a_write_in_flight(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("A", {tb(T1, 0): 5})
    (write,) = of_type(h.handle(h.renew("A")), PersistLease)
    ev = RemoveTable(T1, event_id=h.next_id())
    assert h.handle(ev) == [Deferred(ev)]
    h.handle(WriteDone(write.write_id))
    assert reply_of(h.run(ev)) == Reply(ev.event_id, None)
    assert h.state.leases == {}


@pytest.mark.parametrize("existing", [False, True])
def test_remove_table_waits_for_an_acquire_in_flight_that_adds_the_table(h: Harness, existing: bool) -> None:
    # Regression: RemoveTable looked only at applied leases, so an acquire in flight
    # that adds the table landed after it and left a lease pointing at a dropped table.
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T2, 0), 1)
    if existing:
        h.lease("A", {tb(T2, 0): 1})
    (write,) = of_type(h.handle(h.acquire("A", {tb(T1, 0): 5})), PersistLease)
    ev = RemoveTable(T1, event_id=h.next_id())
    assert h.handle(ev) == [Deferred(ev)]
    h.handle(WriteDone(write.write_id))
    assert reply_of(h.run(ev)).error is None
    assert all(T1 not in lease.tables() for lease in h.state.leases.values())
    assert h.state.leases.keys() == ({"A"} if existing else set())


@pytest.mark.parametrize("failing", [0, 1])
def test_a_partly_failed_remove_table_replies_the_error_and_keeps_the_failed_lease(h: Harness, failing: int) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 6)
    h.lease("A", {tb(T1, 0): 5})
    h.lease("B", {tb(T1, 1): 6})
    ev = RemoveTable(T1, event_id=h.next_id())
    writes = of_type(h.handle(ev), PersistLease)
    assert len(writes) == 2
    failure = errors.StorageError("one of two")
    out = []
    for index, write in enumerate(writes):  # the failure comes first or last: the reply says so either way
        if index == failing:
            out += h.handle(WriteFailed(write.write_id, failure))
        else:
            out += h.handle(WriteDone(write.write_id))
    assert reply_of(out) == Reply(ev.event_id, error=failure)
    kept = writes[failing].lease_id
    assert h.state.leases.keys() == {kept}  # the other one was written, so it is applied
    assert not h.state.busy(kept)
    # the shell retries the drop; now it completes
    assert reply_of(h.run(RemoveTable(T1, event_id=h.next_id()))).error is None
    assert h.state.leases == {}


def test_remove_table_nobody_holds_replies_at_once(h: Harness) -> None:
    h.commit(tb(T2, 0), 1)
    h.lease("C", {tb(T2, 0): 1})
    ev = RemoveTable(T1, event_id=h.next_id())
    assert h.handle(ev) == [Reply(ev.event_id, None)]


# --- failover ----------------------------------------------------------------------------------

def test_restore_grants_grace_to_expired_leases_writes_it_back_and_rebuilds_refs(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)  # some state that restore must replace
    h.lease("old", {tb(T1, 0): 5})
    loaded = (
        Lease("past", 500, {tb(T1, 0): 5, tb(T2, 1): 3}),
        Lease("now", 1_000, {tb(T1, 0): 5}),
        Lease("future", 2_000, {tb(T1, 1): 7}),
    )
    ev = Restore(loaded, now_ms=1_000, grace_ms=300, event_id=h.next_id())
    out = h.handle(ev)
    graced = {lease.lease_id: replace(lease, expiration_time=1_300, graced=True) for lease in loaded[:2]}
    assert out == [PersistLease((ev.event_id, 0), "grace", loaded[1], graced["now"], frozenset()),
                   PersistLease((ev.event_id, 1), "grace", loaded[0], graced["past"], frozenset())]
    # persist, then apply: until written they hold their stored deadline, and nothing else touches them
    assert h.state.leases == {lease.lease_id: lease for lease in loaded}
    assert h.state.busy("past") and h.state.busy("now") and not h.state.busy("future")
    early = Expire(1_000, event_id=h.next_id())
    assert h.handle(early) == [Reply(early.event_id, None)]
    assert h.handle(WriteDone((ev.event_id, 0))) == []
    assert h.handle(WriteDone((ev.event_id, 1))) == [Reply(ev.event_id, RestoreOutcome(3, ("now", "past"), ()))]
    assert h.state.leases == {**graced, "future": loaded[2]}
    assert h.state.refs.holders(tb(T1, 0), 5) == {"past", "now"}
    assert h.state.refs.holders(tb(T2, 1), 3) == {"past"}
    assert h.state.refs.holders(tb(T1, 1), 7) == {"future"}
    assert h.state.refs == RefcountIndex.from_leases(loaded)
    # nothing expires before the grace is over
    ev = Expire(1_299, event_id=h.next_id())
    assert h.handle(ev) == [Reply(ev.event_id, None)]


def test_a_second_restore_does_not_grant_the_grace_again(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.commit(tb(T1, 1), 7)
    stored = (Lease("gap", 500, {tb(T1, 0): 5}), Lease("live", 9_000, {tb(T1, 1): 7}))
    first = Restore(stored, now_ms=1_000, grace_ms=300, event_id=h.next_id())
    (write,) = of_type(h.handle(first), PersistLease)
    assert write.after == Lease("gap", 1_300, {tb(T1, 0): 5}, graced=True)
    h.handle(WriteDone(write.write_id))
    # what the first restore wrote back is what a second failover loads, after the grace ran out
    h.state = LeaseState(h.catalog, MAX_MS)
    second = Restore((write.after, stored[1]), now_ms=1_300, grace_ms=300, event_id=h.next_id())
    out = h.handle(second)
    assert out == [PersistLease((second.event_id, 0), "expire", write.after, None, frozenset({T1}))]
    out = h.handle(WriteDone((second.event_id, 0)))
    assert out == [LeasesExpired(("gap",)), SnapshotsFreed(((tb(T1, 0), 5),)),
                   Reply(second.event_id, RestoreOutcome(2, (), ("gap",)))]
    assert h.state.leases == {"live": stored[1]}
    # still within the grace: kept, with the grace it has
    h.state = LeaseState(h.catalog, MAX_MS)
    third = Restore((write.after,), now_ms=1_299, grace_ms=300, event_id=h.next_id())
    assert h.handle(third) == [Reply(third.event_id, RestoreOutcome(1, (), ()))]
    assert h.state.get("gap") == write.after


def test_renew_and_acquire_clear_the_grace_mark(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    loaded = (Lease("A", 500, {tb(T1, 0): 5}), Lease("B", 500, {tb(T1, 0): 5}))
    ev = Restore(loaded, now_ms=1_000, grace_ms=300, event_id=h.next_id())
    for write in of_type(h.handle(ev), PersistLease):
        h.handle(WriteDone(write.write_id))
    assert h.state.get("A").graced and h.state.get("B").graced
    h.now = 1_100
    out = h.run(h.release("A", tb(T1, 3)))  # release keeps the deadline, and so the mark
    assert h.state.get("A").graced
    h.run(h.renew("A"))
    h.run(h.acquire("B", {tb(T1, 0): 5}))
    assert not h.state.get("A").graced and not h.state.get("B").graced
    assert reply_of(out).error is None


def test_a_failed_grace_write_fails_the_restore_and_keeps_the_stored_deadline(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    stored = Lease("gap", 500, {tb(T1, 0): 5})
    ev = Restore((stored,), now_ms=1_000, grace_ms=300, event_id=h.next_id())
    (write,) = of_type(h.handle(ev), PersistLease)
    failure = errors.StorageError("zookeeper said no")
    assert h.handle(WriteFailed(write.write_id, failure)) == [Reply(ev.event_id, error=failure)]
    assert h.state.get("gap") == stored


# --- changed tables ------------------------------------------------------------------------------

def test_changed_tables_names_exactly_the_tables_whose_buckets_changed(h: Harness) -> None:
    for bucket, sid in ((tb(T1, 0), 5), (tb(T1, 0), 6), (tb(T2, 0), 1), (tb(T3, 0), 2)):
        h.commit(bucket, sid)
    h.lease("L", {tb(T1, 0): 5, tb(T2, 0): 1})

    def changed(event: object) -> frozenset[int]:
        out = h.handle(event)
        (write,) = of_type(out, PersistLease)
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
    (write,) = of_type(h.handle(ev), PersistLease)
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
    (write,) = of_type(h.handle(ev), PersistLease)
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
    (first,) = of_type(h.handle(h.acquire("L", {bucket: 5})), PersistLease)
    (second,) = of_type(h.handle(h.acquire("M", {bucket: 5})), PersistLease)
    out = h.handle(WriteFailed(first.write_id, errors.StorageError("boom")))
    assert not of_type(out, SnapshotsFreed)
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
