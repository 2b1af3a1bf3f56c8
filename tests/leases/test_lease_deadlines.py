"""Tier 1: the deadline heap and the kept counts of the lease state machine.

An expiry tick must cost what expires, not what is held; the metrics' counts
must be kept as leases change. These tests check that leases still expire at
the right time across renew, release, drop, reacquire and failed writes, that
stale heap entries never expire anything, that an idle tick and the counts
never walk the leases, and that the counts equal a recount after random
operations (with compaction forced often).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvlease.common import errors
from kvlease.common.model import Lease
from kvlease.leases import deadlines
from kvlease.leases.deadlines import Deadlines
from kvlease.leases.state import Expire, PersistLease, RemoveTable, Restore, WriteDone, WriteFailed
from tests.support.lease_harness import T1, T2, T3, Harness, of_type, reply_of, tb

pytestmark = pytest.mark.unit


def expire(h: Harness, *, settle: bool = True) -> list[str]:
    """An expiry tick at the harness clock; the leases it drops (their writes completed if ``settle``)."""
    out = h.handle(Expire(h.now, event_id=h.next_id()))
    writes = of_type(out, PersistLease)
    if settle:
        for write in writes:
            h.handle(WriteDone(write.write_id))
    return [w.lease_id for w in writes]


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    for table, buckets in ((T1, 4), (T2, 2), (T3, 1)):
        for b in range(buckets):
            harness.commit(tb(table, b), 5)
    return harness


# -- the heap itself --------------------------------------------------------------------------------


def test_pop_due_takes_only_live_due_entries_earliest_first_once_each() -> None:
    current = {"a": 30, "b": 10, "c": 50}
    heap = Deadlines([(10, "b"), (30, "a"), (50, "c"), (20, "a"), (10, "b"), (5, "gone")])
    assert heap.pop_due(9, current.get) == []
    assert heap.pop_due(30, current.get) == ["b", "a"]  # (20, a) is stale: a moved to 30; b's twin once
    assert list(heap) == [(50, "c")]
    assert heap.pop_due(10_000, current.get) == ["c"]


def test_nothing_due_is_a_peek() -> None:
    calls = []
    heap = Deadlines((1_000 + i, f"l{i}") for i in range(10_000))
    assert heap.pop_due(999, lambda lease_id: calls.append(lease_id)) == []
    assert calls == [] and len(heap) == 10_000


def test_compaction_only_when_stale_entries_dominate() -> None:
    heap = Deadlines((i, f"l{i}") for i in range(10))
    live = [(i, f"l{i}") for i in range(10)]
    assert not heap.maybe_compact(10, lambda: live)
    for i in range(2 * 10 + deadlines.FLOOR - 10):
        heap.push(100 + i, "l0")
    assert len(heap) == 2 * 10 + deadlines.FLOOR and not heap.maybe_compact(10, lambda: live)
    heap.push(5_000, "l0")
    assert heap.maybe_compact(10, lambda: live) and sorted(heap) == live


# -- expiry at the right times --------------------------------------------------------------------


def test_a_renewed_lease_expires_at_its_new_deadline_not_the_old_one(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5}, 10_000)  # deadline 11,000
    h.now = 5_000
    h.run(h.renew("L", 10_000))  # deadline 15,000; the 11,000 entry is stale
    h.now = 11_000
    assert expire(h) == []
    h.now = 14_999
    assert expire(h) == []
    h.now = 15_000
    assert expire(h) == ["L"] and h.state.get("L") is None


def test_a_release_keeps_the_deadline(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5, tb(T2, 1): 5}, 10_000)
    h.now = 2_000
    h.run(h.release("L", tb(T2, 1)))
    h.now = 10_999
    assert expire(h) == []
    h.now = 11_000
    assert expire(h) == ["L"]


def test_a_dropped_and_reacquired_lease_keeps_only_its_new_deadline(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5}, 10_000)  # 11,000
    h.run(h.drop("L"))
    h.now = 2_000
    h.lease("L", {tb(T1, 1): 5}, 20_000)  # 22,000
    h.now = 11_000
    assert expire(h) == []  # the first lease's entry names a deadline the lease no longer has
    h.now = 22_000
    assert expire(h) == ["L"]


def test_reacquire_after_expiry_replaces_the_lease_and_its_deadline(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5}, 1_000)  # 2,000
    h.now = 3_000  # past it, before any tick
    h.lease("L", {tb(T1, 1): 5}, 5_000)  # reacquire: 8,000
    assert expire(h) == []
    h.now = 8_000
    assert expire(h) == ["L"]


def test_an_expiry_whose_write_failed_is_tried_again_next_tick(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5}, 1_000)
    h.now = 2_000
    out = h.handle(Expire(h.now, event_id=h.next_id()))
    (write,) = of_type(out, PersistLease)
    h.handle(WriteFailed(write.write_id, errors.StorageError("down")))
    assert h.state.get("L") is not None
    h.now = 3_000
    assert expire(h) == ["L"]


def test_a_lease_busy_at_its_deadline_expires_at_a_later_tick(h: Harness) -> None:
    h.lease("L", {tb(T1, 0): 5}, 1_000)
    h.now = 1_500
    out = h.handle(h.acquire("L", {tb(T1, 1): 5}, 500))  # in flight; deadline would be 2,000
    (write,) = of_type(out, PersistLease)
    h.now = 2_500
    assert expire(h) == []  # busy: left for later
    h.handle(WriteFailed(write.write_id, errors.StorageError("down")))  # the old deadline (2,000) stays
    assert expire(h) == ["L"]


def test_restore_puts_every_loaded_lease_on_the_heap(h: Harness) -> None:
    loaded = tuple(Lease(f"l{i}", 10_000 + 1_000 * i, {tb(T1, i % 4): 5}) for i in range(5))
    (reply,) = h.handle(Restore(loaded, 5_000, 60_000, event_id=h.next_id()))
    assert reply.error is None
    for i in range(5):
        h.now = 10_000 + 1_000 * i
        assert expire(h) == [f"l{i}"]


# -- nothing per tick walks the leases ------------------------------------------------------------


class _NoWalk(dict):
    """A lease dict that fails the test if anything iterates it."""

    def _walk(self, *_args):
        raise AssertionError("walked every lease")

    __iter__ = values = items = keys = _walk  # type: ignore[assignment]


def test_an_idle_tick_and_the_counts_never_walk_the_leases(h: Harness) -> None:
    leases = tuple(Lease(f"l{i}", 100_000 + i, {tb(T1, i % 4): 5, tb(T2, i % 2): 5}) for i in range(2_000))
    h.handle(Restore(leases, 1_000, 60_000, event_id=h.next_id()))
    h.state.leases = _NoWalk(h.state.leases)
    assert of_type(h.state.handle(Expire(50_000, event_id=h.next_id())), PersistLease) == []
    assert h.state.lease_counts() == (2_000, {T1: 2_000, T2: 2_000})
    assert h.state.refs.leased_count() == 6
    assert h.state.refs.leased_count_by_table() == Counter({T1: 4, T2: 2})


def test_drop_table_finds_its_holders_without_walking_the_leases(h: Harness) -> None:
    h.lease("a", {tb(T1, 0): 5, tb(T2, 0): 5})
    h.lease("b", {tb(T2, 1): 5})
    h.lease("c", {tb(T1, 1): 5})
    leases = h.state.leases
    h.state.leases = _NoWalk(leases)
    out = h.state.handle(RemoveTable(T2, event_id=h.next_id()))
    assert sorted((w.lease_id, w.after is None) for w in of_type(out, PersistLease)) == [("a", False), ("b", True)]
    h.state.leases = dict(leases)
    for write in of_type(out, PersistLease):
        h.handle(WriteDone(write.write_id))
    assert h.state.lease_counts() == (2, {T1: 2})


# -- the counts equal a recount, after anything -------------------------------------------------


OPS = st.lists(st.tuples(st.sampled_from(["acquire", "renew", "release", "drop", "expire", "tick"]),
                         st.integers(0, 5), st.integers(0, 6), st.sampled_from(["done", "failed"])),
               max_size=60)
BUCKETS = [tb(T1, 0), tb(T1, 1), tb(T1, 2), tb(T1, 3), tb(T2, 0), tb(T2, 1), tb(T3, 0)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_counts_and_heap_agree_with_the_leases_after_random_operations(monkeypatch, ops) -> None:
    monkeypatch.setattr(deadlines, "FLOOR", 2)  # compact often
    h = Harness()
    for bucket in BUCKETS:
        h.commit(bucket, 5)
    for op, lease, bucket, outcome in ops:
        lease_id = f"l{lease}"
        if op == "tick":
            h.now += 1_000
            continue
        if op == "acquire":
            event = h.acquire(lease_id, {BUCKETS[bucket]: 5}, 1_000 * (1 + bucket))
        elif op == "renew":
            event = h.renew(lease_id, 1_000 * (1 + bucket))
        elif op == "release":
            event = h.release(lease_id, BUCKETS[bucket])
        elif op == "drop":
            event = h.drop(lease_id)
        else:
            due = {i for i, lease_ in h.state.leases.items() if lease_.expiration_time <= h.now}
            event = Expire(h.now, event_id=h.next_id())
        out = h.handle(event)  # validate(): heap and counts against a recount, after every step
        writes = of_type(out, PersistLease)
        if op == "expire":
            assert {w.lease_id for w in writes} == due  # nothing is ever in flight between steps here
        for write in writes:
            h.handle(WriteDone(write.write_id) if outcome == "done"
                     else WriteFailed(write.write_id, errors.StorageError("down")))
    h.now += 10_000
    for write in of_type(h.handle(Expire(h.now, event_id=h.next_id())), PersistLease):
        h.handle(WriteDone(write.write_id))
    assert h.state.leases == {} and h.state.lease_counts() == (0, {})
    assert h.state.refs.leased_count() == 0 and len(h.state._deadlines) <= 2
    reply_of([*h.handle(h.drop("l0"))])  # still answers
