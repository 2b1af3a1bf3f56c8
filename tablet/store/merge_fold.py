"""A merge engine's fold of one step of a write whose keys are distinct, on decoded rows (docs/merge-engines.md).

Pure functions on Arrow batches of the table's full rows (its current columns): ``stored`` holds each
key's row (all null where ``existed`` is False), ``rows`` the written ones, ``written`` the columns the
write names (every column for a full-row write; a partial update's own: the others keep their stored
values, or null for a new key). Each returns the rows after the step and which keys it changed; a key an
engine ignores is unchanged, so it gets no change record. The tablet server's write path
(:mod:`kvlease.tablet.bucket.merge_writes`) decodes the stored values, calls these, and encodes the result.
"""

from __future__ import annotations

from typing import Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.errors import InvalidRowError
from kvlease.common.merge_engine import EngineKind, MergeEngine
from kvlease.tablet.store import merge_aggs


def fold_upserts(engine: MergeEngine | None, key: Collection[str], stored: pa.RecordBatch, existed: np.ndarray,
                 rows: pa.RecordBatch, written: Collection[str]) -> tuple[pa.RecordBatch, np.ndarray]:
    """``(rows after, changed)`` of upserting ``rows`` (no engine: the written columns replace the stored)."""
    kind = engine.kind if engine is not None else None
    if kind is EngineKind.VERSIONED:
        _check_version(engine.version_column, rows, written)
    existed_arrow = pa.array(existed, pa.bool_())
    arrays = []
    for name, old in zip(stored.schema.names, stored.columns):
        new = rows.column(name)
        if name in key or (name in written and kind is not EngineKind.AGGREGATION):
            arrays.append(new)
        elif name not in written:
            arrays.append(old)
        else:
            arrays.append(merge_aggs.combine(engine.function(name), name, old, new, existed_arrow))
    after = pa.RecordBatch.from_arrays(arrays, schema=stored.schema)
    if kind is EngineKind.FIRST_ROW:
        changed = ~existed
    elif kind is EngineKind.VERSIONED:
        column = engine.version_column
        newer = pc.greater_equal(rows.column(column), stored.column(column)).fill_null(True)
        changed = ~existed | newer.to_numpy(zero_copy_only=False)
    else:
        changed = np.ones(len(existed), bool)
    return after, changed


def _check_version(column: str, rows: pa.RecordBatch, written: Collection[str]) -> None:
    if column not in written:
        raise InvalidRowError(f"column {column!r}: a write to a versioned table must name its version column",
                              column=column)
    values = rows.column(column)
    if values.null_count:
        i = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise InvalidRowError(f"row {i}, column {column!r}: the version column is null", column=column)


def fold_retracts(engine: MergeEngine | None, key: Collection[str], stored: pa.RecordBatch, existed: np.ndarray,
                  rows: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
    """``(rows after, changed)`` of retracting ``rows`` (aggregation only): each non-null value is taken back
    from its column; a key with no row is unchanged (nothing to take from)."""
    if engine is None or engine.kind is not EngineKind.AGGREGATION:
        raise InvalidRowError("a retract needs a table with the aggregation merge engine")
    arrays = []
    for name, old in zip(stored.schema.names, stored.columns):
        if name in key:
            arrays.append(old)
            continue
        retracted = pc.if_else(pa.array(existed, pa.bool_()), rows.column(name), pa.nulls(len(old), old.type))
        arrays.append(merge_aggs.retract(engine.function(name), name, old, retracted))
    return pa.RecordBatch.from_arrays(arrays, schema=stored.schema), existed.copy()
