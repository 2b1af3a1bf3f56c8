"""Tier 1: lease owners in the pure state machine.

A lease id names one reader at a time. A request carrying an owner token never
changes a live lease of another owner (an unowned lease's owner is None):
acquire and renew are refused with LEASE_OWNED, release and drop answer as for
an unknown lease. Without an owner, renew, release and drop act on any lease
(the operator's commands); acquire only on an unowned one. Retrying a request
with its own owner has the same outcome.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.common.model import Lease
from kvlease.leases.state import AcquireOutcome, Deferred, PersistLease, ReleaseOutcome, Restore, WriteDone
from tests.support.lease_harness import T1, Harness, freed_by, of_type, only_error, reply_of, tb

pytestmark = pytest.mark.unit


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    for bucket in range(2):
        harness.commit(tb(T1, bucket), 5)
        harness.commit(tb(T1, bucket), 6)
    return harness


def test_a_new_lease_belongs_to_the_owner_that_acquired_it_and_is_persisted_so(h: Harness) -> None:
    out = h.handle(h.acquire("L", {tb(T1, 0): 5}, owner="reader-a"))
    (write,) = of_type(out, PersistLease)
    assert write.after == Lease("L", 11_000, {tb(T1, 0): 5}, owner="reader-a")
    h.handle(WriteDone(write.write_id))
    assert h.state.get("L").owner == "reader-a"


def test_a_retried_acquire_of_the_same_owner_has_the_same_outcome(h: Harness) -> None:
    first = reply_of(h.run(h.acquire("L", {tb(T1, 0): 5}, owner="a"))).result
    again = reply_of(h.run(h.acquire("L", {tb(T1, 0): 5}, owner="a"))).result
    assert first == again == AcquireOutcome(11_000, {tb(T1, 0): 5}, {})
    assert h.state.get("L") == Lease("L", 11_000, {tb(T1, 0): 5}, owner="a")


@pytest.mark.parametrize("holder, other", [("a", "b"), ("a", None), (None, "b")])
def test_acquire_of_a_live_lease_of_another_owner_is_refused_and_changes_nothing(h: Harness, holder, other) -> None:
    before = h.lease("L", {tb(T1, 0): 5}, owner=holder)
    h.now = 2_000
    error = only_error(h.handle(h.acquire("L", {tb(T1, 0): 6, tb(T1, 1): 6}, 50_000, owner=other)),
                       errors.LeaseOwnedError)
    assert error.code == errors.ErrorCode.LEASE_OWNED and error.details == {"lease_id": "L"}
    assert "lease 'L' belongs to" in error.message and "kvlease lease drop L" in error.message
    assert h.state.get("L") == before
    assert h.state.refs.holders(tb(T1, 0), 5) == {"L"} and not h.state.refs.is_leased(tb(T1, 0), 6)


def test_an_expired_lease_of_another_owner_is_replaced_and_takes_the_new_owner(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5, tb(T1, 1): 5}, 1_000, owner="a")
    h.now = 2_000  # the deadline passed; the expiry timer has not run
    out = h.run(h.acquire("L", {tb(T1, 1): 6}, owner="b"))
    assert reply_of(out).error is None
    assert h.state.get("L") == Lease("L", 12_000, {tb(T1, 1): 6}, owner="b")
    assert freed_by(out) == {(tb(T1, 0), 5), (tb(T1, 1), 5)}


def test_renew_with_another_owner_is_refused_and_without_one_renews(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5}, owner="a")
    only_error(h.handle(h.renew("L", 30_000, owner="b")), errors.LeaseOwnedError)
    assert h.state.get("L").expiration_time == 11_000
    assert reply_of(h.run(h.renew("L", 30_000, owner="a"))).result == 31_000
    assert reply_of(h.run(h.renew("L", 40_000))).result == 41_000  # the operator's renew
    assert h.state.get("L").owner == "a"  # renewing never changes the owner


def test_release_and_drop_with_another_owner_find_no_lease_and_leave_it_alone(h: Harness) -> None:
    before = h.lease("L", {tb(T1, 0): 5, tb(T1, 1): 5}, owner="a")
    assert reply_of(h.handle(h.release("L", tb(T1, 0), owner="b"))).result == ReleaseOutcome(False, False)
    assert reply_of(h.handle(h.drop("L", owner="b"))).result is False
    assert h.state.get("L") == before
    assert reply_of(h.run(h.release("L", tb(T1, 0), owner="a"))).result == ReleaseOutcome(True, True)
    assert reply_of(h.run(h.release("L", tb(T1, 0), owner="a"))).result == ReleaseOutcome(False, True)  # a retry


def test_the_operators_release_and_drop_act_on_an_owned_lease(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5, tb(T1, 1): 5}, owner="a")
    assert reply_of(h.run(h.release("L", tb(T1, 0)))).result == ReleaseOutcome(True, True)
    out = h.run(h.drop("L"))
    assert reply_of(out).result is True and h.state.get("L") is None
    assert freed_by(out) == {(tb(T1, 1), 5)}
    # the id is free again: any reader may take it
    assert h.lease("L", {tb(T1, 0): 6}, owner="b").owner == "b"


@pytest.mark.parametrize("owner", ["", "a/b", "x" * 129, "..", "ü"])
def test_a_bad_owner_is_refused_by_every_request(h: Harness, owner: str) -> None:
    h.lease("L", {tb(T1, 0): 5})
    for ev in (h.acquire("L", {tb(T1, 0): 5}, owner=owner), h.renew("L", owner=owner),
               h.release("L", tb(T1, 0), owner=owner), h.drop("L", owner=owner)):
        assert "bad lease owner" in only_error(h.handle(ev), errors.InvalidLeaseIdError).message
    assert h.state.get("L").owner is None


def test_a_request_for_a_lease_with_a_write_in_flight_waits_before_its_owner_is_checked(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5}, 1_000, owner="a")
    h.now = 2_000
    taking = h.acquire("L", {tb(T1, 0): 6}, owner="b")  # replaces the expired lease
    (write,) = of_type(h.handle(taking), PersistLease)
    late = h.acquire("L", {tb(T1, 1): 6}, owner="a")  # the old owner, not yet told its lease is gone
    assert h.handle(late) == [Deferred(late)]
    h.handle(WriteDone(write.write_id))
    only_error(h.handle(late), errors.LeaseOwnedError)
    assert h.state.get("L") == Lease("L", 12_000, {tb(T1, 0): 6}, owner="b")


def test_the_failover_grace_keeps_the_owner(h: Harness) -> None:
    lease = Lease("L", 1_500, {tb(T1, 0): 5}, owner="a")
    out = h.handle(Restore((lease,), now_ms=2_000, grace_ms=300, event_id=h.next_id()))
    (write,) = of_type(out, PersistLease)
    assert write.after == replace(lease, expiration_time=2_300, graced=True)
    h.handle(WriteDone(write.write_id))
    h.now = 2_100
    only_error(h.handle(h.acquire("L", {tb(T1, 0): 6}, owner="b")), errors.LeaseOwnedError)
