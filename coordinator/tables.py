"""Tables: create, drop, get, list.

The metadata and its ZooKeeper layout are the
:class:`~kvlease.coordinator.catalog.TableCatalog`'s; this module orders a table's
changes across the other concepts. Create: the table's nodes and its
leadership plan in one fenced multi-op, then memory, then the new leaders are
told. Drop: first no lease may point at the table (the lease machine's
:class:`~kvlease.leases.state.RemoveTable`, persisted like a release), then its
snapshot handles, then its own nodes, then its files.
"""

from __future__ import annotations

import logging
from typing import Callable

from kvlease.common import errors
from kvlease.common.tables import TableInfo, TableSpec, validate_spec
from kvlease.common.zk import dumps
from kvlease.coordinator import requests as rq
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.fencing import FencedWriter, check_write_size
from kvlease.coordinator.lease_shell import LeaseShell
from kvlease.coordinator.membership import Membership
from kvlease.coordinator.partitions import Partitions
from kvlease.coordinator.snapshot_commits import SnapshotCommits
from kvlease.leases import state as ls

log = logging.getLogger(__name__)


def definition_differences(existing: TableInfo, spec: TableSpec) -> list[str]:
    """How a (validated) create request differs from the table there is: columns, keys, buckets, partitioning."""
    differences = []
    if tuple(existing.partition_key) != tuple(spec.partition_key):
        there, asked = ", ".join(existing.partition_key) or "none", ", ".join(spec.partition_key) or "none"
        differences.append(f"partition key ({there}) there, ({asked}) asked")
    if existing.auto_partition != spec.auto_partition:
        there, asked = (a.to_json() if a else None for a in (existing.auto_partition, spec.auto_partition))
        differences.append(f"auto-partitioning {there} there, {asked} asked")
    if existing.row_ttl != spec.row_ttl:
        there, asked = (t.describe() if t else "none" for t in (existing.row_ttl, spec.row_ttl))
        differences.append(f"row TTL ({there}) there, ({asked}) asked")
    if existing.merge_engine != spec.merge_engine:
        there, asked = (e.describe() if e else "last write wins" for e in (existing.merge_engine, spec.merge_engine))
        differences.append(f"merge engine {there} there, {asked} asked")
    if [(c.name, c.type) for c in existing.columns] != [(c.name, c.type) for c in spec.columns]:  # not field ids
        asked = ", ".join(f"{c.name} {c.type}" for c in spec.columns)
        differences.append(f"columns ({existing.schema_string()}) there, ({asked}) asked")
    if tuple(existing.primary_key) != tuple(spec.primary_key):
        there, asked = ", ".join(existing.primary_key), ", ".join(spec.primary_key)
        differences.append(f"primary key ({there}) there, ({asked}) asked")
    if existing.buckets != spec.buckets:
        differences.append(f"buckets {existing.buckets} there, {spec.buckets} asked")
    if tuple(existing.bucket_key) != tuple(spec.bucket_key):
        there, asked = ", ".join(existing.bucket_key) or "none", ", ".join(spec.bucket_key) or "none"
        differences.append(f"bucket key ({there}) there, ({asked}) asked")
    return differences


def replication_differences(existing: TableInfo, request: rq.CreateTable) -> list[str]:
    """How a create's replication (where it names one) differs from the table there is."""
    differences = []
    for what, asked in (("replication_factor", request.replication_factor),
                        ("min_insync_replicas", request.min_insync_replicas)):
        if asked is not None and getattr(existing, what) != asked:
            differences.append(f"{what.replace('_', ' ')} {getattr(existing, what)} there, {asked} asked")
    return differences


def replication(request: rq.CreateTable, defaults: tuple[int, int]) -> tuple[int, int]:
    """The new table's (replication factor, min in-sync replicas): asked, else ``defaults``;
    InvalidTableError unless 1 <= min in-sync replicas <= replication factor."""
    rf = defaults[0] if request.replication_factor is None else request.replication_factor
    min_isr = min(defaults[1], rf) if request.min_insync_replicas is None else request.min_insync_replicas
    if rf < 1:
        raise errors.InvalidTableError(f"replication factor must be at least 1, got {rf}")
    if not 1 <= min_isr <= rf:
        raise errors.InvalidTableError(f"min in-sync replicas must be between 1 and the replication factor {rf}, "
                                       f"got {min_isr}")
    return rf, min_isr


class Tables:
    def __init__(self, catalog: TableCatalog, members: Membership, leases: LeaseShell, snapshots: SnapshotCommits,
                 clock_ms: Callable[[], int], default_replication: tuple[int, int] = (1, 1),
                 partitions: Partitions | None = None) -> None:
        """``default_replication``: (default.replication-factor, min.insync-replicas), for a create naming none;
        ``partitions``: what drops a partitioned table's partitions."""
        self.catalog = catalog
        self.members = members
        self.leases = leases
        self.snapshots = snapshots
        self.clock_ms = clock_ms
        self.default_replication = default_replication
        self.partitions = partitions
        self.writer: FencedWriter | None = None

    def get(self, request: rq.GetTable) -> TableInfo:
        if request.database or request.name:
            return self.catalog.get(request.database, request.name)
        return self.catalog.get_by_id(request.table_id)

    def list(self, request: rq.ListTables) -> list[TableInfo]:
        return self.catalog.list(request.database)

    def create(self, request: rq.CreateTable) -> TableInfo:
        spec = validate_spec(request.spec)
        rf, min_isr = replication(request, self.default_replication)
        if (spec.database, spec.name) in self.catalog.by_name:
            existing = self.catalog.get(spec.database, spec.name)
            if not request.ignore_if_exists:
                raise errors.TableAlreadyExistError(f"table {existing.path} already exists")
            differences = definition_differences(existing, spec) + replication_differences(existing, request)
            if differences:  # "if not exists" is for retries of the same create, not for another table
                raise errors.TableAlreadyExistError(f"table {existing.path} already exists with another definition: "
                                                    f"{'; '.join(differences)}")
            return existing
        table, ops = self.catalog.create_ops(spec, self.clock_ms(), rf, min_isr)
        check_write_size("the table definition", len(dumps(table.to_json())))
        if table.partitioned:  # no buckets of its own; its partitions' are placed as they are made
            self.members.check_placeable(table)
            self.writer.commit(ops)
            self.catalog.add(table)
        else:
            plan, assignment_op = self.members.plan_table(table)
            self.writer.commit(ops + [assignment_op])
            self.catalog.add(table)
            self.members.table_created(table, plan)
        log.info("created table %s (id %d, %d buckets%s, replication factor %d, min in-sync replicas %d)", table.path,
                 table.table_id, table.buckets, " per partition" if table.partitioned else "", rf, min_isr)
        if table.auto_partition is not None:
            self.partitions.check_now(table)  # its first partitions now, not at the next check
        return table

    def drop(self, request: rq.DropTable) -> None:
        """A barrier: no lease write is in flight when it starts."""
        try:
            table = self.catalog.get(request.database, request.name)
        except errors.TableNotExistError:
            if request.ignore_if_not_exists:
                return None
            raise
        # 1. no lease may point at the table any more (raises the lease write's error, if any)
        self.leases.call(ls.RemoveTable(table.table_id))
        # 2. its partitions, one by one (a drop cut short goes on when asked again), as partition drops do
        for view in self.catalog.partitions_of(table.table_id):
            self.partitions.remove(view)
        # 3. snapshot handles, then the table's own nodes
        self.snapshots.delete_handles(table.table_id)
        holders = self.members.assignments.holders_of(table.table_id)
        self.writer.commit(self.members.drop_ops(table.table_id) + self.catalog.drop_ops(table))
        self.catalog.remove(table)
        self.members.table_dropped(table.table_id, holders)
        # 4. its files: whatever the handles named, and anything else under kv/{table_id}/
        self.snapshots.forget_table(table.table_id)
        log.info("dropped table %s (id %d)", table.path, table.table_id)
        return None
