"""The completed-snapshot store (pure, in memory): retention and subsumption.

Per bucket it keeps the ``num_retained`` newest snapshots plus every leased
one; whatever is neither is *reclaimable* and the coordinator deletes it at
once. A remote file is deleted only when no kept snapshot uses it (SST files
are shared between a bucket's snapshots).

A snapshot of a *lost history* (committed before an unclean election, above
the new leader's log end: :meth:`kvlease.common.data_loss.DataLoss.lost_history`) is
:meth:`discard`-ed: it leaves the kept list (never the latest, never listed,
never leased anew, no obstacle to later commits) but its files stay counted
while a lease holds it (a consistent past state its reader goes on reading);
it is reclaimable as soon as no lease does.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable

from kvlease.common import errors
from kvlease.common.model import SnapshotHandle, TableBucket

IsLeased = Callable[[TableBucket, int], bool]


class SnapshotStore:
    def __init__(self, num_retained: int) -> None:
        if num_retained < 1:
            raise ValueError("kv.snapshot.num-retained must be at least 1")
        self.num_retained = num_retained
        self._by_bucket: dict[TableBucket, dict[int, SnapshotHandle]] = {}
        self._discarded: dict[TableBucket, dict[int, SnapshotHandle]] = {}  # lost history, still leased
        # physical table id -> bucket -> its latest kept snapshot's id: a lease acquire --latest of a 1,000-partition
        # table takes 4,000 of them in 1,000 dict updates (:meth:`latest_ids`), not a lookup and a max() per bucket
        self._latest: dict[int, dict[TableBucket, int]] = {}
        self._file_refs: Counter[str] = Counter()

    # -- queries -------------------------------------------------------------------

    def has_snapshot(self, tb: TableBucket, snapshot_id: int) -> bool:
        return snapshot_id in self._by_bucket.get(tb, {})

    def get(self, tb: TableBucket, snapshot_id: int) -> SnapshotHandle | None:
        return self._by_bucket.get(tb, {}).get(snapshot_id)

    def bucket_snapshots(self, tb: TableBucket) -> list[SnapshotHandle]:
        """Oldest first."""
        return [h for _, h in sorted(self._by_bucket.get(tb, {}).items())]

    def latest(self, tb: TableBucket) -> SnapshotHandle | None:
        snapshot_id = self._latest.get(tb.physical_id, {}).get(tb)
        return None if snapshot_id is None else self._by_bucket[tb][snapshot_id]

    def latest_of(self, tbs: Iterable[TableBucket]) -> list[SnapshotHandle]:
        """:meth:`latest` of each of ``tbs`` that has a snapshot, in their order (one call for a listing)."""
        return [handle for handle in map(self.latest, tbs) if handle is not None]

    def latest_ids(self, physical_ids: Iterable[int]) -> dict[TableBucket, int]:
        """bucket -> its latest kept snapshot's id, for every bucket of the physical tables ``physical_ids`` (an
        unpartitioned table's id or partitions' ids) that has one."""
        out: dict[TableBucket, int] = {}
        for physical_id in physical_ids:
            out.update(self._latest.get(physical_id, ()))
        return out

    def table_buckets(self, table_id: int, partition_id: int | None = None) -> list[TableBucket]:
        """The table's buckets with a stored snapshot (kept or discarded): every partition's, or
        ``partition_id``'s only."""
        return sorted((tb for tb in {*self._by_bucket, *self._discarded} if tb.table_id == table_id
                       and (partition_id is None or tb.partition_id == partition_id)), key=TableBucket.sort_key)

    def all(self) -> Iterable[SnapshotHandle]:
        """Every stored snapshot, the discarded ones (still leased) included."""
        for by_bucket in (self._by_bucket, self._discarded):
            for snaps in list(by_bucket.values()):
                yield from snaps.values()

    def discarded(self, tb: TableBucket) -> list[SnapshotHandle]:
        """The bucket's discarded snapshots (see the module docstring), oldest first."""
        return [h for _, h in sorted(self._discarded.get(tb, {}).items())]

    def holds(self, tb: TableBucket, snapshot_id: int) -> bool:
        """Kept or discarded: its files are still there (a lease that holds it reads on)."""
        return self.has_snapshot(tb, snapshot_id) or snapshot_id in self._discarded.get(tb, {})

    def is_retained(self, tb: TableBucket, snapshot_id: int) -> bool:
        """Among the bucket's ``num_retained`` newest snapshots."""
        ids = sorted(self._by_bucket.get(tb, {}), reverse=True)[: self.num_retained]
        return snapshot_id in ids

    def file_refcount(self, path: str) -> int:
        return self._file_refs.get(path, 0)

    # -- changes ---------------------------------------------------------------------

    def is_stored(self, handle: SnapshotHandle) -> bool:
        """This exact snapshot is stored already (its commit is sent again)."""
        existing = self.get(handle.bucket, handle.snapshot_id)
        return existing is not None and (existing.log_offset, existing.metadata_path, existing.files) == (
            handle.log_offset, handle.metadata_path, handle.files)

    def check_commit(self, handle: SnapshotHandle) -> bool:
        """False if this exact snapshot is already stored (an idempotent retry).

        Raises InvalidSnapshotError if it conflicts with what is stored.
        """
        if self.is_stored(handle):
            return False
        existing = self.get(handle.bucket, handle.snapshot_id)
        if existing is not None:
            raise errors.InvalidSnapshotError(
                f"snapshot {handle.snapshot_id} of bucket {handle.bucket} already committed with other content")
        latest = self.latest(handle.bucket)
        if latest is not None and handle.snapshot_id < latest.snapshot_id:
            raise errors.InvalidSnapshotError(
                f"snapshot {handle.snapshot_id} of bucket {handle.bucket} is older than the latest "
                f"({latest.snapshot_id})")
        if latest is not None and handle.log_offset < latest.log_offset:
            raise errors.InvalidSnapshotError(
                f"snapshot {handle.snapshot_id} of bucket {handle.bucket} has log offset {handle.log_offset} "
                f"below the latest snapshot's ({latest.log_offset})")
        if handle.snapshot_id < 0 or handle.log_offset < 0:
            raise errors.InvalidSnapshotError("snapshot id and log offset must not be negative")
        return True

    def add(self, handle: SnapshotHandle) -> None:
        self._by_bucket.setdefault(handle.bucket, {})[handle.snapshot_id] = handle
        self._file_refs.update(handle.file_paths())
        latest = self._latest.setdefault(handle.bucket.physical_id, {})
        if latest.get(handle.bucket, -1) < handle.snapshot_id:
            latest[handle.bucket] = handle.snapshot_id

    def reclaimable(self, tb: TableBucket, is_leased: IsLeased) -> list[SnapshotHandle]:
        """Snapshots of ``tb`` neither among the newest ``num_retained`` nor leased, and the discarded ones
        no lease holds."""
        ids = sorted(self._by_bucket.get(tb, {}), reverse=True)
        return ([self._by_bucket[tb][sid] for sid in ids[self.num_retained:] if not is_leased(tb, sid)]
                + [h for h in self.discarded(tb) if not is_leased(tb, h.snapshot_id)])

    def discard(self, tb: TableBucket, lost: Callable[[SnapshotHandle], bool]) -> list[SnapshotHandle]:
        """Take the kept snapshots of ``tb`` for which ``lost(handle)`` is true out of the kept list (see the
        module docstring); returns them. Idempotent."""
        snaps = self._by_bucket.get(tb, {})
        doomed = [h for _, h in sorted(snaps.items()) if lost(h)]
        for handle in doomed:
            del snaps[handle.snapshot_id]
            self._discarded.setdefault(tb, {})[handle.snapshot_id] = handle
        if not snaps:
            self._by_bucket.pop(tb, None)
        if doomed:
            self._new_latest(tb)
        return doomed

    def _new_latest(self, tb: TableBucket) -> None:
        """The latest kept snapshot of ``tb`` after one left the kept list."""
        snaps, latest = self._by_bucket.get(tb), self._latest.get(tb.physical_id, {})
        if snaps:
            latest[tb] = max(snaps)
            return
        latest.pop(tb, None)
        if not latest:
            self._latest.pop(tb.physical_id, None)

    def remove(self, handle: SnapshotHandle) -> list[str]:
        """Forget the snapshot (kept or discarded); returns the files no stored snapshot uses any more."""
        stored = None
        for by_bucket in (self._by_bucket, self._discarded):
            snaps = by_bucket.get(handle.bucket, {})
            stored = snaps.pop(handle.snapshot_id, None)
            if stored is not None:
                if not snaps:
                    del by_bucket[handle.bucket]
                if by_bucket is self._by_bucket:
                    self._new_latest(handle.bucket)
                break
        if stored is None:
            return []
        unused = []
        for path in stored.file_paths():  # the files the store counted, not the caller's copy's
            self._file_refs[path] -= 1
            if self._file_refs[path] <= 0:
                del self._file_refs[path]
                unused.append(path)
        return sorted(unused)

    def remove_table(self, table_id: int, partition_id: int | None = None) -> tuple[list[SnapshotHandle], list[str]]:
        """Forget the table's snapshots (or ``partition_id``'s only): the handles and the files no other
        snapshot uses."""
        handles = [h for tb in self.table_buckets(table_id, partition_id)
                   for h in self.bucket_snapshots(tb) + self.discarded(tb)]
        files: list[str] = []
        for handle in handles:
            files.extend(self.remove(handle))
        return handles, sorted(files)

    # -- invariants -------------------------------------------------------------------

    def validate(self, is_leased: IsLeased | None = None, leased: Iterable[tuple[TableBucket, int]] = ()) -> None:
        counts: Counter[str] = Counter()
        for handle in self.all():
            counts.update(handle.file_paths())
        assert counts == self._file_refs, "file refcounts differ from the stored snapshots"
        for tb, sid in leased:
            assert self.holds(tb, sid), f"leased snapshot {sid} of {tb} is not stored"
        for tb, snaps in self._discarded.items():
            assert not set(snaps) & set(self._by_bucket.get(tb, {})), f"bucket {tb}: a snapshot kept and discarded"
        latest: dict[int, dict[TableBucket, int]] = {}
        for tb, snaps in self._by_bucket.items():
            latest.setdefault(tb.physical_id, {})[tb] = max(snaps)
        assert latest == self._latest, "the latest snapshot ids differ from the kept snapshots"
        if is_leased is not None:
            for tb in {*self._by_bucket, *self._discarded}:
                assert not self.reclaimable(tb, is_leased), f"bucket {tb} keeps a reclaimable snapshot"
