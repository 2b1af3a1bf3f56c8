"""Every version of each table's schema, in memory and in ZooKeeper (docs/schemas.md, "Schema evolution").

A table's versions are the children of ``/tables/{table_id}/schemas``, one node per version
(``/tables/{table_id}/schemas/{schema_id}``: ``{"schema_id", "schema", "change", "time_ms", "comment"?}``,
:class:`~kvlease.common.schema_changes.SchemaVersion`), so no node grows with the history (ZooKeeper's
1 MB node limit) and a failover finds them all. A table never altered has none stored: its own node is its
only version, 1. The first alter stores that version 1 and its own in the same fenced multi-op as the
table's node; each later alter adds its version. A partition has no history: it has its table's schema.
Loaded with the tables (a listing and the versions of each table that has some, in batched reads);
the controller's loop is the only writer.
"""

from __future__ import annotations

from dataclasses import replace

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import zkpaths
from kvlease.common.schema_changes import SchemaVersion
from kvlease.common.tables import TableInfo
from kvlease.common.zk import ZkOp, dumps, loads
from kvlease.coordinator.zk_reads import CHILDREN, DATA, read_many


class SchemaHistory:
    def __init__(self) -> None:
        #: Tables with versions stored: table id -> its versions, oldest first.
        self.by_table: dict[int, list[SchemaVersion]] = {}

    def of(self, table: TableInfo) -> list[SchemaVersion]:
        """``table``'s versions, oldest first (never altered: its one version, from its own node)."""
        return list(self.by_table.get(table.table_id) or [SchemaVersion.current(table)])

    def with_past(self, table: TableInfo) -> TableInfo:
        """``table`` knowing the columns of its earlier schema ids (``TableInfo.past_schemas``), which every
        reader of its rows needs."""
        past = tuple((v.schema_id, v.columns) for v in self.by_table.get(table.table_id, ())
                     if v.schema_id < table.schema_id)
        return replace(table, past_schemas=past) if past != table.past_schemas else table

    def record_ops(self, table: TableInfo, version: SchemaVersion) -> list[ZkOp]:
        """The nodes that add ``version`` to the history of ``table`` (as it is before the change); with the
        table's first alter, also the history's node and the version the table was at."""
        ops = []
        if table.table_id not in self.by_table:
            first = SchemaVersion.current(table)
            ops += [ZkOp("create", zkpaths.table_schemas(table.table_id)),
                    ZkOp("create", zkpaths.table_schema(table.table_id, first.schema_id), dumps(first.to_json()))]
        return ops + [ZkOp("create", zkpaths.table_schema(table.table_id, version.schema_id),
                           dumps(version.to_json()))]

    def recorded(self, table: TableInfo, version: SchemaVersion) -> None:
        """:meth:`record_ops` were written."""
        self.by_table[table.table_id] = [*self.of(table), version]

    def drop_ops(self, table_id: int) -> list[ZkOp]:
        """The nodes of a table's history, children first (deleted with the table's node)."""
        versions = self.by_table.get(table_id)
        if not versions:
            return []
        return ([ZkOp("delete", zkpaths.table_schema(table_id, v.schema_id)) for v in versions]
                + [ZkOp("delete", zkpaths.table_schemas(table_id))])

    def forget(self, table_id: int) -> None:
        self.by_table.pop(table_id, None)

    def load(self, zk: KazooClient, table_ids: list[int]) -> None:
        """Read the versions of the tables ``table_ids`` (those without a history node have none stored)."""
        self.by_table = {}
        listings = read_many(zk, [(CHILDREN, zkpaths.table_schemas(t)) for t in table_ids])
        wanted = []
        for table_id, listing in zip(table_ids, listings):
            if isinstance(listing, NoNodeError):  # never altered
                continue
            if isinstance(listing, Exception):
                raise listing
            wanted += [(table_id, int(name)) for name in listing if name.isdigit()]
        answers = read_many(zk, [(DATA, zkpaths.table_schema(t, s)) for t, s in wanted])
        for (table_id, _schema_id), answer in zip(wanted, answers):
            if isinstance(answer, Exception):
                raise answer
            self.by_table.setdefault(table_id, []).append(SchemaVersion.from_json(loads(answer[0])))
        for versions in self.by_table.values():
            versions.sort(key=lambda v: v.schema_id)
