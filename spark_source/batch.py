"""Batch reads: the table as of planning (``startup.mode=full``), or a change feed (the other modes).

``partitions()`` runs in a short-lived Python worker: it acquires the lease
(full reads from snapshots) and plans the splits. Each split releases its
bucket once read, so a finished job leaves no lease behind; a job that dies
leaves its lease to expire.

Spark (4.3) keeps the partitions and the read function it got from a Python
reader on the DataFrame's relation and reuses them for every later query on
that DataFrame (or a view of it) that pushes no filter to the source: the
plan is made once and read again. So the reader keeps no per-query state:
it pushes no filter (``pushFilters`` is not overridden: Spark applies every
filter itself, and reads work with ``spark.sql.python.filterPushdown.enabled``
on or off), and a split read again takes its snapshot back under the plan's
lease (``reader.py``).
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader

from kvlease.spark_source.enumerator import plan_bootstrap, plan_changes
from kvlease.spark_source.options import Options, connect, open_table
from kvlease.spark_source.reader import names_table, read_split
from kvlease.spark_source.splits import ReadContext


class BatchReader(DataSourceReader):
    def __init__(self, options: Options, ctx: ReadContext) -> None:
        self.options = options
        self.ctx = ctx

    @names_table
    def partitions(self) -> list:
        ctx = self.ctx
        with connect(ctx.bootstrap, ctx.security) as admin, \
                open_table(admin, ctx.table.table_id, ctx.security) as table:
            if self.options.change_feed:
                return plan_changes(table, self.options)
            owner = uuid.uuid4().hex  # this plan's: another read naming the same lease.id is refused
            lease_id = self.options.lease_id or f"spark-batch-{owner}"
            return plan_bootstrap(admin, table, self.options, lease_id, owner=owner, release=True)

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return read_split(self.ctx, partition)
