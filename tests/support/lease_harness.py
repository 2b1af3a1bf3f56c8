"""The harness of the tier-1 lease state machine tests (test_lease_state*.py).

A fake catalog answers table questions from a dict and snapshot questions from
a real SnapshotStore. Every step calls ``state.validate()``. Time is an int.
"""

from __future__ import annotations

import itertools

from kvlease.common import errors
from kvlease.common.model import Lease, SnapshotFile, SnapshotHandle, TableBucket
from kvlease.coordinator.snapshots import SnapshotStore
from kvlease.leases.state import (Acquire, Drop, LeaseState, PersistLease, Release, Renew, Reply, SnapshotsFreed,
                                  WriteDone)

MAX_MS = 60_000
T1, T2, T3 = 1, 2, 3  # T1 has 4 buckets, T2 has 2, T3 has 1


def tb(table_id: int, bucket: int, partition_id: int | None = None) -> TableBucket:
    return TableBucket(table_id, bucket, partition_id)


class FakeCatalog:
    def __init__(self, store: SnapshotStore, tables: dict[int, int]) -> None:
        self.store = store
        self.tables = tables

    def buckets_of(self, tb: TableBucket) -> tuple[str, int]:
        """Unpartitioned tables only (partitioned ones: tests/leases/test_partition_leases.py)."""
        if tb.table_id not in self.tables:
            raise errors.TableNotExistError(f"table id {tb.table_id} does not exist", table_id=tb.table_id)
        if tb.partition_id is not None:
            raise errors.InvalidRequestError(f"table {tb.table_id} is not partitioned (got partition {tb.partition_id})")
        return f"table db.t{tb.table_id}", self.tables[tb.table_id]

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
    def acquire(self, lease_id: str, snaps: dict, duration: int = 10_000, *, owner: str | None = None) -> Acquire:
        return Acquire(lease_id, dict(snaps), duration, self.now, owner, event_id=self.next_id())

    def renew(self, lease_id: str, duration: int = 10_000, *, owner: str | None = None) -> Renew:
        return Renew(lease_id, duration, self.now, owner, event_id=self.next_id())

    def release(self, lease_id: str, *buckets: TableBucket, owner: str | None = None) -> Release:
        return Release(lease_id, frozenset(buckets), self.now, owner, event_id=self.next_id())

    def drop(self, lease_id: str, *, owner: str | None = None) -> Drop:
        return Drop(lease_id, self.now, owner, event_id=self.next_id())

    def run(self, event: object) -> list[object]:
        """Handle the event and complete every write it asks for; all instructions in order."""
        out = self.handle(event)
        result = list(out)
        for write in [i for i in out if isinstance(i, PersistLease)]:
            result.extend(self.handle(WriteDone(write.write_id)))
        return result

    def lease(self, lease_id: str, snaps: dict, duration: int = 10_000, *, owner: str | None = None) -> Lease:
        """Acquire and complete; the lease as stored."""
        out = self.run(self.acquire(lease_id, snaps, duration, owner=owner))
        assert reply_of(out).error is None, out
        return self.state.get(lease_id)

    def snapshot(self) -> tuple[dict, dict]:
        return dict(self.state.leases), self.state.refs.as_dict()


def of_type(out: list[object], cls: type) -> list:
    return [i for i in out if isinstance(i, cls)]


def reply_of(out: list[object]) -> Reply:
    replies = of_type(out, Reply)
    assert len(replies) == 1, out
    return replies[0]


def freed_by(out: list[object]) -> set[tuple[TableBucket, int]]:
    return {snap for i in of_type(out, SnapshotsFreed) for snap in i.snapshots}


def only_error(out: list[object], cls: type) -> errors.KvLeaseError:
    assert len(out) == 1 and isinstance(out[0], Reply), out
    assert isinstance(out[0].error, cls), out[0].error
    return out[0].error


def changed_tables_model(before: Lease | None, after: Lease | None) -> frozenset[int]:
    """The tables whose buckets differ between two versions of a lease (a model of PersistLease.changed_tables)."""
    def by_table(lease: Lease | None) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for tb, sid in (lease.buckets.items() if lease else ()):
            out.setdefault(tb.table_id, {})[tb] = sid
        return out
    old, new = by_table(before), by_table(after)
    return frozenset(t for t in old.keys() | new.keys() if old.get(t) != new.get(t))
