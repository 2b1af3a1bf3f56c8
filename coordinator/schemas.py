"""Schema evolution on the coordinator: a change of a table's columns, stored, then applied and told.

The rules are :mod:`kvlease.common.schema_changes`'s (pure); this module carries one out as a table's other
changes are: the table's node and the new version's (coordinator/schema_history.py) in one multi-op
fenced by the coordinator epoch, then memory (the catalog's table and its partitions' views), then every
tablet server holding a bucket of the table or of one of its partitions is pushed its buckets again with
the new view (tablet/replicas/replica.py takes it). A change the table has already (a retry whose answer was
lost, also one a deposed coordinator wrote just before it went) writes nothing and answers the table.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Callable

from kvlease.common import schema_changes
from kvlease.common.schema_changes import SchemaVersion
from kvlease.common.statemachine import Dispatcher, on
from kvlease.common.tables import TableInfo
from kvlease.common.zk import dumps
from kvlease.coordinator import requests as rq
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.fencing import FencedWriter, check_write_size
from kvlease.coordinator.lease_shell import LeaseShell
from kvlease.coordinator.loop import settle
from kvlease.coordinator.membership import Membership

log = logging.getLogger(__name__)


class Schemas(Dispatcher):
    """The loop's schema requests, handed on by the controller: an alter is a barrier (gathered lease writes
    are persisted first, as for the other table changes), the history a query."""

    def __init__(self, catalog: TableCatalog, members: Membership, lease_shell: LeaseShell,
                 clock_ms: Callable[[], int]) -> None:
        self.catalog = catalog
        self.members = members
        self.lease_shell = lease_shell
        self.clock_ms = clock_ms
        self.writer: FencedWriter | None = None

    def handles(self, request: object) -> bool:
        return type(request) in self._handlers

    @on(rq.AlterSchema)
    def _alter(self, request: rq.AlterSchema, future: Future | None) -> None:
        self.lease_shell.flush()
        settle(future, self.alter(request))

    @on(rq.GetSchemaHistory)
    def _history(self, request: rq.GetSchemaHistory, future: Future | None) -> None:
        settle(future, self.history(request))

    def alter(self, request: rq.AlterSchema) -> TableInfo:
        """The table after ``request``'s change (InvalidTableError if the rules refuse it)."""
        table = self.catalog.get(request.database, request.name)
        history = self.catalog.history
        outcome = schema_changes.apply(table, history.of(table), request.change, self.clock_ms())
        if outcome.version is None:
            return table
        altered, version = outcome.table, outcome.version
        check_write_size("the table definition", len(dumps(altered.to_json())))
        self.writer.commit(self.catalog.alter_ops(altered) + history.record_ops(table, version))
        history.recorded(table, version)
        self.catalog.replace(altered)
        log.info("altered the schema of table %s: %s (schema id %d)", altered.path, version.change,
                 altered.schema_id)
        holders = set()
        for view in self.catalog.views(altered):
            holders |= self.members.assignments.holders_of(view.physical_id)
        self.members.push(holders)
        return altered

    def history(self, request: rq.GetSchemaHistory) -> tuple[TableInfo, list[SchemaVersion]]:
        table = self.catalog.get(request.database, request.name)
        return table, self.catalog.history.of(table)
