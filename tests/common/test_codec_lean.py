"""The lean codec (common/codec_lean.py) against the vectorized one: the same key bytes, the same Python
values as ``decode_values(...).to_pylist()`` (types and exact reprs) on every flat type, edge values and nulls,
and None (the vectorized way) for everything it does not take."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import math

import pyarrow as pa
import pytest

from kvlease.common.codec import TIMESTAMP_MAX_US, TIMESTAMP_MIN_US, RowCodec
from kvlease.common.codec_lean import LeanKeys, LeanValues
from kvlease.common.tables import Column, TableInfo
from kvlease.ops.bench.wide_schema import WIDE_COLUMNS, wide_batch

FLAT = [("k", "BIGINT"), ("b", "BOOLEAN"), ("t", "TINYINT"), ("s", "SMALLINT"), ("i", "INT"), ("f", "FLOAT"),
        ("d", "DOUBLE"), ("dec", "DECIMAL(12,2)"), ("dec0", "DECIMAL(5,0)"), ("big", "DECIMAL(38,6)"),
        ("day", "DATE"), ("tod", "TIME"), ("ts", "TIMESTAMP"), ("ntz", "TIMESTAMP_NTZ"), ("str", "STRING"),
        ("raw", "BYTES")]
D = decimal.Decimal
ROWS = [
    {"k": 1, "b": True, "t": -128, "s": 32767, "i": -2**31, "f": 1.5, "d": -0.0, "dec": D("12.50"), "dec0": 7,
     "big": D("-12345678901234567890123456789012.123456"), "day": dt.date(1, 1, 1), "tod": dt.time(23, 59, 59, 999999),
     "ts": TIMESTAMP_MIN_US, "ntz": dt.datetime(2024, 2, 29, 12, 0), "str": "hé\x00llo", "raw": b"\x00\xff\x00"},
    {"k": -2**63, "b": False, "t": 127, "s": -32768, "i": 2**31 - 1, "f": float("nan"), "d": float("inf"),
     "dec": D("0"), "dec0": D("-99999"), "big": D("0.000001"), "day": dt.date(9999, 12, 31), "tod": dt.time(0),
     "ts": TIMESTAMP_MAX_US, "ntz": 0, "str": "", "raw": b""},
    {"k": 2**63 - 1},  # every other column null
    {"k": 0, "f": 3.4e38, "d": 5e-324, "dec": D("-0.01"), "str": "\U0001F600", "day": dt.date(1969, 12, 31)},
]


def table(columns, key=("k",), schema_id=1) -> TableInfo:
    return TableInfo(7, "db", "t", tuple(Column(n, t) if isinstance(n, str) else n for n, t in columns), key, 4,
                     schema_id=schema_id)


def same(a, b) -> bool:
    """Equal values of the same type (Decimal: the same digits and exponent; NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return repr(a) == repr(b)


def test_values_decode_as_the_vectorized_codec():
    codec = RowCodec(table(FLAT))
    values = codec.encode_values(codec.to_batch(ROWS))
    expected = codec.decode_values(values).to_pylist()
    got = LeanValues(codec.table.columns, codec.schema_id, codec.reads_own_schema).decode(values)
    assert got is not None and len(got) == len(expected)
    for row_got, row_expected in zip(got, expected):
        assert list(row_got) == list(row_expected)
        assert same(row_got, row_expected), (row_got, row_expected)


def test_wide_rows_without_arrays_decode_as_the_vectorized_codec():
    flat = [c for c in WIDE_COLUMNS if not c.type.startswith("ARRAY")]
    codec = RowCodec(TableInfo(7, "db", "t", tuple(flat), ("id",), 4))
    batch = wide_batch(pa.array(range(500), pa.int64()).to_numpy(), salt=3)
    values = codec.encode_values(batch.select([c.name for c in flat]))
    got = LeanValues(codec.table.columns, codec.schema_id, True).decode(values)
    assert got is not None and all(same(a, b) for a, b in zip(got, codec.decode_values(values).to_pylist()))


def test_not_lean_values_are_left_to_the_vectorized_codec():
    codec = RowCodec(table(FLAT))
    value = codec.encode_values(codec.to_batch(ROWS[:1]))[0]
    lean = LeanValues(codec.table.columns, 1, True)
    assert lean.decode([value]) is not None
    other_id = value[:1] + (2).to_bytes(4, "little") + value[5:]
    bad_utf8 = value[:-9] + b"\xff" + value[-8:]  # a byte of the STRING (its length unchanged)
    for bad in (other_id, value[:-1], value + b"x", b"\x01" + value[5:], bad_utf8, b""):
        assert lean.decode([value, bad]) is None
    assert LeanValues(codec.table.columns, 1, usable=False).decode([value]) is None  # read_as: never lean
    nested = table([("k", "BIGINT"), ("a", "ARRAY<INT>")])
    assert not LeanValues(nested.columns, 1, True).usable


@pytest.mark.parametrize("columns,key,keys", [
    ([("k", "BIGINT")], ("k",), [0, -1, 2**63 - 1, -2**63, (5,), [6]]),
    ([("k", "TINYINT"), ("s", "STRING"), ("n", "SMALLINT"), ("r", "BYTES"), ("i", "INT")], ("s", "k", "r", "n", "i"),
     [("a\x00b", 1, b"\x00", -3, 7), ["", -128, b"", 32767, -2**31], ("\U0001F600", 127, b"\xff\x00\x01", 0, 0)]),
])
def test_keys_encode_as_the_vectorized_codec(columns, key, keys):
    codec = RowCodec(table(columns, key))
    lean = LeanKeys([next(c for c in codec.table.columns if c.name == k) for k in key])
    assert lean.usable
    got = lean.encode(keys)
    batch = codec.keys_to_batch([[k if not isinstance(k, (tuple, list)) else k[i] for k in keys]
                                 for i in range(len(key))]) if len(key) > 1 else codec.keys_to_batch(
        [[k[0] if isinstance(k, (tuple, list)) else k for k in keys]])
    assert got == codec.encode_checked_key_array(batch).to_pylist()


def test_keys_it_does_not_take_are_left_to_the_vectorized_codec():
    lean = LeanKeys([Column("k", "INT")])
    for bad in ([True], [2**31], [-2**31 - 1], [1.0], ["1"], [None], [{"k": 1}], [(1, 2)], [D(1)], [1, "x"]):
        assert lean.encode(bad) is None, bad
    text = LeanKeys([Column("s", "STRING")])
    assert text.encode(["\ud800"]) is None and text.encode([b"x"]) is None
    assert LeanKeys([Column("s", "BYTES")]).encode(["x"]) is None
    for kind in ("DATE", "TIMESTAMP", "DECIMAL(10,2)", "DOUBLE", "BOOLEAN"):
        assert not LeanKeys([Column("k", kind)]).usable
