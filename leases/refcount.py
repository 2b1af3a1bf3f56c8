"""The refcount index: ``TableBucket -> snapshot_id -> set(lease_id)``.

A snapshot is protected while its set is non-empty. The number of leased
snapshots, in all, per table and per partition, is kept as references come and go (the
metrics read it every tick: it must not cost a walk over the index).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator

from kvlease.common.model import Lease, TableBucket

_NONE: frozenset[str] = frozenset()


class RefcountIndex:
    def __init__(self) -> None:
        self._refs: dict[TableBucket, dict[int, set[str]]] = {}
        self._leased = 0  # (bucket, snapshot) pairs with at least one holder
        self._leased_by_table: Counter[int] = Counter()
        self._leased_by_partition: Counter[tuple[int, int]] = Counter()  # (table id, partition id)

    @classmethod
    def from_leases(cls, leases: Iterable[Lease]) -> "RefcountIndex":
        """The index of these leases (at failover: 100,000 of them, each added by :meth:`add_all`)."""
        index = cls()
        for lease in leases:
            index.add_all(lease.lease_id, lease.buckets.items())
        return index

    def add(self, lease_id: str, tb: TableBucket, snapshot_id: int) -> None:
        by_snapshot = self._refs.setdefault(tb, {})
        holders = by_snapshot.get(snapshot_id)
        if holders is None:
            holders = by_snapshot[snapshot_id] = set()
            self._leased += 1
            self._leased_by_table[tb.table_id] += 1
            if tb.partition_id is not None:
                self._leased_by_partition[tb.table_id, tb.partition_id] += 1
        holders.add(lease_id)

    def add_all(self, lease_id: str, pairs: Iterable[tuple[TableBucket, int]]) -> None:
        """:meth:`add` of each (bucket, snapshot id) of ``pairs`` (an acquire of 4,000 buckets: inlined)."""
        refs, by_table, by_partition = self._refs, self._leased_by_table, self._leased_by_partition
        for tb, snapshot_id in pairs:
            by_snapshot = refs.get(tb)
            if by_snapshot is None:
                by_snapshot = refs[tb] = {}
            holders = by_snapshot.get(snapshot_id)
            if holders is None:
                by_snapshot[snapshot_id] = {lease_id}
                self._leased += 1
                by_table[tb.table_id] += 1
                if tb.partition_id is not None:
                    by_partition[tb.table_id, tb.partition_id] += 1
            else:
                holders.add(lease_id)

    def remove(self, lease_id: str, tb: TableBucket, snapshot_id: int) -> bool:
        """Drop one reference; True if the snapshot is no longer leased by anyone."""
        by_snapshot = self._refs.get(tb)
        holders = by_snapshot.get(snapshot_id) if by_snapshot else None
        if holders is None:
            return False
        holders.discard(lease_id)
        if holders:
            return False
        del by_snapshot[snapshot_id]
        if not by_snapshot:
            del self._refs[tb]
        self._leased -= 1
        self._leased_by_table[tb.table_id] -= 1
        if not self._leased_by_table[tb.table_id]:
            del self._leased_by_table[tb.table_id]
        if tb.partition_id is not None:
            self._leased_by_partition[tb.table_id, tb.partition_id] -= 1
            if not self._leased_by_partition[tb.table_id, tb.partition_id]:
                del self._leased_by_partition[tb.table_id, tb.partition_id]
        return True

    def holders(self, tb: TableBucket, snapshot_id: int) -> frozenset[str]:
        by_snapshot = self._refs.get(tb)
        held = by_snapshot.get(snapshot_id) if by_snapshot else None
        return frozenset(held) if held else _NONE

    def is_leased(self, tb: TableBucket, snapshot_id: int) -> bool:
        return bool(self._refs.get(tb, {}).get(snapshot_id))

    def leased(self) -> Iterator[tuple[TableBucket, int]]:
        for tb, by_snapshot in self._refs.items():
            for sid in by_snapshot:
                yield tb, sid

    def holders_of_table(self, table_id: int) -> set[str]:
        """Every lease holding a bucket of the table (a walk over the leased buckets, not the leases)."""
        return {lease_id for tb, by_snapshot in self._refs.items() if tb.table_id == table_id
                for holders in by_snapshot.values() for lease_id in holders}

    def holders_of_partition(self, table_id: int, partition_id: int) -> set[str]:
        """Every lease holding a bucket of the partition."""
        return {lease_id for tb, by_snapshot in self._refs.items()
                if tb.table_id == table_id and tb.partition_id == partition_id
                for holders in by_snapshot.values() for lease_id in holders}

    def held_partitions(self, table_id: int) -> dict[int, set[str]]:
        """The table's partitions some lease holds a bucket of: partition id -> lease ids (one walk)."""
        held: dict[int, set[str]] = {}
        for tb, by_snapshot in self._refs.items():
            if tb.table_id == table_id and tb.partition_id is not None:
                held.setdefault(tb.partition_id, set()).update(*by_snapshot.values())
        return held

    def holder_counts_by_table(self) -> Counter[int]:
        """Per table, how many leases hold a bucket of it (set unions in C: cheap even for 100,000)."""
        tables: dict[int, list[set[str]]] = {}
        for tb, by_snapshot in self._refs.items():
            tables.setdefault(tb.table_id, []).extend(by_snapshot.values())
        return Counter({table_id: len(set().union(*holders)) for table_id, holders in tables.items()})

    def leased_count(self) -> int:
        """Snapshots held by at least one lease (kept up to date: O(1))."""
        return self._leased

    def leased_count_by_table(self) -> Counter[int]:
        """:meth:`leased_count` per table (kept up to date: O(tables))."""
        return Counter(self._leased_by_table)

    def leased_count_by_partition(self) -> Counter[tuple[int, int]]:
        """:meth:`leased_count` per partition, by (table id, partition id) (kept up to date: O(partitions))."""
        return Counter(self._leased_by_partition)

    def recount(self) -> tuple[int, Counter[int], Counter[tuple[int, int]]]:
        """:meth:`leased_count`, :meth:`leased_count_by_table` and :meth:`leased_count_by_partition` counted
        again from the index."""
        counts: Counter[int] = Counter()
        partitions: Counter[tuple[int, int]] = Counter()
        for tb, by_snapshot in self._refs.items():
            counts[tb.table_id] += len(by_snapshot)
            if tb.partition_id is not None:
                partitions[tb.table_id, tb.partition_id] += len(by_snapshot)
        return sum(counts.values()), +counts, +partitions

    def as_dict(self) -> dict[TableBucket, dict[int, frozenset[str]]]:
        return {tb: {sid: frozenset(h) for sid, h in s.items()} for tb, s in self._refs.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefcountIndex) and self.as_dict() == other.as_dict()
