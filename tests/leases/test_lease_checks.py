"""Tier 1: what the lease state machine refuses before it touches a lease (leases/checks.py).

Bad lease ids, buckets, snapshot ids and durations, through every request
that carries them: each is a typed error and nothing is written. The harness
is ``tests/support/lease_harness.py``.
"""

from __future__ import annotations

import pytest

from kvlease.common import errors
from tests.support.lease_harness import MAX_MS, T1, T3, Harness, only_error, reply_of, tb

pytestmark = pytest.mark.unit


@pytest.fixture
def h() -> Harness:
    return Harness()


BAD_IDS = ["", "a b", "x" * 129, "ü", "../x", "a/b", "a\n", ".", ".."]


@pytest.mark.parametrize("lease_id", BAD_IDS)
def test_bad_lease_ids_are_rejected_by_every_request(h: Harness, lease_id: str) -> None:
    h.commit(tb(T1, 0), 5)
    for event in (h.acquire(lease_id, {tb(T1, 0): 5}), h.renew(lease_id), h.release(lease_id, tb(T1, 0)),
                  h.drop(lease_id)):
        err = only_error(h.handle(event), errors.InvalidLeaseIdError)
        assert err.code == errors.ErrorCode.INVALID_LEASE_ID
    assert h.state.leases == {}


def test_a_128_character_lease_id_of_every_allowed_character_is_accepted(h: Harness) -> None:
    lease_id = ("A.b_c-1" + "Zz9" * 50)[:128]
    assert len(lease_id) == 128
    h.commit(tb(T1, 0), 5)
    out = h.run(h.acquire(lease_id, {tb(T1, 0): 5}))
    assert reply_of(out).error is None
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
    err = only_error(h.handle(h.acquire("L", snaps)), error)
    if error is errors.TableNotExistError:
        assert err.details["table_id"] == 99
    assert h.state.leases == {}
    assert not h.state.busy("L")


@pytest.mark.parametrize("duration", [0, -1, -MAX_MS, MAX_MS + 1])
def test_bad_durations_are_rejected_by_acquire_and_renew(h: Harness, duration: int) -> None:
    h.commit(tb(T1, 0), 5)
    lease = h.lease("L", {tb(T1, 0): 5})
    only_error(h.handle(h.acquire("M", {tb(T1, 0): 5}, duration)), errors.InvalidLeaseDurationError)
    only_error(h.handle(h.acquire("L", {tb(T1, 0): 5}, duration)), errors.InvalidLeaseDurationError)
    only_error(h.handle(h.renew("L", duration)), errors.InvalidLeaseDurationError)
    assert h.state.leases == {"L": lease}


def test_the_maximum_duration_itself_is_accepted(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    assert h.lease("L", {tb(T1, 0): 5}, MAX_MS).expiration_time == h.now + MAX_MS
    assert reply_of(h.run(h.renew("L", MAX_MS))).result == h.now + MAX_MS


def test_release_of_no_buckets_is_rejected(h: Harness) -> None:
    h.commit(tb(T1, 0), 5)
    h.lease("L", {tb(T1, 0): 5})
    only_error(h.handle(h.release("L")), errors.InvalidRequestError)
    assert h.state.get("L").buckets == {tb(T1, 0): 5}
