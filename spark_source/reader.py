"""Executor side: read one split into Arrow RecordBatches of the source's schema.

A task borrows its admin and table clients (they are not picklable) from
those a finished task of the same read left in the worker, or makes them
(``spark_source/worker_clients.py``): a streaming query's micro-batches
reuse them. A hybrid split of a batch read releases its
bucket from the lease once every row was handed to Spark; a failure to
release is logged, not raised (the rows are read; the lease's expiry frees
the snapshot anyway).

A split of a partition reads that partition's buckets (``splits.split_table``).
If the partition is dropped while the split reads it (retention, or by hand:
docs/partitions.md), the split ends where it is, with a warning, instead of
failing the query: the partition's rows went with it.
"""

from __future__ import annotations

import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from kvlease.client.admin import AdminClient
from kvlease.client.log_records import decode_records, entry_records
from kvlease.client.table import TableClient
from kvlease.client.prefix_lookup import bucket_rows
from kvlease.common import errors
from kvlease.common.prefix_codec import PrefixCodec
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo
from kvlease.spark_source.bootstrap import SnapshotGoneError, merge, open_snapshot
from kvlease.spark_source.changelog import final_states, read_entries
from kvlease.spark_source.enumerator import release_buckets
from kvlease.spark_source.options import connect
from kvlease.spark_source.schema import changes_for_spark, spark_arrow_schema, state_rows_as_changes
from kvlease.spark_source.partitions import check_table_losses, key_of
from kvlease.spark_source.splits import HybridSplit, LiveSplit, LogSplit, PrefixSplit, ReadContext, split_table
from kvlease.spark_source.worker_clients import clients

log = logging.getLogger(__name__)
#: A change feed's read joins its changelog entries' rows into batches of about this many rows (:func:`_joined`).
JOINED_ROWS = 65_536


@contextmanager
def table_named(table: TableInfo) -> Iterator[None]:
    """Inside, a TableNotExistError (the servers name a table by id) names ``table`` by its name."""
    try:
        yield
    except errors.TableNotExistError as exc:
        raise errors.TableNotExistError(
            f"table {table.path} (id {table.table_id}) no longer exists: it was dropped while this query read it "
            f"(a table created again under that name is another table) ({exc.message})",
            table=table.path, table_id=table.table_id) from None


def names_table(method: Callable) -> Callable:
    """A reader method whose TableNotExistError names the reader's table (``self.ctx.table``)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with table_named(self.ctx.table):
            return method(self, *args, **kwargs)
    return wrapper


def read_split(ctx: ReadContext, split) -> Iterator[pa.RecordBatch]:
    """The split's rows with every table and metadata column, cut down to the requested ones (with
    the nullability the requested schema gives them: Spark compares the batches' schema with it)."""
    if type(split) is InputPartition and split.value is None:
        return  # what Spark reads when the plan has no split (e.g. a change feed of an empty range)
    schema = spark_arrow_schema(ctx.table, with_changes=True)
    wanted = output_schema(schema, ctx)
    with table_named(ctx.table):
        try:
            for batch in _read(ctx, split, schema):
                if tuple(batch.schema.names) != ctx.columns:
                    batch = batch.select(list(ctx.columns))
                yield batch if batch.schema.equals(wanted) else pa.RecordBatch.from_arrays(batch.columns,
                                                                                           schema=wanted)
        except errors.KvLeaseError as exc:
            partition = getattr(split, "partition_id", None)
            if partition is None or not _dropped(ctx, partition):
                raise
            log.warning("%s: the partition was dropped while this split read it; its part of the read ends here "
                        "(%s)", _what(ctx, split), exc.message)


def _dropped(ctx: ReadContext, partition_id: int) -> bool:
    """Whether partition ``partition_id`` of the table no longer exists (False if that cannot be told)."""
    try:
        with connect(ctx.bootstrap, ctx.security) as admin:
            _table, partitions = admin.list_partitions(table_id=ctx.table.table_id)
    except errors.KvLeaseError:
        return False
    return all(p.partition_id != partition_id for p in partitions)


def output_schema(schema: pa.Schema, ctx: ReadContext) -> pa.Schema:
    """``schema``'s fields of the requested columns, nullable as requested (a schema the user gives has
    every column nullable, where the source's own has the metadata columns not null)."""
    fields = [schema.field(name) for name in ctx.columns]
    if ctx.nullable:
        fields = [f.with_nullable(nullable) for f, nullable in zip(fields, ctx.nullable)]
    return pa.schema(fields)


def _read(ctx: ReadContext, split, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    # the query's schema; the clients a finished task of the same read left in this worker, or new ones
    with clients(ctx.bootstrap, ctx.security, ctx.table, split_table(ctx.table, split)) as (admin, table):
        if isinstance(split, HybridSplit):
            batches = _hybrid(ctx, admin, table, split, schema)
            yield from (_releasing(admin, ctx, split, batches) if split.release else batches)
        elif isinstance(split, LogSplit):
            yield from _loss_named(admin, ctx, split, (_log_state if split.as_state else _log_changes)(
                table, split, schema))
        elif isinstance(split, LiveSplit):
            yield from _live(table, split, schema)
        elif isinstance(split, PrefixSplit):
            yield from _prefixes(table, split, schema)
        else:
            raise errors.InvalidRequestError(f"not a kvlease split: {split!r}")


def _what(ctx: ReadContext, split) -> str:
    return f"table {split_table(ctx.table, split).where} bucket {split.bucket}"


def _state_batches(rows: Iterator[pa.RecordBatch], bucket: int, end: int,
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for batch in rows:
        if batch.num_rows:
            yield state_rows_as_changes(batch, bucket, end, schema)


def _hybrid(ctx: ReadContext, admin: AdminClient, table: TableClient, split: HybridSplit,
            schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    tb = split_table(ctx.table, split).bucket(split.bucket)
    what = f"{_what(ctx, split)} (lease {split.lease_id})"
    if split.release:  # a batch read's split: its lease is the plan's, which this split may be reading again
        _hold(admin, ctx, split, tb, what)
    held = lambda: _held(admin, split, tb) == split.snapshot_id  # noqa: E731
    with open_snapshot(ctx.storage, tb, split.snapshot_id, what=what, held=held,
                       retry=admin.retry) as (log_offset, chunks):
        if log_offset > split.end:
            raise errors.InvalidSnapshotError(f"{what}: snapshot {split.snapshot_id} starts at changelog offset "
                                              f"{log_offset}, after the planned end {split.end}")
        # fenced by the end's epoch: a bound of the epoch below the snapshot's offset (client/log_position.py)
        changes = final_states(read_entries(table, split.bucket, log_offset, split.end, split.end_epoch,
                                            split.end_epoch))
        yield from _state_batches(merge(chunks, changes, table.codec), split.bucket, split.end, schema)


def _held(admin: AdminClient, split: HybridSplit, tb: TableBucket) -> int | None:
    """The snapshot of ``tb`` that the split's lease holds now (None: none, no such lease, or the lease
    id now belongs to another owner)."""
    try:
        lease = admin.describe_lease(split.lease_id)
    except errors.LeaseNotFoundError:
        return None
    return lease.buckets.get(tb) if lease.owner == split.owner else None


def _hold(admin: AdminClient, ctx: ReadContext, split: HybridSplit, tb: TableBucket, what: str) -> None:
    """Make sure the plan's lease holds the split's snapshot while the split reads it.

    The first read of a split finds it held since planning. Spark reads a split again when it reuses a
    DataFrame's plan for a later query on it (or recomputes lost data): the first read gave the bucket
    back, so the same snapshot is taken back under the same lease (the same rows, never newer ones), or
    the read fails if the snapshot is no longer kept.
    """
    held = _held(admin, split, tb)
    if held == split.snapshot_id:
        return
    if held is not None:
        raise errors.InvalidRequestError(
            f"{what}: the lease now holds snapshot {held} of the bucket, not snapshot {split.snapshot_id} that this "
            f"read was planned on: another reader uses lease.id {split.lease_id}; give each reader its own lease.id")
    result = admin.acquire_lease(split.lease_id, {tb: split.snapshot_id}, ctx.lease_duration_ms, owner=split.owner)
    if result.unavailable:
        raise SnapshotGoneError(
            f"{what}: snapshot {split.snapshot_id} that this read was planned on is no longer kept: the lease "
            "gave it back once the split was read (Spark plans a DataFrame's read once, at its first query, and "
            "reads that plan again for later queries on it), or expired; load() the DataFrame again to read the "
            "table as it is now", lease_id=split.lease_id)


def _loss_named(admin: AdminClient, ctx: ReadContext, split: LogSplit,
                batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches``; a DataLostError (a fetch fenced by its epoch: offsets the query read were reused) is
    told as the query's loss check tells it (``client/lost_ranges.py``: the range, and how it was
    lost) when the bucket's loss record says so, else as the tablet server told it."""
    try:
        yield from batches
    except errors.DataLostError as exc:
        position = int(exc.details.get("position", split.end))
        key = key_of(split.partition_id, split.bucket)
        try:
            check_table_losses(admin, ctx.table, {key: position}, {key: split.losses_seen},
                               {split.partition_id: split.partition_name} if split.partition_name else None)
        except errors.DataLostError as named:
            raise named from None
        except errors.KvLeaseError as failed:  # the record could not be read: the server's word stands
            log.warning("could not read the loss records of %s: %s", _what(ctx, split), failed)
        raise


def _log_state(table: TableClient, split: LogSplit, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    changes = final_states(read_entries(table, split.bucket, split.start, split.end, split.start_epoch,
                                              split.end_epoch))
    yield from _state_batches(merge(iter(()), changes, table.codec), split.bucket, split.end, schema)


def _log_changes(table: TableClient, split: LogSplit, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    entries = read_entries(table, split.bucket, split.start, split.end, split.start_epoch, split.end_epoch)
    for records in _joined(map(entry_records, entries), JOINED_ROWS):  # decoded once per joined batch
        yield changes_for_spark(decode_records(table.codec, records), split.bucket, schema)


def _joined(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The batches' rows in their order, consecutive batches of one schema joined until they hold ``rows``
    rows. A changelog entry is a write's rows, one at a low write rate: Spark takes each batch a read yields
    as an Arrow message of its own, and converting and sending an entry's batch cost more than its rows. The
    rows before an error are handed on before it, as they were batch by batch (a split of a partition dropped
    while it reads ends quietly with them: ``read_split``)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    try:
        for batch in batches:
            if pending and (count >= rows or not batch.schema.equals(pending[0].schema)):
                yield _concat(pending)
                pending, count = [], 0
            pending.append(batch)
            count += batch.num_rows
    except Exception:
        if pending:
            yield _concat(pending)
        raise
    if pending:
        yield _concat(pending)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _live(table: TableClient, split: LiveSplit, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The scan's rows as of its ``log_offset``."""
    with table.scanner(split.bucket, streaming=True) as scanner:
        for batch in scanner:
            if batch.num_rows:
                yield state_rows_as_changes(batch, split.bucket, scanner.log_offset, schema)


def _prefixes(table: TableClient, split: PrefixSplit, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of the split's prefixes, as of the prefix lookups' ``log_offset``."""
    found, log_offset = bucket_rows(table, split.bucket, PrefixCodec(table.codec).to_batch(list(split.prefixes)))
    for batch in found:
        if batch.num_rows:
            yield state_rows_as_changes(batch, split.bucket, log_offset, schema)


def _releasing(admin: AdminClient, ctx: ReadContext, split: HybridSplit,
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches; the bucket's release is sent while the last one goes to Spark (every row has been
    read from the snapshot and its temp dir removed by then) and waited for at the end. A split that
    fails, or that Spark stops reading early (a LIMIT had its rows), gives its bucket back too: a retry
    takes the same snapshot back (:func:`_hold`)."""
    released = False
    try:
        last = next(batches, None)
        for batch in batches:
            yield last
            last = batch
        with ThreadPoolExecutor(1, thread_name_prefix="kvlease-release") as pool:
            release = pool.submit(_release, admin, ctx, split)
            if last is not None:
                yield last
            release.result()
            released = True
    finally:
        if not released:
            batches.close()  # its temp dir goes first
            _release(admin, ctx, split)


def _release(admin: AdminClient, ctx: ReadContext, split: HybridSplit) -> None:
    try:  # (a partition dropped meanwhile is in no lease any more: its release is refused, and not needed)
        release_buckets(admin, split.lease_id, [split_table(ctx.table, split).bucket(split.bucket)], split.owner)
    except errors.KvLeaseError as exc:
        log.warning("%s: could not release lease %s (its expiry frees the snapshot): %s",
                    _what(ctx, split), split.lease_id, exc)
