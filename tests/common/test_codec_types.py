"""Tier 1: every column type through the row codec (common/codec*.py): key order, round trips, nested values,
value format 2 and its schema id, format 1 still read, safe widenings, Python values.

The key-order property runs over random values of every key type (hypothesis): encoded byte order must be
value order, negatives, -0.0 / NaN, decimals of mixed scale, dates before 1970 and microsecond timestamps
included. Layouts are pinned with literals (stored data must never change silently).
"""

from __future__ import annotations

import dataclasses

import datetime as dt
import math
import random
import struct
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvlease.common import codec_types
from kvlease.common.codec import RowCodec, UnknownSchemaError, value_schema_ids
from kvlease.common.errors import InvalidRowError, InvalidTableError
from kvlease.common.tables import Column, TableInfo, TableSpec, validate_spec

pytestmark = pytest.mark.unit

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPOCH = dt.datetime(1970, 1, 1)


def make_table(columns: list[tuple[str, str]], primary_key: tuple[str, ...], schema_id: int | None = None):
    table = TableInfo(7, "db", "t", tuple(Column(n, t) for n, t in columns), primary_key, 4)
    return table if schema_id is None else dataclasses.replace(table, schema_id=schema_id)


def decimals(precision: int, scale: int):
    """Decimals of DECIMAL(precision, scale), of every scale up to ``scale`` (1.5 and 1.25 in one column)."""
    bound = 10 ** (precision - scale) - 1
    return st.integers(0, scale).flatmap(lambda places: st.decimals(
        min_value=-bound, max_value=bound, places=places, allow_nan=False, allow_infinity=False))


KEY_VALUES = {
    "BOOLEAN": st.booleans(),
    "TINYINT": st.integers(-2**7, 2**7 - 1),
    "SMALLINT": st.integers(-2**15, 2**15 - 1),
    "INT": st.integers(-2**31, 2**31 - 1),
    "BIGINT": st.integers(-2**63, 2**63 - 1),
    "FLOAT": st.floats(width=32) | st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]),
    "DOUBLE": st.floats() | st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]),
    "DECIMAL(5,2)": decimals(5, 2),
    "DECIMAL(18,3)": decimals(18, 3),
    "DECIMAL(38,6)": decimals(38, 6),
    "STRING": st.text(alphabet="a\x00\x01\xffbü", max_size=4) | st.text(max_size=8),
    "BYTES": st.binary(max_size=6),
    "DATE": st.dates(),
    "TIME": st.times(),
    "TIMESTAMP": st.datetimes() | st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999),
    "TIMESTAMP_NTZ": st.datetimes(),
}


def order_key(type_: str, value):
    """The order encoded keys must follow: floats as Java's compare (-0.0 < 0.0, one NaN last), decimals by
    value, timestamps by microsecond."""
    if type_ in ("FLOAT", "DOUBLE"):
        return (1, 0.0, 0.0) if math.isnan(value) else (0, value, math.copysign(1.0, value))
    if type_ == "STRING":
        return value.encode()
    if type_.startswith("TIMESTAMP") and isinstance(value, dt.datetime):
        return (value - EPOCH) // dt.timedelta(microseconds=1)
    return value


def cmp(a, b) -> int:
    return -1 if a < b else (1 if a > b else 0)


@FAST
@given(st.data())
def test_key_bytes_order_is_value_order_for_every_key_type(data):
    key_types = data.draw(st.lists(st.sampled_from(sorted(KEY_VALUES)), min_size=1, max_size=3), label="types")
    names = [f"k{j}" for j in range(len(key_types))]
    c = RowCodec(make_table(list(zip(names, key_types)), tuple(names)))
    rows = data.draw(st.lists(st.fixed_dictionaries({n: KEY_VALUES[t] for n, t in zip(names, key_types)}),
                              min_size=2, max_size=12))
    batch = c.to_batch(rows)
    keys = c.encode_keys(batch)
    tuples = [tuple(order_key(t, r[n]) for n, t in zip(names, key_types)) for r in rows]
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert cmp(keys[i], keys[j]) == cmp(tuples[i], tuples[j]), (rows[i], rows[j])
    decoded = c.decode_keys(keys)
    assert c.encode_keys(decoded) == keys  # the decoded key is the same key (NaN: the canonical one)


@pytest.mark.parametrize("type_", sorted(KEY_VALUES))
def test_key_order_of_each_type_over_seeded_random_values(type_):
    """The same property, one type at a time over 300 values (hypothesis' shrinking aside)."""
    rng = random.Random(42)
    c = RowCodec(make_table([("k", type_)], ("k",)))
    values = _random_values(type_, rng, 300)
    keys = c.encode_keys(c.to_batch([{"k": v} for v in values]))
    by_key = [values[i] for i in sorted(range(len(values)), key=keys.__getitem__)]
    assert [order_key(type_, v) for v in by_key] == sorted(order_key(type_, v) for v in values)


def _random_values(type_: str, rng: random.Random, n: int) -> list:
    def one():
        if type_ == "BOOLEAN":
            return rng.random() < 0.5
        if type_ in ("TINYINT", "SMALLINT", "INT", "BIGINT"):
            bits = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "BIGINT": 64}[type_]
            return rng.randrange(-2 ** (bits - 1), 2 ** (bits - 1))
        if type_ in ("FLOAT", "DOUBLE"):
            special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45]
            value = rng.choice(special) if rng.random() < 0.2 else rng.uniform(-1e6, 1e6) * 10.0 ** rng.randint(-30, 30)
            return struct.unpack("<f", struct.pack("<f", value))[0] if type_ == "FLOAT" else value
        if type_.startswith("DECIMAL"):
            precision, scale = map(int, type_[8:-1].split(","))
            places = rng.randint(0, scale)
            return Decimal(rng.randrange(-10 ** (precision - scale + places) + 1,
                                         10 ** (precision - scale + places))).scaleb(-places)
        if type_ == "STRING":
            return "".join(rng.choice("a\x00\x01b\xffü") for _ in range(rng.randint(0, 4)))
        if type_ == "BYTES":
            return bytes(rng.choice(b"\x00\x01\xfea") for _ in range(rng.randint(0, 4)))
        if type_ == "DATE":
            return dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3_652_059))
        if type_ == "TIME":
            return (dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=rng.randrange(86_400_000_000))).time()
        return EPOCH + dt.timedelta(microseconds=rng.randrange(-10**16, 10**16))  # TIMESTAMP(_NTZ)
    return [one() for _ in range(n)]


def test_new_key_layouts_are_pinned():
    columns = [("a", "TINYINT"), ("b", "SMALLINT"), ("c", "FLOAT"), ("d", "DECIMAL(5,2)"), ("e", "DECIMAL(20,2)"),
               ("f", "DATE"), ("g", "TIME"), ("h", "TIMESTAMP_NTZ")]
    c = RowCodec(make_table(columns, tuple(n for n, _ in columns)))
    key = c.encode_keys(c.to_batch([{"a": -1, "b": 1, "c": -1.5, "d": Decimal("-1.5"), "e": Decimal("1.25"),
                                     "f": dt.date(1969, 12, 31), "g": dt.time(0, 0, 0, 1),
                                     "h": dt.datetime(1970, 1, 1, 0, 0, 0, 2)}]))[0]
    assert key.hex(" ") == ("7f "  # TINYINT -1, sign bit flipped
                            "80 01 "  # SMALLINT 1
                            "40 3f ff ff "  # FLOAT -1.5: every bit of 0xbfc00000 flipped
                            "7f ff ff ff ff ff ff 6a "  # DECIMAL(5,2) -1.5: unscaled -150 as an int64
                            "80 00 00 00 00 00 00 00 00 00 00 00 00 00 00 7d "  # DECIMAL(20,2) 1.25: int128 125
                            "7f ff ff ff "  # DATE: -1 day
                            "80 00 00 00 00 00 00 01 "  # TIME: 1 µs
                            "80 00 00 00 00 00 00 02")  # TIMESTAMP_NTZ: 2 µs
    assert c.key_width == 1 + 2 + 4 + 8 + 16 + 4 + 8 + 8


def test_float_keys_nan_is_canonical_and_negative_zero_sorts_below_zero():
    c = RowCodec(make_table([("f", "FLOAT")], ("f",)))
    odd_nan = struct.unpack("<f", struct.pack("<I", 0xFFC00123))[0]
    keys = c.encode_keys(c.to_batch([{"f": odd_nan}, {"f": math.nan}, {"f": -0.0}, {"f": 0.0}]))
    assert keys[0] == keys[1] == bytes.fromhex("ffc00000")
    assert keys[2] == bytes.fromhex("7fffffff") < keys[3] == bytes.fromhex("80000000")


# ---- every type, nested included, through values ---------------------------------------------------

ALL = make_table([
    ("k", "BIGINT"), ("t8", "TINYINT"), ("s16", "SMALLINT"), ("f", "FLOAT"), ("dec", "DECIMAL(12,2)"),
    ("big", "DECIMAL(38,10)"), ("day", "DATE"), ("tod", "TIME"), ("ts", "TIMESTAMP"), ("ntz", "TIMESTAMP_NTZ"),
    ("tags", "ARRAY<STRING>"), ("ints", "ARRAY<INT>"), ("m", "MAP<STRING,DOUBLE>"),
    ("st", "STRUCT<x INT,y STRING,z ARRAY<DECIMAL(5,1)>>"), ("deep", "ARRAY<ARRAY<BYTES>>"),
    ("im", "MAP<INT,ARRAY<DATE>>"), ("sa", "ARRAY<STRUCT<a BOOLEAN,b TIMESTAMP>>"),
], ("k",))
FINITE = st.floats(allow_nan=False, width=32)
NESTED_VALUES = {
    "t8": KEY_VALUES["TINYINT"], "s16": KEY_VALUES["SMALLINT"], "f": FINITE, "dec": decimals(12, 2),
    "big": decimals(38, 10), "day": st.dates(), "tod": st.times(), "ts": st.datetimes(), "ntz": st.datetimes(),
    "tags": st.lists(st.none() | st.text(max_size=5), max_size=4),
    "ints": st.lists(st.none() | KEY_VALUES["INT"], max_size=4),
    "m": st.dictionaries(st.text(max_size=3), st.none() | st.floats(allow_nan=False), max_size=3),
    "st": st.fixed_dictionaries({}, optional={"x": st.none() | KEY_VALUES["INT"], "y": st.none() | st.text(max_size=3),
                                              "z": st.none() | st.lists(st.none() | decimals(5, 1), max_size=3)}),
    "deep": st.lists(st.none() | st.lists(st.none() | st.binary(max_size=3), max_size=3), max_size=3),
    "im": st.dictionaries(KEY_VALUES["INT"], st.none() | st.lists(st.none() | st.dates(), max_size=2), max_size=3),
    "sa": st.lists(st.none() | st.fixed_dictionaries({"a": st.none() | st.booleans(),
                                                      "b": st.none() | st.datetimes()}), max_size=3),
}


@st.composite
def all_rows(draw):
    rows = []
    for k in range(draw(st.integers(0, 8))):
        row = {"k": k}
        for name, values in NESTED_VALUES.items():
            choice = draw(st.sampled_from(["value", "value", "none", "missing"]))
            if choice != "missing":
                row[name] = draw(values) if choice == "value" else None
        rows.append(row)
    return rows


@FAST
@given(all_rows(), st.integers(0, 8), st.integers(0, 8))
def test_every_type_round_trips_exactly_through_values_and_slices(rows, start, length):
    c = RowCodec(ALL)
    batch = c.to_batch(rows)
    keys, values = c.encode(batch)
    assert c.decode_values(values).equals(batch)
    assert c.decode_values(pa.array(values, pa.large_binary())).equals(batch)
    part = batch.slice(start, length)  # offsets inside every nested child
    assert c.encode(part) == (keys[start:start + length], values[start:start + length])
    assert c.decode_values(pa.array(values, pa.binary()).slice(start, length)).equals(part)


def test_python_values_come_back_as_written():
    c = RowCodec(ALL)
    row = {"k": 1, "dec": "123.45", "big": Decimal("-1234567890123456789.0123456789"), "day": dt.date(1960, 5, 1),
           "tod": dt.time(12, 30, 1, 5), "ts": dt.datetime(2020, 1, 1, 3, tzinfo=dt.timezone(dt.timedelta(hours=2))),
           "ntz": dt.datetime(2021, 2, 3, 4, 5, 6, 7), "tags": ("a", None), "m": [("x", 1.5)],
           "st": {"y": "s"}, "im": {3: [dt.date(2000, 1, 1)]}}
    got = c.decode_values(c.encode_values(c.to_batch([row])))
    out = got.to_pylist()[0]
    assert out["dec"] == Decimal("123.45") and str(out["dec"]) == "123.45"
    assert out["big"] == row["big"] and out["day"] == row["day"] and out["tod"] == row["tod"]
    assert out["ts"] == dt.datetime(2020, 1, 1, 1)  # aware -> UTC, kept as the naive UTC time it always was
    assert out["ntz"] == row["ntz"] and out["tags"] == ["a", None] and out["m"] == [("x", 1.5)]
    assert out["st"] == {"x": None, "y": "s", "z": None} and out["im"] == [(3, [dt.date(2000, 1, 1)])]


def test_nested_payload_layout_is_pinned():
    c = RowCodec(make_table([("k", "INT"), ("a", "ARRAY<STRING>"), ("i", "ARRAY<SMALLINT>"),
                             ("m", "MAP<STRING,INT>"), ("s", "STRUCT<x INT,y STRING>")], ("k",)))
    value = c.encode_values(c.to_batch([{"k": 1, "a": ["hi", None], "i": [7, None], "m": {"z": 5},
                                         "s": {"x": None, "y": "q"}}]))[0]
    assert value.hex(" ") == (
        "02 01 00 00 00 00 "  # version 2, schema id 1, no nulls
        "01 00 00 00 "  # the fixed part: k
        "0e 00 00 00 0a 00 00 00 0e 00 00 00 09 00 00 00 "  # the lengths of a, i, m and s
        "02 00 00 00 02 00 00 00 ff ff ff ff 68 69 "  # a: n=2, sizes 2 and -1 (null), "hi"
        "02 00 00 00 00 01 07 00 00 00 "  # i: n=2, null flags 0 1, values 7 and 0
        "01 00 00 00 01 00 00 00 7a 00 05 00 00 00 "  # m: n=1, keys: size 1 "z"; values: flag, 5
        "ff ff ff ff 01 00 00 00 71")  # s: sizes -1 (null x) and 1, then "q"


@FAST
@given(all_rows(), st.data())
def test_damaged_nested_values_are_invalid_row_errors_never_tracebacks(rows, data):
    c = RowCodec(ALL)
    values = c.encode_values(c.to_batch(rows))
    if not values:
        return
    i = data.draw(st.integers(0, len(values) - 1))
    value = bytearray(values[i])
    position = data.draw(st.integers(6, len(value) - 1)) if len(value) > 6 else len(value) - 1
    cut = data.draw(st.booleans())
    damaged = bytes(value[:position]) if cut else bytes(value[:position] + bytes([value[position] ^ 0xFF])
                                                        + value[position + 1:])
    try:
        c.decode_values(values[:i] + [damaged] + values[i + 1:])
    except InvalidRowError:
        pass


def test_nested_columns_are_refused_in_a_primary_key():
    for type_ in ("ARRAY<INT>", "MAP<STRING,INT>", "STRUCT<a INT>"):
        spec = TableSpec("db", "t", (Column("k", type_), Column("v", "INT")), ("k",))
        with pytest.raises(InvalidTableError, match=r"primary key column 'k' is of type .*: a key column cannot"):
            validate_spec(spec)
    spec = TableSpec("db", "t", (Column("k", "decimal(12, 2)"), Column("v", "array<map<string, date>>")), ("k",))
    assert [c.type for c in validate_spec(spec).columns] == ["DECIMAL(12,2)", "ARRAY<MAP<STRING,DATE>>"]


# ---- format 2 and its schema id; format 1 still read ---------------------------------------------

def test_values_carry_the_schema_id_and_version_1_values_still_decode():
    table = make_table([("k", "INT"), ("s", "STRING")], ("k",))
    c = RowCodec(table)
    assert c.schema_id == 1 and RowCodec(table, schema_id=9).schema_id == 9
    assert RowCodec(make_table([("k", "INT")], ("k",), schema_id=4)).schema_id == 4
    v2 = c.encode_values(c.to_batch([{"k": 5, "s": "x"}]))[0]
    assert v2 == bytes.fromhex("02 01000000 00 05000000 01000000 78")
    v1 = bytes.fromhex("01 02 06000000")  # version 1, s null, k = 6 (as written before schema ids)
    assert c.decode_values([v1, v2]).to_pylist() == [{"k": 6, "s": None}, {"k": 5, "s": "x"}]
    assert value_schema_ids([v1, v2, RowCodec(table, schema_id=300).encode_values(
        c.to_batch([{"k": 1}]))[0]]).tolist() == [1, 1, 300]
    assert value_schema_ids([]).dtype == np.uint32


def test_a_value_of_a_schema_id_the_table_does_not_know_is_a_clear_error_and_the_seam_decodes_it():
    table = make_table([("k", "INT"), ("s", "STRING")], ("k",))
    later = RowCodec(table, schema_id=5).encode_values(RowCodec(table).to_batch([{"k": 1, "s": "a"}]))
    with pytest.raises(UnknownSchemaError, match="carries schema id 5, which this reader does not know"):
        RowCodec(table).decode_values(later)
    same_columns = RowCodec(table).values.decode_same_schema(pa.array(later, pa.binary()), 0)  # the seam
    assert same_columns.to_pylist() == [{"k": 1, "s": "a"}]
    with pytest.raises(InvalidRowError, match=r"row 0: not a value of this table \(format version 3"):
        value_schema_ids([b"\x03abc"])


# ---- safe widening on write --------------------------------------------------------------------------

WIDE = make_table([("k", "BIGINT"), ("i", "INT"), ("s", "SMALLINT"), ("d", "DOUBLE"), ("f", "FLOAT"),
                   ("dec", "DECIMAL(12,2)"), ("ts", "TIMESTAMP"), ("ntz", "TIMESTAMP_NTZ"), ("tm", "TIME"),
                   ("a", "ARRAY<INT>"), ("st", "STRUCT<x BIGINT,y DECIMAL(10,3)>")], ("k",))


@pytest.mark.parametrize("name, array, expected", [
    ("k", pa.array([1], pa.int8()), 1), ("k", pa.array([1], pa.int32()), 1), ("k", pa.array([1], pa.uint32()), 1),
    ("i", pa.array([-3], pa.int16()), -3), ("i", pa.array([3], pa.uint16()), 3), ("s", pa.array([-3], pa.int8()), -3),
    ("d", pa.array([0.5], pa.float32()), 0.5),
    ("dec", pa.array([Decimal("1.5")], pa.decimal128(5, 1)), Decimal("1.50")),
    ("dec", pa.array([7], pa.int32()), Decimal("7.00")),
    ("ts", pa.array([1000], pa.timestamp("ms", tz="Europe/Paris")), dt.datetime(1970, 1, 1, 0, 0, 1)),
    ("ntz", pa.array([2], pa.timestamp("s")), dt.datetime(1970, 1, 1, 0, 0, 2)),
    ("tm", pa.array([1500], pa.time32("ms")), dt.time(0, 0, 1, 500000)),
    ("a", pa.array([[1, None]], pa.list_(pa.int16())), [1, None]),
    ("st", pa.array([{"x": 1, "y": Decimal("2.5")}], pa.struct([("x", pa.int32()), ("y", pa.decimal128(4, 1))])),
     {"x": 1, "y": Decimal("2.500")}),
])
def test_safe_widenings_are_cast_on_write(name, array, expected):
    c = RowCodec(WIDE)
    batch = pa.RecordBatch.from_arrays([pa.array([1], pa.int64()), array] if name != "k" else [array],
                                       names=["k", name] if name != "k" else ["k"])
    assert c.decode_values(c.encode_values(batch)).column(name).to_pylist() == [expected]


@pytest.mark.parametrize("name, array, message", [
    ("i", pa.array([1], pa.int64()), "column 'i': expected INT (int32), got int64 (values could be lost"),
    ("s", pa.array([1], pa.uint16()), "column 's': expected SMALLINT (int16), got uint16 (values could be lost"),
    ("f", pa.array([1.0], pa.float64()), "column 'f': expected FLOAT (float), got double (values could be lost"),
    ("d", pa.array([Decimal(1)], pa.decimal128(5, 0)), "column 'd': expected DOUBLE (double), got decimal128(5, 0)"),
    ("dec", pa.array([Decimal("1.125")], pa.decimal128(6, 3)), "column 'dec': expected DECIMAL(12,2) "
                                                               "(decimal128(12, 2)), got decimal128(6, 3)"),
    ("dec", pa.array([1], pa.int64()), "column 'dec': expected DECIMAL(12,2) (decimal128(12, 2)), got int64"),
    ("dec", pa.array([1.5], pa.float64()), "column 'dec': expected DECIMAL(12,2) (decimal128(12, 2)), got double"),
    ("ntz", pa.array([1], pa.timestamp("us", tz="UTC")), "column 'ntz': expected TIMESTAMP_NTZ (timestamp[us]), "
                                                         "got timestamp[us, tz=UTC]"),
    ("ts", pa.array([1], pa.timestamp("ns")), "column 'ts': expected TIMESTAMP (timestamp[us]), got timestamp[ns]"),
    ("a", pa.array([[1]], pa.list_(pa.int64())), "column 'a': expected ARRAY<INT>"),
    ("st", pa.array([{"y": Decimal(1), "x": 1}], pa.struct([("y", pa.decimal128(4, 0)), ("x", pa.int64())])),
     "column 'st': expected STRUCT<x BIGINT,y DECIMAL(10,3)>"),
    ("tm", pa.array([-1], pa.time64("us")), "row 0, column 'tm': -1 µs is not a time of day"),
    ("a", pa.array([[1]], pa.list_(pa.int32())).cast(pa.list_(pa.int32())), None),
])
def test_lossy_or_unknown_types_are_refused_naming_the_column_and_both_types(name, array, message):
    c = RowCodec(WIDE)
    batch = pa.RecordBatch.from_arrays([pa.array([1], pa.int64()), array], names=["k", name])
    if message is None:
        c.validate(batch)
        return
    with pytest.raises(InvalidRowError) as info:
        c.validate(batch)
    assert message in str(info.value)


def test_values_a_reader_could_not_read_back_are_refused():
    c = RowCodec(make_table([("k", "INT"), ("d", "DATE"), ("a", "ARRAY<TIMESTAMP>"), ("x", "DECIMAL(3,0)")], ("k",)))
    cases = [("d", pa.array([3_000_000], pa.date32()), "row 0, column 'd': 3000000 days since the epoch is outside"),
             ("a", pa.array([[2**62]], pa.list_(pa.timestamp("us"))),
              "column 'a': an element holds 4611686018427387904"),
             ("x", pa.array([Decimal(99999)], pa.decimal128(5, 0)).cast(pa.decimal128(3, 0), safe=False),
              "column 'x': a value does not fit DECIMAL(3,0)")]
    for name, array, message in cases:
        with pytest.raises(InvalidRowError) as info:
            c.validate(pa.RecordBatch.from_arrays([pa.array([1], pa.int32()), array], names=["k", name]))
        assert message in str(info.value)


# ---- Python values -------------------------------------------------------------------------------

@pytest.mark.parametrize("column, value, message", [
    ("dec", 1.5, "row 0, column 'dec': expected DECIMAL(12,2), got 1.5"),
    ("dec", "1.234", "row 0, column 'dec': expected DECIMAL(12,2), got '1.234' (1.234 does not fit DECIMAL(12,2)"),
    ("dec", Decimal("12345678901"), "does not fit DECIMAL(12,2) (at most 10 digit(s) before the point"),
    ("dec", "abc", "row 0, column 'dec': expected DECIMAL(12,2), got 'abc'"),
    ("dec", Decimal("NaN"), "NaN is not a number a DECIMAL holds"),
    ("day", dt.datetime(2020, 1, 1), "row 0, column 'day': expected DATE, got datetime.datetime(2020, 1, 1, 0, 0)"),
    ("ntz", dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc), "TIMESTAMP_NTZ takes a naive one"),
    ("tod", "12:00", "row 0, column 'tod': expected TIME, got '12:00'"),
    ("tags", "abc", "row 0, column 'tags': expected ARRAY<STRING>, got 'abc'"),
    ("ints", [1, "x"], "row 0, column 'ints': expected ARRAY<INT>, got [1, 'x']"),
    ("t8", 128, "row 0, column 't8': 128 is out of range for TINYINT (-128..127)"),
    ("st", {"nope": 1}, "row 0, column 'st': expected STRUCT<x INT,y STRING,z ARRAY<DECIMAL(5,1)>>"),
])
def test_python_values_of_the_wrong_kind_are_errors_naming_row_and_column(column, value, message):
    with pytest.raises(InvalidRowError) as info:
        RowCodec(ALL).to_batch([{"k": 1, column: value}])
    assert message in str(info.value)


def test_arrow_type_of_any_type_text_and_arrow_types_computes_on_a_miss():
    assert codec_types.arrow_type("decimal(12, 2)") == pa.decimal128(12, 2)
    assert codec_types.ARROW_TYPES["MAP<STRING,ARRAY<DATE>>"] == pa.map_(pa.string(), pa.list_(pa.date32()))
    assert codec_types.ARROW_TYPES["TIMESTAMP"] == pa.timestamp("us")  # unchanged: stored data, Spark mapping
    assert codec_types.ARROW_TYPES["STRUCT<a TIME>"] == pa.struct([("a", pa.time64("us"))])
    with pytest.raises(InvalidTableError, match="unknown type"):
        codec_types.ARROW_TYPES["NOPE"]


def test_decimals_of_38_digits_fit_exactly_and_one_more_does_not():
    c = RowCodec(make_table([("k", "INT"), ("d", "DECIMAL(38,10)")], ("k",)))
    most = Decimal("9999999999999999999999999999.9999999999")  # 38 digits: more than a context's 28
    least = Decimal("-9999999999999999999999999999.9999999999")  # (-most would round: Decimal arithmetic)
    rows = [{"k": 1, "d": most}, {"k": 2, "d": least}, {"k": 3, "d": Decimal("1.5000000000000")}]
    assert [r["d"] for r in c.decode_values(c.encode_values(c.to_batch(rows))).to_pylist()] == [
        most, least, Decimal("1.5")]
    with pytest.raises(InvalidRowError, match="does not fit DECIMAL"):
        c.to_batch([{"k": 1, "d": Decimal("99999999999999999999999999999.9999999999")}])
