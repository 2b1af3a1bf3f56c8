"""The table client's input: what callers pass, as checked Arrow batches split by bucket, in one pass.

Rows come as dicts, an Arrow RecordBatch or an Arrow Table; keys as dicts,
tuples (primary-key order), scalars (a one-column key) or a batch.
:func:`rows_by_bucket` and :func:`keys_by_bucket` are what a write or a
lookup sends: the input is normalised (a Table to one batch, keys of one form
to one list per key column), checked and converted by the table's
:class:`~kvlease.common.codec.RowCodec`, its keys encoded once (not checked again)
and the rows divided among the buckets. The codec never calls back here. A bad
row raises :class:`~kvlease.common.errors.InvalidRowError` naming the row and column
before anything is sent. :func:`row_batch`, :func:`key_batch` and :func:`split`
are the steps on their own.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from kvlease.common import errors
from kvlease.common.codec import RowCodec
from kvlease.common.errors import show

#: ``(bucket, its rows, their indices in the input)``.
Part = tuple[int, pa.RecordBatch, np.ndarray]


def rows_by_bucket(codec: RowCodec, rows: Sequence[dict] | pa.RecordBatch | pa.Table) -> list[Part]:
    """Rows checked, converted and split by bucket (:func:`row_batch`, then :func:`split` of its keys, which
    are not checked twice): what an upsert sends."""
    return split_checked(codec, row_batch(codec, rows))


def keys_by_bucket(codec: RowCodec, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> list[Part]:
    """Keys checked, converted and split by bucket (:func:`key_batch`, then :func:`split`): what a delete or a
    lookup sends."""
    return split_checked(codec, key_batch(codec, keys))


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
    pk = codec.table.primary_key
    if isinstance(keys, pa.RecordBatch):  # checked like rows: names, types, no null key
        return codec.validate(keys).select(list(pk))
    check_collection(keys, "keys", "key", "dicts, tuples or values")
    keys = list(keys)
    columns = _key_columns(pk, keys)
    if columns is not None:
        return codec.keys_to_batch(columns)
    return codec.to_batch(_key_rows(pk, keys)).select(list(pk))


def _key_columns(pk: Sequence[str], keys: list) -> list[list] | None:
    """Keys all of one form, scalars of a one-column key or tuples (lists) of every key column, as one list of
    values per key column, without a Python step per key; None for dicts or a mix, which go key by key."""
    kinds = set(map(type, keys))
    if len(pk) == 1 and not any(issubclass(kind, (dict, tuple, list)) for kind in kinds):
        return [keys]
    if kinds and all(issubclass(kind, (tuple, list)) for kind in kinds) and set(map(len, keys)) == {len(pk)}:
        return [list(column) for column in zip(*keys)]
    return None


def _key_rows(pk: Sequence[str], keys: list) -> list[dict]:
    """Each key as a row (a dict), for :meth:`RowCodec.to_batch`: a dict key is checked as a row, its other
    columns too; InvalidRowError for the first key of no form."""
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
    return rows


def split(codec: RowCodec, batch: pa.RecordBatch) -> list[Part]:
    """``[(bucket, rows of that bucket, their indices in batch)]`` for the buckets that get rows; the key
    columns of ``batch`` are checked (:meth:`RowCodec.encode_keys`)."""
    return _parts(codec, batch, codec.encode_keys)


def split_checked(codec: RowCodec, checked: pa.RecordBatch) -> list[Part]:
    """:func:`split` of a batch the codec made or checked: its keys are encoded without a second check."""
    return _parts(codec, checked, codec.encode_checked_keys)


def _parts(codec: RowCodec, batch: pa.RecordBatch, encode_keys: Callable[[pa.RecordBatch], list[bytes]]) -> list[Part]:
    """``batch`` divided among its table's buckets by its keys (``encode_keys``; the bucket key's part of each
    when the table has one: :meth:`RowCodec.buckets`).

    Vectorized: the keys are encoded and hashed once, then one ``take``
    orders the rows by bucket (stable) and each bucket is a zero-copy slice.
    """
    n = codec.table.buckets
    if batch.num_rows == 0:
        return []
    if n == 1:
        return [(0, batch, np.arange(batch.num_rows))]
    order, groups = by_bucket(codec.buckets(encode_keys(batch)).astype(np.int64), n)
    ordered = batch.take(pa.array(order))
    return [(bucket, ordered.slice(start, count), order[start:start + count]) for bucket, start, count in groups]


def by_bucket(buckets: np.ndarray, n: int) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The stable order that groups items by their ``buckets`` (of ``n``), and ``(bucket, start, count)`` of each
    bucket that has items, in that order."""
    order = np.argsort(buckets, kind="stable")
    counts = np.bincount(buckets, minlength=n)
    groups, start = [], 0
    for bucket in np.flatnonzero(counts).tolist():
        count = int(counts[bucket])
        groups.append((bucket, start, count))
        start += count
    return order, groups


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


def concat(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    """One batch of ``schema`` with the rows of ``batches`` in order (an empty one for none)."""
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
