"""Batch reads: the table as of planning (``startup.mode=full``), or a change feed (the other modes).

``partitions()`` runs in a short-lived Python worker: it acquires the lease
(full reads from snapshots) and plans the splits. Each split releases its
bucket once read, so a finished job leaves no lease behind; a job that dies
leaves its lease to expire.

Spark (4.3) keeps the partitions and the read function it got from a Python
reader on the DataFrame's relation and reuses them for every later query on
that DataFrame (or a view of it) that pushes no filter to the source: the
plan is made once and read again. So the reader of an unpartitioned table
keeps no per-query state: it pushes no filter (``pushFilters`` is not
overridden: Spark applies every filter itself, and reads work with
``spark.sql.python.filterPushdown.enabled`` on or off), and a split read
again takes its snapshot back under the plan's lease (``reader.py``).

The reader of a partitioned table (:class:`PartitionedBatchReader`) prunes
partitions by the filters Spark pushes (``spark_source/pruning.py``) before
it leases anything, and gives every filter back to Spark, which applies them
to the rows read. Spark 4.3 calls ``pushFilters`` only with
``spark.sql.python.filterPushdown.enabled`` on (``register()`` turns it on),
and refuses a read by a reader that overrides it while that setting is off
(``DATA_SOURCE_PUSHDOWN_DISABLED``). Its plan is kept on the DataFrame like
any other: a later query of the same DataFrame that pushes no filter reads
the partitions the newest filtered query kept (docs/spark.md, "Partitioned
tables").
"""

from __future__ import annotations

import logging
import uuid
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter

from kvlease.client.admin import AdminClient
from kvlease.spark_source.enumerator import plan_bootstrap, plan_changes
from kvlease.spark_source.options import Options, connect, open_table
from kvlease.spark_source.partitions import PartitionedTables, name_splits
from kvlease.spark_source.pruning import kept
from kvlease.spark_source.reader import names_table, read_split
from kvlease.spark_source.splits import ReadContext

log = logging.getLogger(__name__)


class BatchReader(DataSourceReader):
    def __init__(self, options: Options, ctx: ReadContext) -> None:
        self.options = options
        self.ctx = ctx

    @names_table
    def partitions(self) -> list:
        ctx = self.ctx
        with connect(ctx.bootstrap, ctx.security) as admin:
            if ctx.table.partitioned:
                names = self._kept_partitions(admin)
                if not names:
                    return []  # no partition can hold a row the query keeps: nothing to lease or read
                with PartitionedTables(admin, ctx.table, ctx.security, names) as tables:
                    return name_splits(self._plan(admin, tables), names)
            with open_table(admin, ctx.table.table_id, ctx.security) as table:
                return self._plan(admin, table)

    def _plan(self, admin: AdminClient, table) -> list:
        if self.options.change_feed:
            return plan_changes(table, self.options)
        owner = uuid.uuid4().hex  # this plan's: another read naming the same lease.id is refused
        lease_id = self.options.lease_id or f"spark-batch-{owner}"
        return plan_bootstrap(admin, table, self.options, lease_id, owner=owner, release=True)

    def _kept_partitions(self, admin: AdminClient) -> dict[int, str]:
        """Every partition of the table (a partitioned table's reader narrows them by its filters)."""
        _table, partitions = admin.list_partitions(table_id=self.ctx.table.table_id)
        return {p.partition_id: p.name for p in partitions}

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return read_split(self.ctx, partition)


class PartitionedBatchReader(BatchReader):
    """A partitioned table's batch reader: the partitions the pushed filters keep, all under one lease."""

    def __init__(self, options: Options, ctx: ReadContext) -> None:
        super().__init__(options, ctx)
        self.filters: tuple[Filter, ...] = ()

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """Keep ``filters`` to prune partitions with when planning; give every one back: Spark applies them all
        to the rows read (pruning leaves out only partitions none of whose rows could pass)."""
        self.filters = tuple(filters)
        return filters

    def _kept_partitions(self, admin: AdminClient) -> dict[int, str]:
        _table, partitions = admin.list_partitions(table_id=self.ctx.table.table_id)
        names = kept(self.ctx.table, [(p.partition_id, p.name) for p in partitions], self.filters)
        if len(names) < len(partitions):
            log.info("table %s: the query's filters keep %d of %d partitions (%s)", self.ctx.table.path, len(names),
                     len(partitions), ", ".join(sorted(names.values())[:10]))
        return names
