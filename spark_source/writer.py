"""Writes: Spark's Arrow batches upserted (or deleted) straight through the table client, no per-row Python.

A ``_change_type`` column makes a change feed replayable into another table:
``insert`` / ``update_postimage`` (or null) upsert, ``delete`` deletes the key,
``update_preimage`` is skipped (the short forms ``+I``, ``+U``, ``-D``, ``-U`` too). Into a table with the
aggregation merge engine, ``update_preimage`` and ``delete`` rows are retracted instead (their values taken
back: docs/merge-engines.md). With ``partial-update`` the DataFrame's columns are the ones written (the key
always), the others keep their values. Rows are applied in their order within a task:
each run of rows of the same kind is one write. The other change-feed columns
(``_bucket``, ``_log_offset``, ``_commit_timestamp``) are ignored.

Rows of a partitioned table go to their partitions, which the table client
creates when missing (docs/partitions.md, "Writing and reading"); a row whose
partition value cannot name a partition fails its task naming the row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import DataType, StringType, StructType

from kvlease.common import errors
from kvlease.common.codec import arrow_schema
from kvlease.common.tables import TableInfo
from kvlease.spark_source.options import OptionError, connect, open_table
from kvlease.common.codec_conform import widens_to
from kvlease.common.types import parse_type
from kvlease.spark_source.schema import CHANGE_TYPE, METADATA, spark_type

UPSERT, DELETE, SKIP, RETRACT = 0, 1, 2, 3
_KINDS = {"insert": UPSERT, "update_postimage": UPSERT, "delete": DELETE, "update_preimage": SKIP,
          "+I": UPSERT, "+U": UPSERT, "-D": DELETE, "-U": SKIP}
#: Into an aggregation table: a row leaving the source is taken back out.
_RETRACTING = {"delete": RETRACT, "update_preimage": RETRACT, "-D": RETRACT, "-U": RETRACT}


@dataclass(frozen=True)
class WriteStats(WriterCommitMessage):
    upserted: int
    deleted: int  # deleted or retracted


def check_schema(table: TableInfo, schema: StructType, partial: bool = False) -> dict[str, str]:
    """``table column -> DataFrame column``; raises OptionError naming the first column that does not fit
    (``partial``: a partial update, where only the primary key columns must be there)."""
    given = {f.name.lower(): f for f in schema.fields}
    columns = {}
    for column in table.columns:
        field = given.pop(column.name.lower(), None)
        if field is None and table.row_ttl is not None and column.name == table.row_ttl.column \
                and table.row_ttl.write_time:
            continue  # the leader sets a write-time TTL's column (common/row_ttl.py)
        if field is None and partial and column.name not in table.primary_key:
            continue
        if field is None:
            raise OptionError(f"column '{column.name}' of table {table.path} is missing from the DataFrame "
                              + ("(a partial update writes the primary key always)" if partial else
                                 "(writes upsert whole rows; option('partial-update', 'true') writes only the "
                                 "DataFrame's columns)"))
        expected = spark_type(column.type)
        if field.dataType != expected and not _widens(field.dataType, column.type):
            raise OptionError(f"column '{field.name}': table {table.path} stores {column.type} "
                              f"({expected.simpleString()}), the DataFrame has {field.dataType.simpleString()}: "
                              "cast it first (a column takes its own type or a safe widening of it: docs/schemas.md)")
        columns[column.name] = field.name
    change = given.pop(CHANGE_TYPE, None)
    if change is not None and change.dataType != StringType():
        raise OptionError(f"column '{change.name}' must be a string (insert, update_preimage, update_postimage, "
                          f"delete), not {change.dataType.simpleString()}")
    extra = [f.name for name, f in given.items() if name not in METADATA]
    if extra:
        raise OptionError(f"column '{extra[0]}' is not a column of table {table.path} "
                          f"(it has {', '.join(c.name for c in table.columns)})")
    if change is not None:
        columns[CHANGE_TYPE] = change.name
    return columns


def _widens(given: DataType, text: str) -> bool:
    """A DataFrame column of Spark type ``given`` is written to a column of type ``text`` without loss (the
    codec's safe widenings: an ``int`` column takes ``short`` and ``byte``, ``double`` takes ``float``, a
    ``decimal`` one that fits, …)."""
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        arrow = to_arrow_type(given, timezone="UTC")
    except (TypeError, ValueError, NotImplementedError):
        return False
    return widens_to(arrow, parse_type(text))


class _Writes:
    def __init__(self, bootstrap: tuple[str, ...], table: TableInfo, columns: dict[str, str],
                 security: tuple = (), partial: bool = False) -> None:
        self.bootstrap = bootstrap
        self.security = security  # spark_source.options.Security
        self.table = table
        self.columns = columns
        self.partial = partial
        engine = table.merge_engine
        self.kinds = {**_KINDS, **(_RETRACTING if engine is not None and engine.kind.value == "aggregation" else {})}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteStats:
        target = pa.schema([f for f in arrow_schema(self.table) if f.name in self.columns])
        upserted = deleted = seen = 0
        with connect(self.bootstrap, self.security) as admin, \
                open_table(admin, self.table.table_id, self.security) as client:
            for batch in iterator:
                rows = pa.RecordBatch.from_arrays(
                    [batch.column(self.columns[f.name]).cast(f.type) if f.name in self.columns
                     else pa.nulls(batch.num_rows, f.type) for f in target], schema=target)
                self._check_keys(rows, seen)
                kinds = self._kinds(batch, seen)
                for start, stop, kind in _runs(kinds):
                    part = rows.slice(start, stop - start)
                    if kind == UPSERT:
                        self._apply(partial_upsert(client) if self.partial else client.upsert, part, seen + start)
                        upserted += part.num_rows
                    elif kind == RETRACT:
                        self._apply(client.retract, part, seen + start)
                        deleted += part.num_rows
                    elif kind == DELETE:
                        self._apply(client.delete, part.select(list(self.table.primary_key)), seen + start)
                        deleted += part.num_rows
                seen += batch.num_rows
        return WriteStats(upserted, deleted)

    def _apply(self, write, rows: pa.RecordBatch, first: int) -> None:
        """``write(rows)``; a row the table client refuses (a partitioned table's: a partition value that cannot
        name a partition, or not of the auto-partitioning's time unit) is named by its row of the task."""
        try:
            write(rows)
        except errors.InvalidRowError as exc:
            row = exc.details.get("row")
            if not isinstance(row, int):
                raise
            reason = re.sub(r"^row \d+: ", "", exc.message)
            raise errors.InvalidRowError(f"table {self.table.path}: row {first + row} of {_task()}: {reason}",
                                         row=first + row) from None

    def _check_keys(self, rows: pa.RecordBatch, seen: int) -> None:
        for name in self.table.primary_key:
            column = rows.column(name)
            if column.null_count:
                first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
                raise errors.InvalidRowError(f"table {self.table.path}: row {seen + first} of {_task()} has a null "
                                             f"primary key column '{name}'")

    def _kinds(self, batch: pa.RecordBatch, seen: int) -> np.ndarray:
        if CHANGE_TYPE not in self.columns:
            return np.zeros(batch.num_rows, dtype=np.int8)
        names = batch.column(self.columns[CHANGE_TYPE])
        known = pa.array(list(self.kinds), pa.string())
        index = pc.index_in(names, value_set=known)
        bad = pc.and_(pc.is_null(index), pc.is_valid(names))
        if pc.any(bad).as_py():
            first = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
            raise errors.InvalidRowError(f"row {seen + first} of {_task()}: _change_type {names[first].as_py()!r} "
                                         f"is not one of {', '.join(self.kinds)}")
        lookup = np.array(list(self.kinds.values()), dtype=np.int8)
        return lookup[index.fill_null(0).to_numpy(zero_copy_only=False)]


def partial_upsert(client):
    return lambda rows: client.upsert(rows, partial=True)


def _runs(kinds: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """``(start, stop, kind)`` of each run of equal kinds."""
    if not len(kinds):
        return
    cuts = [0, *(np.flatnonzero(np.diff(kinds)) + 1).tolist(), len(kinds)]
    for start, stop in zip(cuts, cuts[1:]):
        yield start, stop, int(kinds[start])


def _task() -> str:
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"partition {context.partitionId()}" if context is not None else "this task"


class BatchWriter(_Writes, DataSourceArrowWriter):
    """``df.write.format("kvlease")…mode("append").save()``: upserts, no transaction across tasks."""

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


class StreamWriter(_Writes, DataSourceStreamArrowWriter):
    """``writeStream.format("kvlease")``: each micro-batch upserted; a replayed micro-batch writes the same rows
    again, which upserts make harmless (into an aggregation table they are folded again: docs/spark.md)."""

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass
