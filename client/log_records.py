"""Changelog records as table rows: what the table client makes of a FetchLog answer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.codec import RowCodec
from kvlease.common.logentry import ChangeType, LogEntry

#: The record's own columns, first in :func:`log_schema`; the table's columns follow. A table
#: column may have one of these names too: select the table's part by position (``LOG_COLUMNS``
#: onwards), as :meth:`kvlease.client.table.TableClient.fetch_log` does.
LOG_COLUMNS = ("offset", "change_type", "timestamp")


def log_schema(codec: RowCodec) -> pa.Schema:
    """``offset`` (int64), ``change_type`` (int8), ``timestamp`` (int64, ms since the epoch: the
    append time of the record's entry; null for an entry written before format version 2), then
    the table's columns."""
    return pa.schema([pa.field("offset", pa.int64()), pa.field("change_type", pa.int8()),
                      pa.field("timestamp", pa.int64()), *codec.schema])


def entry_records(entry: LogEntry) -> pa.RecordBatch:
    """An entry's records as ``offset``, ``change_type``, ``timestamp``, ``key``, ``value``; without the -D
    records that carry no before-image: a row TTL's deletes of a ``--ttl-changelog none`` table, which the
    change feed skips (docs/changelog.md, "Row TTL"; their offsets are gaps)."""
    records = entry.records
    batch = pa.RecordBatch.from_arrays(
        [entry.offsets(), records.column("change_type"), entry.timestamps(), records.column("key"),
         records.column("value")], names=["offset", "change_type", "timestamp", "key", "value"])
    values = records.column("value")
    if not values.null_count:
        return batch
    hidden = pc.and_(pc.equal(records.column("change_type"), int(ChangeType.DELETE)), pc.is_null(values))
    return batch.filter(pc.invert(hidden)) if pc.any(hidden).as_py() else batch


def decode_records(codec: RowCodec, records: pa.RecordBatch) -> pa.RecordBatch:
    """Records (:func:`entry_records`) in :func:`log_schema`: the row of +I/+U, the before-image of
    -U/-D, and only the key columns for a record without a value."""
    values = records.column("value")
    if values.null_count == 0:
        rows = codec.decode_values(values)
    else:  # records without a value: their key columns, the rest null
        valid = values.is_valid()
        full = codec.decode_values(pc.drop_null(values))
        keys = codec.decode_keys(pc.filter(records.column("key"), pc.invert(valid)))
        key_rows = pa.RecordBatch.from_arrays(
            [keys.column(f.name) if f.name in keys.schema.names else pa.nulls(keys.num_rows, f.type)
             for f in codec.schema], schema=codec.schema)
        mask = valid.to_numpy(zero_copy_only=False)
        index = np.empty(len(mask), dtype=np.int64)
        index[mask] = np.arange(full.num_rows)
        index[~mask] = full.num_rows + np.arange(key_rows.num_rows)
        rows = pa.concat_batches([full, key_rows]).take(pa.array(index))
    return pa.RecordBatch.from_arrays(
        [records.column("offset"), records.column("change_type"), records.column("timestamp"), *rows.columns],
        schema=log_schema(codec))


_SHORT = {int(ct): ct.short for ct in ChangeType}


def log_rows(batch: pa.RecordBatch) -> list[dict]:
    """Records in :func:`log_schema` as dicts ``{"offset", "change_type" ("+I", ...), "timestamp", "row"}``."""
    # by position: a table column may share a name with a record column
    offsets, types, stamps = (batch.column(i).to_pylist() for i in range(len(LOG_COLUMNS)))
    rows = batch.select(range(len(LOG_COLUMNS), batch.num_columns)).to_pylist()
    return [{"offset": offset, "change_type": _SHORT[change_type], "timestamp": stamp, "row": row}
            for offset, change_type, stamp, row in zip(offsets, types, stamps, rows)]
