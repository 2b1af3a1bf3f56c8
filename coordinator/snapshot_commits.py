"""Completed snapshots on ZooKeeper: commits, listing, and eager reclaim.

The rules (retention, subsumption, shared files) are the pure
:class:`~kvlease.coordinator.snapshots.SnapshotStore`'s; this module writes its
decisions to ``/snapshots/...`` (epoch-fenced) and hands the files no kept
snapshot uses to the :class:`~kvlease.coordinator.file_gc.FileCollector`. A snapshot
that is neither retained nor leased is deleted as soon as that becomes true:
on commit, and whenever leases free snapshots. Files no stored snapshot ever
named (orphans) are :mod:`kvlease.coordinator.orphan_files`'s; a commit naming one it
deleted is refused.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import errors, zkpaths
from kvlease.common.data_loss import DataLoss
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.tables import TableInfo
from kvlease.common.zk import ZkOp, dumps, loads
from kvlease.coordinator.fencing import MAX_OPS_PER_MULTI, FencedWriter, check_write_size
from kvlease.coordinator.file_gc import FileCollector
from kvlease.coordinator.snapshot_checks import check_not_reclaimed, check_paths
from kvlease.coordinator.snapshots import IsLeased, SnapshotStore
from kvlease.coordinator.zk_reads import CHILDREN, DATA, Reads, read_many

log = logging.getLogger(__name__)

#: (handle, ids of the leases holding it, retained) per listed snapshot
SnapshotRow = tuple[SnapshotHandle, tuple[str, ...], bool]


class SnapshotCommits:
    def __init__(self, zk: KazooClient, files: FileCollector, *, num_retained: int, clock_ms: Callable[[], int],
                 is_protected: IsLeased, holders: Callable[[TableBucket, int], frozenset[str]],
                 reclaimed: Callable[[str], bool] = lambda path: False) -> None:
        """``reclaimed(path)``: the orphan reclaim deleted the file (``coordinator/orphan_files.py``)."""
        self.zk = zk
        self.reclaimed = reclaimed
        self.files = files
        self.clock_ms = clock_ms
        self.is_protected = is_protected  # leased, or about to be (a lease write in flight names it)
        self.holders = holders
        self.store = SnapshotStore(num_retained)
        self.writer: FencedWriter | None = None

    def start_load(self, tables: Iterable[TableInfo]) -> tuple[list[str], Reads]:
        """The first half of :meth:`load`: every bucket's listing asked (in multiReads:
        :mod:`kvlease.coordinator.zk_reads`), not waited for, so a reinitialization reads other nodes
        meanwhile. Hand what it returns to :meth:`finish_load`."""
        parents = [zkpaths.bucket_snapshots(t.table_id, bucket, t.partition_id) for t in tables
                   for bucket in range(t.buckets)]
        return parents, Reads(self.zk, [(CHILDREN, p) for p in parents])

    def finish_load(self, listings: tuple[list[str], Reads]) -> None:
        """The second half of :meth:`load`: each listed handle read."""
        self.store = SnapshotStore(self.store.num_retained)
        parents, reads = listings
        paths = []
        for parent, children in zip(parents, reads.results()):
            if isinstance(children, NoNodeError):  # a bucket with no snapshot yet
                continue
            if isinstance(children, Exception):
                raise children
            paths.extend(f"{parent}/{sid}" for sid in children)
        for answer in read_many(self.zk, [(DATA, path) for path in paths]):
            if isinstance(answer, Exception):
                raise answer
            self.store.add(SnapshotHandle.from_json(loads(answer[0])))

    # -- commits and listing ---------------------------------------------------------

    def commit(self, table: TableInfo, handle: SnapshotHandle, fence: Callable[[], None] = lambda: None) -> None:
        """Store ``handle``; ``fence()`` may refuse a new snapshot (never a retry of a stored one: its answer
        was lost, the tablet server must not delete its files)."""
        if handle.bucket.partition_id != table.partition_id or not 0 <= handle.bucket.bucket < table.buckets:
            raise errors.BucketOutOfRangeError(f"bucket {handle.bucket} does not exist in {table.where}")
        check_paths(handle)  # its files are deleted when it is reclaimed: never any outside its bucket
        if self.store.is_stored(handle):
            return  # the same snapshot again: an idempotent retry
        fence()  # first: a deposed leader is told so (it deletes its upload), whatever else is wrong
        check_not_reclaimed(handle, self.reclaimed)
        self.store.check_commit(handle)
        if not handle.commit_time_ms:
            handle = SnapshotHandle(handle.bucket, handle.snapshot_id, handle.log_offset, handle.metadata_path,
                                    handle.files, self.clock_ms())
        path = zkpaths.snapshot(table.table_id, handle.bucket.bucket, handle.snapshot_id, table.partition_id)
        data = dumps(handle.to_json())
        check_write_size(f"the handle of snapshot {handle.snapshot_id} of bucket {handle.bucket} "
                         f"({len(handle.files)} files)", len(data))
        self.writer.commit([ZkOp("create", path, data)])
        self.store.add(handle)
        self.reclaim([handle.bucket])

    def latest_ids(self, tables: Iterable[TableInfo]) -> dict[TableBucket, int]:
        """bucket -> its latest snapshot's id, for every bucket of the physical ``tables`` that has one."""
        return self.store.latest_ids(table.physical_id for table in tables)

    def rows(self, table: TableInfo, latest_only: bool) -> list[SnapshotRow]:
        """Per bucket of the physical table, oldest first: (handle, the leases holding it, retained); with
        ``latest_only`` the latest of each bucket that has one (always retained: it is among the newest)."""
        rows = []
        if latest_only:  # 4,000 buckets for a 1,000-partition table's lease acquire --latest: kept lean
            holders, ordered = self.holders, {}  # the buckets share a few holder sets: each sorted once
            for handle in self.store.latest_of(table.all_buckets):
                held = holders(handle.bucket, handle.snapshot_id)
                if held:
                    names = ordered.get(held)
                    if names is None:
                        names = ordered[held] = tuple(sorted(held))
                    rows.append((handle, names, True))
                else:
                    rows.append((handle, (), True))
            return rows
        for bucket in range(table.buckets):
            tb = table.bucket(bucket)
            for h in self.store.bucket_snapshots(tb):
                rows.append((h, tuple(sorted(self.holders(tb, h.snapshot_id))),
                             self.store.is_retained(tb, h.snapshot_id)))
        return rows

    # -- deletes ------------------------------------------------------------------------

    def drop_lost_history(self, tb: TableBucket, losses: Iterable[DataLoss]) -> list[SnapshotHandle]:
        """Take the bucket's snapshots of a lost history (:meth:`DataLoss.lost_history`: committed before an
        unclean election, above the new leader's log end) out of its kept list, and delete those no lease
        holds now (the others once their last lease ends); returns the ones taken out. Idempotent: run when
        a new leader reports its takeover and again at every failover (a crash in between loses nothing).
        """
        losses = [loss for loss in losses if loss.resolved and loss.newest_snapshot_id]
        dropped = self.store.discard(tb, lambda h: any(loss.lost_history(h.snapshot_id, h.log_offset)
                                                       for loss in losses))
        if dropped:
            held = [h.snapshot_id for h in dropped if self.is_protected(tb, h.snapshot_id)]
            log.warning("bucket %s: snapshots %s hold a history lost by an unclean election: no longer kept%s",
                        tb, [h.snapshot_id for h in dropped],
                        f" (deleted once leases release {held})" if held else "")
            self.reclaim([tb])
        return dropped

    def reclaim(self, buckets: Iterable[TableBucket]) -> None:
        """Delete every snapshot of these buckets that is neither retained nor leased, now.

        Snapshots named by a lease write in flight count as leased
        (``LeaseState.is_protected``), though reclaim runs after flushes anyway.
        """
        doomed = [h for tb in buckets for h in self.store.reclaimable(tb, self.is_protected)]
        for start in range(0, len(doomed), MAX_OPS_PER_MULTI):
            chunk = doomed[start:start + MAX_OPS_PER_MULTI]
            ops = [ZkOp("delete", zkpaths.snapshot(h.bucket.table_id, h.bucket.bucket, h.snapshot_id,
                                                   h.bucket.partition_id)) for h in chunk]
            try:
                self.writer.commit(ops)
            except errors.StorageError as exc:  # stays stored; retried at the next change or failover
                log.warning("could not delete %d snapshot handles: %s", len(chunk), exc)
                continue
            files: list[str] = []
            for handle in chunk:
                files.extend(self.store.remove(handle))
            log.info("reclaimed %d snapshots (%d files)", len(chunk), len(files))
            self.files.delete(files)

    def delete_handles(self, table_id: int, partition_id: int | None = None) -> None:
        """A table (or one of its partitions) is being dropped: delete its snapshot handles from ZooKeeper
        (memory: :meth:`forget_table`)."""
        handles = [h for tb in self.store.table_buckets(table_id, partition_id)
                   for h in self.store.bucket_snapshots(tb) + self.store.discarded(tb)]
        for start in range(0, len(handles), MAX_OPS_PER_MULTI):
            self.writer.commit([ZkOp("delete", zkpaths.snapshot(h.bucket.table_id, h.bucket.bucket, h.snapshot_id,
                                                                h.bucket.partition_id))
                                for h in handles[start:start + MAX_OPS_PER_MULTI]])

    def forget_table(self, table_id: int, partition_id: int | None = None) -> None:
        """The table (or one of its partitions) is dropped: forget its snapshots and delete all its files."""
        _handles, files = self.store.remove_table(table_id, partition_id)
        self.files.delete_table(table_id, files, partition_id)
