"""The table client's input normalisation: what callers pass, as checked Arrow batches split by bucket.

Rows come as dicts, an Arrow RecordBatch or an Arrow Table; keys as dicts,
tuples (primary-key order), scalars (a one-column key) or a batch. Each
becomes one batch checked by the table's :class:`~common.codec.RowCodec`
before anything is sent: a bad one raises
:class:`~common.errors.InvalidRowError` naming the row and column.
:func:`split` divides a batch among the table's buckets.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from common import errors
from common.codec import RowCodec, bucket_of_keys
from common.errors import show


def row_batch(codec: RowCodec, rows: Sequence[dict] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """Rows as one checked batch of the table's schema, from dicts, a RecordBatch or a Table."""
    if isinstance(rows, pa.Table):
        rows = table_to_batch(rows)
    if isinstance(rows, pa.RecordBatch):
        return codec.validate(rows)
    check_collection(rows, "rows", "row", "dicts")
    return codec.to_batch(rows)


def key_batch(codec: RowCodec, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """Primary-key columns from dicts, tuples (primary-key order), scalars (one-column key), or a batch."""
    if isinstance(keys, pa.Table):
        keys = table_to_batch(keys)
    if isinstance(keys, pa.RecordBatch):  # checked like rows: names, types, no null key
        return codec.validate(keys).select(list(codec.table.primary_key))
    check_collection(keys, "keys", "key", "dicts, tuples or values")
    pk = codec.table.primary_key
    rows = []
    for i, key in enumerate(keys):
        if isinstance(key, dict):
            rows.append(key)
        elif isinstance(key, (tuple, list)):
            if len(key) != len(pk):
                raise errors.InvalidRowError(f"row {i}: expected {len(pk)} key value(s) "
                                             f"({', '.join(pk)}), got {len(key)}")
            rows.append(dict(zip(pk, key)))
        elif len(pk) == 1:
            rows.append({pk[0]: key})
        else:
            raise errors.InvalidRowError(f"row {i}: the primary key has {len(pk)} columns "
                                         f"({', '.join(pk)}); give a tuple or a dict, got {show(key)}")
    return codec.to_batch(rows).select(list(pk))


def split(codec: RowCodec, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch, np.ndarray]]:
    """``[(bucket, rows of that bucket, their indices in batch)]`` for the buckets that get rows.

    Vectorized: the keys are encoded and hashed once, then one ``take``
    orders the rows by bucket (stable) and each bucket is a zero-copy slice.
    """
    n = codec.table.buckets
    if batch.num_rows == 0:
        return []
    if n == 1:
        return [(0, batch, np.arange(batch.num_rows))]
    buckets = np.asarray(bucket_of_keys(codec.encode_keys(batch), n), dtype=np.int64)
    order = np.argsort(buckets, kind="stable")
    counts = np.bincount(buckets, minlength=n)
    ordered = batch.take(pa.array(order))
    out, start = [], 0
    for bucket in np.flatnonzero(counts).tolist():
        count = int(counts[bucket])
        out.append((bucket, ordered.slice(start, count), order[start:start + count]))
        start += count
    return out


def check_collection(items: Any, what: str, one: str, forms: str) -> None:
    """InvalidRowError unless ``items`` is a collection of rows or keys: a str, bytes or a dict (one row)
    would be taken apart (into characters, into column names), a number or None is not one."""
    if isinstance(items, (str, bytes, bytearray, memoryview, dict)) or not isinstance(items, Iterable):
        raise errors.InvalidRowError(f"{what} must be a list of {what} ({forms}), an Arrow RecordBatch or an Arrow "
                                     f"Table, got {type(items).__name__} {show(items)}; put a single {one} in a list")


def table_to_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
