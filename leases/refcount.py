"""The refcount index: ``TableBucket -> snapshot_id -> set(lease_id)``.

A snapshot is protected while its set is non-empty.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator

from common.model import Lease, TableBucket


class RefcountIndex:
    def __init__(self) -> None:
        self._refs: dict[TableBucket, dict[int, set[str]]] = {}

    @classmethod
    def from_leases(cls, leases: Iterable[Lease]) -> "RefcountIndex":
        index = cls()
        for lease in leases:
            for tb, sid in lease.buckets.items():
                index.add(lease.lease_id, tb, sid)
        return index

    def add(self, lease_id: str, tb: TableBucket, snapshot_id: int) -> None:
        self._refs.setdefault(tb, {}).setdefault(snapshot_id, set()).add(lease_id)

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
        return True

    def holders(self, tb: TableBucket, snapshot_id: int) -> frozenset[str]:
        return frozenset(self._refs.get(tb, {}).get(snapshot_id, ()))

    def is_leased(self, tb: TableBucket, snapshot_id: int) -> bool:
        return bool(self._refs.get(tb, {}).get(snapshot_id))

    def leased(self) -> Iterator[tuple[TableBucket, int]]:
        for tb, by_snapshot in self._refs.items():
            for sid in by_snapshot:
                yield tb, sid

    def leased_count(self) -> int:
        return sum(len(by_snapshot) for by_snapshot in self._refs.values())

    def leased_count_by_table(self) -> Counter[int]:
        counts: Counter[int] = Counter()
        for tb, by_snapshot in self._refs.items():
            counts[tb.table_id] += len(by_snapshot)
        return counts

    def as_dict(self) -> dict[TableBucket, dict[int, frozenset[str]]]:
        return {tb: {sid: frozenset(h) for sid, h in s.items()} for tb, s in self._refs.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefcountIndex) and self.as_dict() == other.as_dict()
