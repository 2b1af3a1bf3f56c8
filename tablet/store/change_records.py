"""The change records of one write: +I, -U/+U and -D with before-images (``docs/changelog.md``).

Pure functions on Arrow arrays, used by :meth:`kvlease.tablet.bucket.store.BucketStore.write`
under its write lock: they read nothing of the store.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.logentry import SCHEMA, ChangeType

_INSERT, _UPDATE_BEFORE, _UPDATE_AFTER, _DELETE = (int(ct) for ct in ChangeType)


def increasing(keys: pa.Array) -> bool:
    """Whether the keys are strictly increasing (the usual batch): then they are distinct, and the
    first and the last are the lowest and the highest."""
    n = len(keys)
    return n < 2 or pc.all(pc.less(keys.slice(0, n - 1), keys.slice(1))).as_py()


def records_unique(keys: pa.Array, up_values: pa.Array, olds: pa.Array) -> pa.RecordBatch:
    """The change records of a write whose keys are all distinct, vectorized.

    ``keys`` = upsert keys then delete keys; ``olds`` their current values
    (null where missing).
    """
    n, n_up = len(keys), len(up_values)
    if olds.null_count == n:  # nothing exists yet: all inserts, deletes find nothing
        return pa.RecordBatch.from_arrays(
            [pa.array(np.full(n_up, _INSERT, np.int8)), keys.slice(0, n_up), up_values], schema=SCHEMA)
    exists = olds.is_valid().to_numpy(zero_copy_only=False)
    existed_up = exists[:n_up]
    rows = np.repeat(np.arange(n_up), 1 + existed_up)  # an update emits two records
    first = np.ones(len(rows), bool)
    first[1:] = rows[1:] != rows[:-1]
    update = existed_up[rows]
    up_types = np.where(update, np.where(first, _UPDATE_BEFORE, _UPDATE_AFTER), _INSERT)
    up_sources = np.where(update & first, rows, n + rows)  # index into olds ++ up_values
    deleted = np.flatnonzero(exists[n_up:]) + n_up
    types = np.concatenate([up_types, np.full(len(deleted), _DELETE)]).astype(np.int8)
    key_index = np.concatenate([rows, deleted])
    sources = np.concatenate([up_sources, deleted])
    values = pa.concat_arrays([olds, up_values]).take(pa.array(sources))
    return pa.RecordBatch.from_arrays([pa.array(types), keys.take(pa.array(key_index)), values], schema=SCHEMA)


def changes_in_order(keys: list[bytes], up_values: list[bytes], olds: list[bytes | None]):
    """Records and KV effects (put keys, put values, deleted keys) of a write naming some key more
    than once: step by step, so each step gets the right before-image."""
    n_up = len(up_values)
    original: dict[bytes, bytes | None] = {}
    for key, old in zip(keys, olds):
        original.setdefault(key, old)
    current = dict(original)
    types: list[int] = []
    out_keys: list[bytes] = []
    out_values: list[bytes] = []
    for i, key in enumerate(keys):
        old = current[key]
        if i < n_up:
            new = up_values[i]
            if old is None:
                types.append(_INSERT)
            else:
                types += (_UPDATE_BEFORE, _UPDATE_AFTER)
                out_keys.append(key)
                out_values.append(old)
            out_keys.append(key)
            out_values.append(new)
            current[key] = new
        elif old is not None:
            types.append(_DELETE)
            out_keys.append(key)
            out_values.append(old)
            current[key] = None
    records = pa.RecordBatch.from_arrays(
        [pa.array(types, pa.int8()), pa.array(out_keys, pa.binary()), pa.array(out_values, pa.binary())],
        schema=SCHEMA)
    put_keys = [k for k, v in current.items() if v is not None]
    put_values = [current[k] for k in put_keys]
    gone = [k for k, v in current.items() if v is None and original[k] is not None]
    return records, put_keys, put_values, gone
