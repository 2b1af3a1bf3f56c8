"""Which rows a row TTL (:mod:`kvlease.common.row_ttl`) has expired, on decoded Arrow rows; the write-time stamp.

A row is expired at ``now_ms`` when its TTL column's value (ms since the epoch; a TIMESTAMP's instant) plus
the TTL is at most ``now_ms``; a null value never expires. Pure: the caller brings the clock.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.row_ttl import WRITE_TIME_COLUMN, RowTtl


def expired_mask(ttl: RowTtl, rows: pa.RecordBatch, now_ms: int) -> np.ndarray:
    """numpy bool per row of ``rows`` (decoded, the table's schema): whether it is expired at ``now_ms``
    (its TTL column's value + the TTL <= now; a null value never expires)."""
    index = rows.schema.get_field_index(ttl.column)
    if index < 0 or rows.num_rows == 0:
        return np.zeros(rows.num_rows, bool)
    values = rows.column(index)
    if pa.types.is_timestamp(values.type):
        cutoff = pa.scalar(cutoff_ms(ttl, now_ms) * 1000, pa.int64()).cast(pa.timestamp("us")).cast(values.type)
    else:
        cutoff = pa.scalar(cutoff_ms(ttl, now_ms), values.type)
    return pc.fill_null(pc.less_equal(values, cutoff), False).to_numpy(zero_copy_only=False)


def cutoff_ms(ttl: RowTtl, now_ms: int) -> int:
    """The newest TTL column value (ms) that is expired at ``now_ms``."""
    return now_ms - ttl.ttl_ms


def live_rows(ttl: RowTtl | None, rows: pa.RecordBatch, now_ms: int) -> pa.RecordBatch:
    """``rows`` without the expired ones (all of them when ``ttl`` is None)."""
    if ttl is None or rows.num_rows == 0:
        return rows
    expired = expired_mask(ttl, rows, now_ms)
    return rows.filter(pa.array(~expired)) if expired.any() else rows


def live_lookup(ttl: RowTtl, found: np.ndarray, rows: pa.RecordBatch, now_ms: int
                ) -> tuple[np.ndarray, pa.RecordBatch]:
    """A lookup's ``(found, rows)`` (``found`` per key; ``rows``: the found ones, in order) without the expired
    rows: their keys count as not found."""
    found, keep = unexpired(ttl, found, rows, now_ms)
    return found, rows if keep is None else rows.filter(keep)


def unexpired(ttl: RowTtl, found: np.ndarray, rows: pa.RecordBatch, now_ms: int
              ) -> tuple[np.ndarray, pa.BooleanArray | None]:
    """``found`` (per key) with the keys of expired ``rows`` (the found ones, in order) not found, and the mask
    of the rows to keep (None: none expired) for the rows and whatever else runs beside them (stored values)."""
    expired = expired_mask(ttl, rows, now_ms)
    if not expired.any():
        return found, None
    found = found.copy()
    found[np.flatnonzero(found)[expired]] = False
    return found, pa.array(~expired)


def stamp_write_time(ttl: RowTtl | None, schema: pa.Schema, upserts: pa.RecordBatch, now_ms: int) -> pa.RecordBatch:
    """A write-time TTL's upserts with :data:`WRITE_TIME_COLUMN` set to ``now_ms`` (the leader's clock), added
    when missing; other tables' as they are. ``schema``: the table's Arrow schema."""
    if ttl is None or not ttl.write_time or upserts is None:
        return upserts
    kind = schema.field(WRITE_TIME_COLUMN).type
    stamp = pa.array(np.full(upserts.num_rows, now_ms * 1000, np.int64)).cast(pa.timestamp("us")).cast(kind)
    index = upserts.schema.get_field_index(WRITE_TIME_COLUMN)
    if index >= 0:
        return upserts.set_column(index, pa.field(WRITE_TIME_COLUMN, kind), stamp)
    return upserts.append_column(pa.field(WRITE_TIME_COLUMN, kind), stamp)
