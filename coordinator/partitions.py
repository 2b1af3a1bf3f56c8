"""Partitions of partitioned tables: create, drop, list; auto-partitioning and retention (docs/partitions.md).

A partition is made like a table: its nodes and its leadership plan in one
fenced multi-op, then memory, then the new leaders are told. It is dropped
like a table: first no lease may point at it (the lease machine's
:class:`~kvlease.leases.events.RemoveTable` naming the partition, persisted
like a release), then its snapshot handles, then its node and assignment in
one multi-op, then its files; its replicas delete their local data when told.

Retention never drops what a reader holds: a partition past retention that a
lease holds a snapshot of is kept (:attr:`Partitions.held`) and dropped as
soon as no lease holds it (:meth:`Partitions.drop_released`, after every
lease change that frees buckets), or at the next check after a failover.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable

from kvlease.common import auto_partition, errors
from kvlease.common.partition_names import parse_partition_name, partition_name
from kvlease.common.tables import MAX_PARTITIONS, TableInfo
from kvlease.coordinator import requests as rq
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.fencing import FencedWriter
from kvlease.coordinator.lease_shell import LeaseShell
from kvlease.coordinator.membership import Membership
from kvlease.coordinator.snapshot_commits import SnapshotCommits
from kvlease.leases import events as le

log = logging.getLogger(__name__)


class Partitions:
    def __init__(self, catalog: TableCatalog, members: Membership, leases: LeaseShell, snapshots: SnapshotCommits,
                 clock_ms: Callable[[], int]) -> None:
        self.catalog = catalog
        self.members = members
        self.leases = leases
        self.snapshots = snapshots
        self.clock_ms = clock_ms
        self.writer: FencedWriter | None = None
        #: Partitions past retention that a lease holds: partition id -> the holding leases when last checked.
        self.held: dict[int, set[str]] = {}
        #: Run with a dropped partition's id (its bucket leaders' stored log ends go: coordinator/log_ends.py).
        self.on_removed: Callable[[int], None] = lambda partition_id: None

    # -- by hand (and by writes) ----------------------------------------------------------

    def create(self, request: rq.CreatePartition) -> tuple[TableInfo, TableInfo]:
        """The table and the partition's view; a retried create of one that exists answers it
        (``ignore_if_exists``: a writer's dynamic creation) or PartitionAlreadyExistsError."""
        table = self._partitioned(request.database, request.name)
        name = self.name_of(table, request.partition)
        existing = self.catalog.partition(table, name)
        if existing is not None:
            if request.ignore_if_exists:
                return table, existing
            raise errors.PartitionAlreadyExistsError(f"partition {name} of table {table.path} already exists",
                                                     table=table.path, partition=name)
        auto = table.auto_partition
        cutoff = None if auto is None else auto_partition.retention_cutoff(auto, self.clock_ms())
        if cutoff is not None and name < cutoff:  # the next check would drop it again
            raise errors.InvalidRequestError(f"partition {name} of table {table.path} is past the table's retention "
                                             f"({auto.retention} {auto.unit.name.lower()}s: the oldest kept is "
                                             f"{cutoff}): not made", table=table.path, partition=name)
        return table, self.make(table, name)

    def make(self, table: TableInfo, name: str) -> TableInfo:
        """Create partition ``name`` (a checked name that does not exist yet)."""
        count = len(self.catalog.partitions.get(table.table_id, {}))
        if count >= table.max_partitions:
            raise errors.TooManyPartitionsError(
                f"table {table.path} has {count} partitions, its most (table.partition.max {table.max_partitions}): "
                f"drop partitions (kvlease partition drop), lower its retention or raise table.partition.max "
                f"(kvlease table alter {table.path} --max-partitions N)", table=table.path)
        now = self.clock_ms()
        view, ops = self.catalog.create_partition_ops(table, name, now)
        plan, assignment_op = self.members.plan_table(view)
        self.writer.commit(ops + [assignment_op])
        self.catalog.add_partition(view, now)
        self.members.table_created(view, plan)
        log.info("created partition %s of table %s (id %d)", name, table.path, view.partition_id)
        return view

    def drop(self, request: rq.DropPartition) -> None:
        """The operator's word: the partition leaves every lease that holds it, then it is dropped. A retry of
        a drop that was done (``ignore_if_not_exists``) succeeds; otherwise PartitionNotExistsError."""
        table = self._partitioned(request.database, request.name)
        name = self.name_of(table, request.partition, check_time=False)
        view = self.catalog.partition(table, name)
        if view is None:
            if request.ignore_if_not_exists:
                return None
            raise errors.PartitionNotExistsError(f"partition {name} of table {table.path} does not exist",
                                                 table=table.path, partition=name)
        self.leases.call(le.RemoveTable(view.table_id, view.partition_id))
        self.remove(view)
        return None

    def remove(self, view: TableInfo) -> None:
        """Drop a partition no lease holds: its snapshot handles, its nodes and assignment, then its files."""
        self.snapshots.delete_handles(view.table_id, view.partition_id)
        holders = self.members.assignments.holders_of(view.partition_id)
        self.writer.commit(self.members.drop_ops(view.partition_id) + self.catalog.drop_partition_ops(view))
        self.catalog.remove_partition(view)
        self.held.pop(view.partition_id, None)
        self.members.table_dropped(view.partition_id, holders)
        self.on_removed(view.partition_id)
        self.snapshots.forget_table(view.table_id, view.partition_id)
        log.info("dropped partition %s of table %s (id %d)", view.partition_name, view.path, view.partition_id)

    def list(self, request: rq.ListPartitions) -> tuple[TableInfo, list[tuple[TableInfo, int, tuple[str, ...]]]]:
        """The table and its partitions: (view, created ms, leases holding it past retention)."""
        table = (self.catalog.get(request.database, request.name) if request.database or request.name
                 else self.catalog.get_by_id(request.table_id))
        held = self._held_past_retention(table)
        rows = [(view, self.catalog.partition_created_ms.get(view.partition_id, 0),
                 tuple(sorted(held.get(view.partition_id, ())))) for view in self.catalog.partitions_of(table.table_id)]
        return table, rows

    def _held_past_retention(self, table: TableInfo) -> dict[int, set[str]]:
        """``partition id -> leases`` of the table's partitions past retention that leases hold, as of now (not
        of the last check: a coordinator that took over lists them before its first check)."""
        return {pid: holders for _name, pid, holders in self._expired(table, self.clock_ms()) if holders}

    def _expired(self, table: TableInfo, now: int) -> list[tuple[str, int, set[str]]]:
        """``(name, partition id, leases holding it)`` of each of the auto-partitioned table's partitions past
        retention at ``now`` (the lease index is walked only if there is one)."""
        if table.auto_partition is None:
            return []
        names = self.catalog.partitions.get(table.table_id, {})
        expired = auto_partition.expired(table.auto_partition, now, list(names))
        held_by = self.leases.state.refs.held_partitions(table.table_id) if expired else {}
        return [(name, names[name], held_by.get(names[name], set())) for name in expired]

    def alter(self, request: rq.AlterTable) -> TableInfo:
        """Change a partitioned table's precreate, retention or partition cap; applied at once."""
        table = self._partitioned(request.database, request.name)
        auto = table.auto_partition
        if auto is None and (request.precreate is not None or request.retention is not None):
            raise errors.InvalidTableError(f"table {table.path} is not auto-partitioned: it has no precreate or "
                                           f"retention to change")
        if auto is not None:
            auto = auto_partition.AutoPartition(
                auto.unit, auto.precreate if request.precreate is None else request.precreate,
                auto.retention if request.retention is None else request.retention, auto.time_zone)
        cap = table.max_partitions if request.max_partitions is None else request.max_partitions
        if not 1 <= cap <= MAX_PARTITIONS:
            raise errors.InvalidTableError(f"table.partition.max must be between 1 and {MAX_PARTITIONS}, got {cap}")
        if auto is not None:
            auto.check_fits(cap)
        altered = replace(table, auto_partition=auto, max_partitions=cap)
        if altered == table:
            return table
        self.writer.commit(self.catalog.alter_ops(altered))
        self.catalog.replace(altered)
        log.info("altered table %s: auto-partition %s, table.partition.max %d", table.path,
                 auto.to_json() if auto else None, cap)
        if auto is not None:
            self.check_now(altered)
        return altered

    def check_now(self, table: TableInfo) -> None:
        """One table's check at once (a table just made or altered); a failure is logged, the next check
        tries again."""
        try:
            self.check_table(table)
        except (errors.CoordinatorFencedError, errors.OutcomeUnknownError):
            raise
        except errors.KvLeaseError as exc:
            log.warning("auto-partitioning of table %s: %s", table.path, exc.message)

    # -- the timer: auto-partitioning and retention ---------------------------------------

    def check(self, _request: rq.CheckAutoPartitions | None = None) -> dict[str, int]:
        """Every auto-partitioned table: drop the partitions past retention no lease holds (those a lease
        holds are kept in :attr:`held`), then make the upcoming ones. A table whose step fails is logged
        and left to the next check; the others go on."""
        now, done = self.clock_ms(), {"created": 0, "dropped": 0, "held": 0}
        for table in list(self.catalog.by_id.values()):
            if table.auto_partition is None:
                continue
            try:
                self.check_table(table, now, done)
            except errors.KvLeaseError as exc:
                log.warning("auto-partitioning of table %s: %s", table.path, exc.message)
        return done

    def check_table(self, table: TableInfo, now: int | None = None, done: dict[str, int] | None = None) -> None:
        """One auto-partitioned table's check (``done``: the counts to add to)."""
        now = self.clock_ms() if now is None else now
        done = {"created": 0, "dropped": 0, "held": 0} if done is None else done
        auto = table.auto_partition
        for name, partition_id, holders in self._expired(table, now):
            view = self.catalog.physical[partition_id]
            if holders:
                if view.partition_id not in self.held:
                    log.info("partition %s of table %s is past retention; kept while leases %s hold it", name,
                             table.path, sorted(holders))
                self.held[view.partition_id] = set(holders)
                done["held"] += 1
                continue
            self.remove(view)
            done["dropped"] += 1
        for name in auto_partition.to_create(auto, now):
            if name not in self.catalog.partitions.get(table.table_id, {}):
                self.make(table, name)
                done["created"] += 1

    def drop_released(self) -> int:
        """Drop the partitions kept past retention that no lease holds any more (after lease changes)."""
        dropped = 0
        for partition_id in sorted(self.held):
            view = self.catalog.physical.get(partition_id)
            if view is None:
                self.held.pop(partition_id, None)
                continue
            holders = self.leases.state.refs.holders_of_partition(view.table_id, partition_id)
            if holders:
                self.held[partition_id] = holders
                continue
            self.remove(view)
            dropped += 1
        return dropped

    # -- names ------------------------------------------------------------------------------

    def _partitioned(self, database: str, name: str) -> TableInfo:
        table = self.catalog.get(database, name)
        if not table.partitioned:
            raise errors.InvalidRequestError(f"table {table.path} is not partitioned", table=table.path)
        return table

    @staticmethod
    def name_of(table: TableInfo, text: str, check_time: bool = True) -> str:
        """The partition's name in its normal form; InvalidRequestError naming the problem. An
        auto-partitioned table's values must be of its time unit (not checked for a drop: a partition made
        before is dropped by its name as it is)."""
        values = parse_partition_name(table.partition_key, text)
        if check_time and table.auto_partition is not None:
            problem = auto_partition.value_problem(table.auto_partition.unit, values[0])
            if problem is not None:
                raise errors.InvalidRequestError(f"{problem} (table {table.path})", table=table.path)
        return partition_name(table.partition_key, values)
