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

The reader of a partitioned table (:class:`PartitionedBatchReader`) reads
the partitions option ``partitions`` names (every partition without it):
the others are neither leased nor read (docs/spark.md, "Partitioned
tables"). A filter on the partition column does not prune in Spark 4.3:
Spark keeps the plan a reader made while the filters of one query were
pushed to it on the DataFrame's source, and a later query of that DataFrame
that pushes no filter reads that plan again, so a plan pruned for
``day = 'X'`` would answer a plain ``count()`` with partition X's rows only.
Spark releases whose readers have ``pushLimit`` keep such a plan with its
own query's scan (SPARK-58551); there :func:`partitioned_reader` gives the
reader that prunes by pushed filters too (:class:`PruningBatchReader`,
``spark_source/pruning.py``), and ``register()`` turns pushdown on.
"""

from __future__ import annotations

import logging
import uuid
from typing import Iterable, Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.common.partition_names import parse_partition_name, partition_name
from kvlease.common.tables import TableInfo
from kvlease.spark_source.enumerator import plan_bootstrap, plan_changes
from kvlease.spark_source.options import OptionError, Options, connect, open_table
from kvlease.spark_source.user_errors import option_errors
from kvlease.spark_source.partitions import PartitionedTables, name_splits
from kvlease.spark_source.prefix_pruning import filter_prefixes, parse_prefix_option, prefix_splits
from kvlease.spark_source.pruning import kept
from kvlease.spark_source.reader import names_table, read_split
from kvlease.spark_source.splits import ReadContext

log = logging.getLogger(__name__)


class BatchReader(DataSourceReader):
    #: The filters Spark pushed (only to a reader that takes them: :class:`KeyPruningBatchReader`, …).
    filters: tuple[Filter, ...] = ()

    def __init__(self, options: Options, ctx: ReadContext) -> None:
        self.options = options
        self.ctx = ctx

    @option_errors
    @names_table
    def partitions(self) -> list:
        ctx = self.ctx
        with connect(ctx.bootstrap, ctx.security) as admin:
            if ctx.table.partitioned:
                names = self._kept_partitions(admin)
                if not names:
                    return []  # no partition can hold a row the query keeps: nothing to lease or read
                by_prefix = self._prefix_plan({name: partition_id for partition_id, name in names.items()})
                if by_prefix is not None:
                    return by_prefix
                with PartitionedTables(admin, ctx.table, ctx.security, names) as tables:
                    return name_splits(self._plan(admin, tables), names)
            by_prefix = self._prefix_plan(None)
            if by_prefix is not None:
                return by_prefix
            with open_table(admin, ctx.table.table_id, ctx.security) as table:
                return self._plan(admin, table)

    def _prefix_plan(self, partitions: dict[str, int] | None) -> list | None:
        """Prefix splits of a full read narrowed to some bucket-key prefixes (option ``prefix``, or the pushed
        filters: spark_source/prefix_pruning.py); None: the read is not narrowed."""
        if self.options.change_feed:
            return None
        prefixes = (parse_prefix_option(self.ctx.table, self.options.prefix) if self.options.prefix is not None
                    else filter_prefixes(self.ctx.table, self.filters))
        if prefixes is None:
            return None
        splits = prefix_splits(self.ctx.table, prefixes, partitions)
        log.info("table %s: %d bucket-key prefix(es) read from %d bucket(s)", self.ctx.table.path, len(prefixes),
                 len(splits))
        return splits

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
    """A partitioned table's batch reader: the partitions option ``partitions`` names, else every one, all
    under one lease."""

    def _kept_partitions(self, admin: AdminClient) -> dict[int, str]:
        names = super()._kept_partitions(admin)
        if not self.options.partitions:
            return names
        by_name = {name: partition_id for partition_id, name in names.items()}
        wanted = canonical_names(self.ctx.table, self.options.partitions)
        if missing := [name for name in wanted if name not in by_name]:
            raise OptionError(f"option 'partitions': table {self.ctx.table.path} has no partition "
                              f"{', '.join(missing)} (it has {len(names)}; kvlease partition list "
                              f"{self.ctx.table.path})")
        return {by_name[name]: name for name in wanted}


class KeyPruningBatchReader(BatchReader):
    """An unpartitioned table's batch reader that reads only the bucket-key prefixes the pushed filters pin
    (only where Spark keeps a pushdown's plan with its own scan: :func:`unpartitioned_reader`)."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """Keep ``filters`` to narrow the plan by; give every one back: Spark applies them all to the rows read."""
        self.filters = tuple(filters)
        return filters


class PruningBatchReader(PartitionedBatchReader):
    """A partitioned table's batch reader that also leaves out the partitions the pushed filters exclude
    (only where Spark keeps a pushdown's plan with its own scan: :func:`partitioned_reader`)."""

    def __init__(self, options: Options, ctx: ReadContext) -> None:
        super().__init__(options, ctx)
        self.filters: tuple[Filter, ...] = ()

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """Keep ``filters`` to prune partitions with when planning; give every one back: Spark applies them all
        to the rows read (pruning leaves out only partitions none of whose rows could pass)."""
        self.filters = tuple(filters)
        return filters

    def _kept_partitions(self, admin: AdminClient) -> dict[int, str]:
        names = super()._kept_partitions(admin)
        pruned = kept(self.ctx.table, names.items(), self.filters)
        if len(pruned) < len(names):
            log.info("table %s: the query's filters keep %d of %d partitions (%s)", self.ctx.table.path,
                     len(pruned), len(names), ", ".join(sorted(pruned.values())[:10]))
        return pruned


#: Whether this Spark keeps the plan a reader made while a query's filters were pushed with that query's scan
#: (the release that brought ``DataSourceReader.pushLimit`` did, SPARK-58551), rather than on the DataFrame's
#: source for every later query (4.3).
PUSHDOWN_PLANS_PER_SCAN = hasattr(DataSourceReader, "pushLimit")


def partitioned_reader() -> type[PartitionedBatchReader]:
    """The reader class of a partitioned table's batch reads on this Spark."""
    return PruningBatchReader if PUSHDOWN_PLANS_PER_SCAN else PartitionedBatchReader


def unpartitioned_reader() -> type[BatchReader]:
    """The reader class of an unpartitioned table's batch reads on this Spark."""
    return KeyPruningBatchReader if PUSHDOWN_PLANS_PER_SCAN else BatchReader


def canonical_names(table: TableInfo, names: Iterable[str]) -> list[str]:
    """``names`` as the table names its partitions (a key of several columns in key order), each once;
    OptionError naming the first that is not a name of the table's partition key."""
    out = []
    for name in names:
        try:
            values = parse_partition_name(table.partition_key, name)
        except errors.InvalidRequestError as exc:
            raise OptionError(f"option 'partitions': {exc.message}") from None
        out.append(partition_name(table.partition_key, values))
    return list(dict.fromkeys(out))


def check_partition_names(table: TableInfo, names: tuple[str, ...]) -> None:
    """OptionError if option ``partitions`` is given for an unpartitioned table, or names no partition of the
    table's key (whether each exists is checked when the read is planned)."""
    if names and not table.partitioned:
        raise OptionError(f"option 'partitions' selects partitions of a partitioned table; table {table.path} "
                          "is not partitioned")
    canonical_names(table, names)


def check_prefix_option(table: TableInfo, options: Options) -> None:
    """OptionError for a bad option ``prefix`` (a table without a bucket key, a value of the wrong type, a
    bucket-key column missing), or one on a change feed (it narrows a full read of the table)."""
    if options.prefix is None:
        return
    if options.change_feed:
        raise OptionError("option 'prefix' narrows a full read (startup.mode=full) to some bucket-key prefixes; "
                          "a change feed reads every row's changes")
    try:
        parse_prefix_option(table, options.prefix)
    except errors.KvLeaseError as exc:
        raise OptionError(f"option 'prefix': {exc.message}") from None
