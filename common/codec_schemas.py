"""Reading stored rows of any schema id of their table (docs/schemas.md, "Reading rows of earlier schemas").

Every stored value carries the schema id it was written with (common/codec_values.py). A reader reads
them all with its own columns, the *target*: the values of each schema id are decoded with that schema's
columns (``TableInfo.columns_of``: the current ones or one of ``past_schemas``), then projected onto the
target by **field id** (names may have changed since):

- a target column whose field id the schema lacks (added later) is null;
- a schema column whose field id the target lacks (dropped since, or added after a reader that keeps an
  older schema started) is left out;
- a column whose type differs (widened since) is cast to the target's type: exact for a widening; a reader
  that keeps an older, narrower type (a streaming query started before ``--widen-column``) gets each value
  that still fits, and an InvalidRowError naming the column for one that does not.

A schema id the table does not know (a row written after a change the reader has not heard of) is an
:class:`UnknownSchemaError`: :class:`~kvlease.common.codec.RowCodec` asks for the table again once, then
reads on.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.codec_types import arrow_type
from kvlease.common.codec_values import ValueCodec
from kvlease.common.columns import Column
from kvlease.common.errors import InvalidRowError, LeaderNotAvailableError, show
from kvlease.common.tables import TableInfo


class UnknownSchemaError(InvalidRowError):
    """A stored row carries a schema id its reader's table does not know (``details["schema_id"]``)."""


def columns_schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns])


class Projection:
    """Batches of ``source`` columns -> batches of ``target`` columns, column by field id (module docstring)."""

    def __init__(self, source: Sequence[Column], target: Sequence[Column], schema: pa.Schema) -> None:
        by_id = {c.id: j for j, c in enumerate(source)}
        self.schema = schema
        self.target = tuple(target)
        self.picks = [by_id.get(c.id) for c in self.target]
        self.casts = [j is not None and source[j].type != c.type for j, c in zip(self.picks, self.target)]
        self.identity = self.picks == list(range(len(source))) and not any(self.casts)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.identity:
            return pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)
        arrays = []
        for j, cast, column, field in zip(self.picks, self.casts, self.target, self.schema):
            if j is None:
                arrays.append(pa.nulls(batch.num_rows, field.type))
            elif cast:
                arrays.append(_cast(batch.column(j), field.type, column))
            else:
                arrays.append(batch.column(j))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _cast(array: pa.Array, to: pa.DataType, column: Column) -> pa.Array:
    try:
        return pc.cast(array, to, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidRowError(
            f"column {show(column.name)}: a stored value does not fit this reader's type {column.type} (the "
            f"column was widened after the reader took its schema: open it again to read the new type): "
            f"{exc}", column=column.name) from None


class SchemaReader:
    """Reads values of every schema id of ``table`` as ``target`` (``schema``: its Arrow schema); ``refresh``
    (optional) returns the table again, with the schemas it gained since, when a value names one it does
    not know."""

    def __init__(self, table: TableInfo, target: Sequence[Column], schema: pa.Schema,
                 refresh: Callable[[], TableInfo] | None = None) -> None:
        self.table, self.target, self.schema, self.refresh = table, tuple(target), schema, refresh
        self._parts: dict[int, tuple[ValueCodec, Projection]] = {}

    def read(self, array: pa.Array, ids: np.ndarray, base: int) -> pa.RecordBatch:
        """The rows of ``array`` (values whose schema ids are ``ids``), in order, as the target's columns."""
        kinds = np.unique(ids)
        if len(kinds) == 1:
            return self._read_one(int(kinds[0]), array, base)
        rows = [np.flatnonzero(ids == sid) for sid in kinds]
        parts = [self._read_one(int(sid), array.take(pa.array(at)), base) for sid, at in zip(kinds, rows)]
        order = np.empty(len(array), np.int64)
        order[np.concatenate(rows)] = np.arange(len(array))
        return pa.concat_batches(parts).take(pa.array(order))

    def _read_one(self, schema_id: int, array: pa.Array, base: int) -> pa.RecordBatch:
        codec, project = self._part(schema_id)
        return project(codec.decode_same_schema(array, base))

    def _part(self, schema_id: int) -> tuple[ValueCodec, Projection]:
        part = self._parts.get(schema_id)
        if part is None:
            columns = self.table.columns_of(schema_id)
            if columns is None and self.refresh is not None and schema_id > self.table.schema_id:
                self.table = self.refresh()  # a change this reader had not heard of
                columns = self.table.columns_of(schema_id)
            if columns is None:
                raise UnknownSchemaError(
                    f"a stored row of {self.table.where} carries schema id {schema_id}, which this reader does not "
                    f"know (it knows {self.table.schema_id} and earlier): read the table's definition again",
                    schema_id=schema_id)
            part = (ValueCodec(columns, columns_schema(columns), schema_id),
                    Projection(columns, self.target, self.schema))
            self._parts[schema_id] = part
        return part


def batch_as_current(batch: pa.RecordBatch, schema_id: int, table: TableInfo) -> pa.RecordBatch:
    """A write's rows named by the columns of ``table``'s schema ``schema_id`` (a writer opened before a
    change), named by its current columns: by field id, a renamed column takes its new name and a dropped
    one is left out (a widened one is the codec's safe widening on write). A name that schema does not have
    stays, for the codec to refuse. A later schema than ``table``'s: LeaderNotAvailableError (retried: the
    coordinator's push of it has not reached this server yet)."""
    if schema_id == table.schema_id:
        return batch
    columns = table.columns_of(schema_id)
    if columns is None:
        if schema_id > table.schema_id:
            raise LeaderNotAvailableError(f"the schema id {schema_id} of {table.where} has not reached this tablet "
                                          f"server yet (it holds {table.schema_id}): retry in a moment")
        raise InvalidRowError(f"the rows are of schema id {schema_id}, which {table.where} never had")
    ids = {c.name: c.id for c in columns}
    current = {c.id: c.name for c in table.columns}
    names, arrays = [], []
    for name, array in zip(batch.schema.names, batch.columns):
        if name in ids and ids[name] not in current:
            continue  # dropped since: not stored
        names.append(current.get(ids.get(name), name))
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=names)
