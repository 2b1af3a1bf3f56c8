"""Tier 1: the refcount index ``TableBucket -> snapshot_id -> set(lease_id)``."""

from __future__ import annotations

from collections import Counter

import pytest

from kvlease.common.model import Lease, TableBucket
from kvlease.leases.refcount import RefcountIndex

pytestmark = pytest.mark.unit

A = TableBucket(1, 0)
B = TableBucket(1, 1)
C = TableBucket(2, 0)
P = TableBucket(1, 0, partition_id=3)  # same table and bucket as A, another partition


def test_an_empty_index_holds_nothing() -> None:
    index = RefcountIndex()
    assert not index.is_leased(A, 1)
    assert index.holders(A, 1) == frozenset()
    assert list(index.leased()) == []
    assert index.leased_count() == 0
    assert index.leased_count_by_table() == Counter()
    assert index.remove("L", A, 1) is False  # nothing to remove: nothing freed


def test_add_and_holders() -> None:
    index = RefcountIndex()
    index.add("L", A, 5)
    index.add("M", A, 5)
    index.add("L", A, 5)  # twice: still one holder
    index.add("L", B, 5)
    assert index.holders(A, 5) == {"L", "M"}
    assert index.holders(B, 5) == {"L"}
    assert index.holders(A, 6) == frozenset()
    assert index.is_leased(A, 5) and index.is_leased(B, 5)
    assert not index.is_leased(C, 5)
    assert not index.is_leased(P, 5)  # partitions are distinct buckets
    assert sorted(index.leased()) == [(A, 5), (B, 5)]


def test_remove_reports_free_only_when_the_last_holder_goes() -> None:
    index = RefcountIndex()
    index.add("L", A, 5)
    index.add("M", A, 5)
    assert index.remove("L", A, 5) is False
    assert index.holders(A, 5) == {"M"}
    assert index.remove("L", A, 5) is False  # L already gone: nothing changes
    assert index.remove("X", A, 5) is False  # never a holder
    assert index.is_leased(A, 5)
    assert index.remove("M", A, 5) is True
    assert not index.is_leased(A, 5)
    assert index.as_dict() == {}  # empty inner maps are pruned
    assert index == RefcountIndex()


def test_remove_of_one_snapshot_leaves_the_bucket_s_others() -> None:
    index = RefcountIndex()
    index.add("L", A, 5)
    index.add("L", A, 6)
    assert index.remove("L", A, 5) is True
    assert index.is_leased(A, 6)
    assert index.as_dict() == {A: {6: frozenset({"L"})}}


def test_counts() -> None:
    index = RefcountIndex()
    index.add("L", A, 5)
    index.add("M", A, 5)  # one snapshot, two holders: counted once
    index.add("L", A, 6)
    index.add("L", B, 1)
    index.add("N", C, 9)
    index.add("N", P, 2)
    assert index.leased_count() == 5
    assert index.leased_count_by_table() == Counter({1: 4, 2: 1})
    assert index.leased_count_by_partition() == Counter({(1, 3): 1})  # A, B and C are of no partition
    index.add("N", P, 3)
    assert index.remove("N", P, 2) and index.leased_count_by_partition() == Counter({(1, 3): 1})
    assert index.remove("N", P, 3) and index.leased_count_by_partition() == Counter()
    assert index.recount() == (index.leased_count(), index.leased_count_by_table(), Counter())


def test_from_leases_equals_adding_by_hand() -> None:
    leases = [
        Lease("L", 10, {A: 5, B: 1}),
        Lease("M", 20, {A: 5, C: 9}),
        Lease("N", 30, {A: 6}),
    ]
    by_hand = RefcountIndex()
    for lease_id, tb, sid in [("L", A, 5), ("L", B, 1), ("M", A, 5), ("M", C, 9), ("N", A, 6)]:
        by_hand.add(lease_id, tb, sid)
    built = RefcountIndex.from_leases(leases)
    assert built == by_hand
    assert built.holders(A, 5) == {"L", "M"}
    assert built.as_dict() == {A: {5: frozenset({"L", "M"}), 6: frozenset({"N"})},
                               B: {1: frozenset({"L"})}, C: {9: frozenset({"M"})}}
    assert RefcountIndex.from_leases([]) == RefcountIndex()


def test_add_all_equals_adding_one_by_one_counts_included() -> None:
    pairs = [(A, 5), (B, 1), (A, 6), (P, 5)]
    one_by_one, at_once = RefcountIndex(), RefcountIndex()
    for index in (one_by_one, at_once):
        index.add("M", A, 5)  # held already by another lease
    for tb, sid in pairs:
        one_by_one.add("L", tb, sid)
    at_once.add_all("L", pairs)
    at_once.add_all("L", [(A, 5)])  # again: still one holder
    assert at_once == one_by_one and at_once.holders(A, 5) == {"L", "M"}
    counts = (at_once.leased_count(), at_once.leased_count_by_table(), at_once.leased_count_by_partition())
    assert counts == at_once.recount() == (4, Counter({1: 4}), Counter({(1, 3): 1}))


def test_equality_compares_contents() -> None:
    one, two = RefcountIndex(), RefcountIndex()
    one.add("L", A, 5)
    assert one != two
    two.add("L", A, 5)
    assert one == two
    two.add("M", A, 5)
    assert one != two
    two.remove("M", A, 5)
    assert one == two
    assert one != {A: {5: {"L"}}}  # not equal to a plain dict
    assert one != "L"


def test_as_dict_is_a_copy() -> None:
    index = RefcountIndex()
    index.add("L", A, 5)
    snapshot = index.as_dict()
    index.add("M", A, 5)
    assert snapshot == {A: {5: frozenset({"L"})}}
    held = index.holders(A, 5)
    index.remove("L", A, 5)
    assert held == {"L", "M"}  # holders() is a frozen copy too
