"""The tables ``bench writes`` and ``bench scan`` load: today's two-column one (``--schema narrow``, the
default) or a wide one (``--schema wide``): 20 columns of mixed types, DECIMAL, DATE, TIMESTAMP and
ARRAY included, with some nulls, built vectorized (no Python per row) and a function of the row ids only.

Wide rows: ``id BIGINT`` (the primary key), INT, SMALLINT, TINYINT, BIGINT, FLOAT, DOUBLE, BOOLEAN,
``DECIMAL(12,2)``, ``DECIMAL(38,6)``, DATE, TIMESTAMP, TIMESTAMP_NTZ, TIME, a STRING of 16 hex digits, a
STRING of 40, BYTES of 16, ``ARRAY<STRING>`` of 0-3 tags, ``ARRAY<DOUBLE>`` of 0-4 numbers and a STRING
status of a few values; about 10% of the non-key values are null. An encoded value is ~330 bytes.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa

from kvlease.common.tables import Column

SCHEMAS = ("narrow", "wide")
WIDE_COLUMNS = [
    Column("id", "BIGINT"), Column("qty", "INT"), Column("small", "SMALLINT"), Column("tiny", "TINYINT"),
    Column("counter", "BIGINT"), Column("ratio", "FLOAT"), Column("score", "DOUBLE"), Column("active", "BOOLEAN"),
    Column("amount", "DECIMAL(12,2)"), Column("total", "DECIMAL(38,6)"), Column("day", "DATE"),
    Column("created", "TIMESTAMP"), Column("local_time", "TIMESTAMP_NTZ"), Column("tod", "TIME"),
    Column("code", "STRING"), Column("note", "STRING"), Column("digest", "BYTES"), Column("tags", "ARRAY<STRING>"),
    Column("readings", "ARRAY<DOUBLE>"), Column("status", "STRING"),
]
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_TAGS = pa.array(["red", "green", "blue", "urgent", "archived", "eu", "us", "promo"], pa.string())
_STATUS = pa.array(["new", "paid", "shipped", "returned"], pa.string())


def schema_name(text: str) -> str:
    """``--schema``: ``narrow`` (today's two columns) or ``wide`` (20 columns of mixed types)."""
    if text not in SCHEMAS:
        raise argparse.ArgumentTypeError(f"unknown schema {text!r}: one of {', '.join(SCHEMAS)}")
    return text


def wide_batch(ids: np.ndarray, salt: int = 0) -> pa.RecordBatch:
    """The wide rows of ``ids`` (int64), a function of ``(ids, salt)``."""
    n = len(ids)
    rng = np.random.default_rng([salt, int(ids[0]) if n else 0, n])

    def nulls() -> np.ndarray:
        return rng.random(n) < 0.1

    def ints(low: int, high: int, dtype) -> pa.Array:
        return pa.array(rng.integers(low, high, n, dtype=np.int64).astype(dtype), mask=nulls())

    cents = rng.integers(-10**9, 10**9, n)
    micros = rng.integers(1_600_000_000_000_000, 1_800_000_000_000_000, n)
    columns = {
        "id": pa.array(ids, pa.int64()), "qty": ints(-10**6, 10**6, np.int32),
        "small": ints(-30000, 30000, np.int16), "tiny": ints(-100, 100, np.int8),
        "counter": ints(0, 1 << 50, np.int64), "ratio": pa.array(rng.random(n).astype(np.float32), mask=nulls()),
        "score": pa.array(rng.normal(0, 1000, n), mask=nulls()),
        "active": pa.array(rng.random(n) < 0.5, mask=nulls()),
        "amount": _decimal(cents, 12, 2, nulls()),
        "total": _decimal(rng.integers(-10**15, 10**15, n), 38, 6, nulls()),
        "day": pa.array(rng.integers(-3000, 20000, n).astype(np.int32), pa.int32(), mask=nulls()).cast(pa.date32()),
        "created": pa.array(micros, pa.int64(), mask=nulls()).cast(pa.timestamp("us")),
        "local_time": pa.array(micros - 3_600_000_000, pa.int64(), mask=nulls()).cast(pa.timestamp("us")),
        "tod": pa.array(rng.integers(0, 86_400_000_000, n), pa.int64(), mask=nulls()).cast(pa.time64("us")),
        "code": _hex_strings(rng, n, 16, None), "note": _hex_strings(rng, n, 40, nulls()),
        "digest": _hex_strings(rng, n, 16, nulls()).cast(pa.binary()),
        "tags": _lists(rng, n, 3, _TAGS.take(pa.array(rng.integers(0, len(_TAGS), 3 * n)))),
        "readings": _lists(rng, n, 4, pa.array(rng.normal(0, 1, 4 * n))),
        "status": _STATUS.take(pa.array(rng.integers(0, len(_STATUS), n), mask=nulls())),
    }
    return pa.record_batch(columns)


def _decimal(unscaled: np.ndarray, precision: int, scale: int, mask: np.ndarray) -> pa.Array:
    """A decimal128 array of the int64 ``unscaled`` values (sign-extended to 128 bits), null where ``mask``."""
    words = np.empty((len(unscaled), 2), "<i8")
    words[:, 0], words[:, 1] = unscaled, unscaled >> 63
    validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
    return pa.Array.from_buffers(pa.decimal128(precision, scale), len(unscaled), [validity, pa.py_buffer(words)])


def _hex_strings(rng, n: int, width: int, mask: np.ndarray | None) -> pa.Array:
    data = _HEX[rng.integers(0, 16, size=(n, width), dtype=np.uint8)].tobytes()
    offsets = pa.py_buffer(np.arange(0, width * (n + 1), width, dtype=np.int32))
    validity = None if mask is None else pa.py_buffer(np.packbits(~mask, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), n, [validity, offsets, pa.py_buffer(data)])


def _lists(rng, n: int, most: int, pool: pa.Array) -> pa.Array:
    """Lists of 0..``most`` elements taken in order from ``pool`` (at least ``most * n`` long)."""
    counts = rng.integers(0, most + 1, n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pool.slice(0, int(offsets[-1])))
