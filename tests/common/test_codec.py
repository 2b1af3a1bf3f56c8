"""Tier 1: the row codec (tablet/codec.py): round trips, key order, errors, buckets, IPC.

Round trips and the key-order property are checked with hypothesis over every
column type; the byte layouts and bucket numbers are pinned with literals,
because stored data and bucket placement must never change silently.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kvlease.common.errors import InvalidRowError
from kvlease.common.tables import Column, TableInfo
from kvlease.common import codec
from kvlease.common.codec import (TIMESTAMP_MAX_US, TIMESTAMP_MIN_US, RowCodec, arrow_schema, batch_to_ipc, bucket_of,
                                  bucket_of_keys, ipc_to_batch, key_schema)

pytestmark = pytest.mark.unit

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_table(columns: list[tuple[str, str]], primary_key: tuple[str, ...]) -> TableInfo:
    return TableInfo(7, "db", "t", tuple(Column(n, t) for n, t in columns), primary_key, 4)


#: The types of the first tables (the other types: tests/common/test_codec_types.py).
TYPES = ("BOOLEAN", "INT", "BIGINT", "DOUBLE", "STRING", "BYTES", "TIMESTAMP")
ALL_TYPES = make_table([("k", "BIGINT"), ("b", "BOOLEAN"), ("i", "INT"), ("l", "BIGINT"), ("d", "DOUBLE"),
                        ("s", "STRING"), ("y", "BYTES"), ("t", "TIMESTAMP")], ("k",))

TRICKY_TEXT = st.text(alphabet="a\x00\x01\xffbü", max_size=4)
TRICKY_BYTES = st.binary(max_size=4).map(lambda b: b.replace(b"\x02", b"\x00"))
VALUES = {
    "BOOLEAN": st.booleans(),
    "INT": st.integers(-2**31, 2**31 - 1),
    "BIGINT": st.integers(-2**63, 2**63 - 1),
    "DOUBLE": st.floats() | st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]),
    "STRING": st.text() | TRICKY_TEXT,
    "BYTES": st.binary() | TRICKY_BYTES,
    "TIMESTAMP": st.datetimes() | st.integers(TIMESTAMP_MIN_US, TIMESTAMP_MAX_US),
}


def same(a: pa.RecordBatch, b: pa.RecordBatch) -> None:
    """Batches equal, comparing doubles by their bits (NaN == NaN, -0.0 != 0.0)."""
    def bits(batch: pa.RecordBatch) -> pa.RecordBatch:
        cols = [c.view(pa.int64()) if c.type == pa.float64() else c for c in batch.columns]
        return pa.RecordBatch.from_arrays(cols, names=batch.schema.names)

    assert a.schema == b.schema
    assert bits(a).equals(bits(b)), (a.to_pylist(), b.to_pylist())


def order_key(type_: str, value):
    """The order the encoded keys must follow (doubles as Java's Double.compare)."""
    if type_ == "DOUBLE":
        return (1, 0.0, 0.0) if math.isnan(value) else (0, value, math.copysign(1.0, value))
    if type_ == "STRING":
        return value.encode()  # UTF-8 byte order is code point order
    if type_ == "TIMESTAMP" and isinstance(value, dt.datetime):
        return (value - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    return value


def canonical_key(type_: str, value):
    if type_ == "DOUBLE" and math.isnan(value):
        return math.nan  # every NaN key is stored as the one canonical NaN
    return value


# ---- schema -----------------------------------------------------------------

def test_arrow_types_of_the_first_table_types():
    assert set(TYPES) <= set(codec.ARROW_TYPES)
    schema = arrow_schema(ALL_TYPES)
    assert schema.names == ["k", "b", "i", "l", "d", "s", "y", "t"]
    assert schema.types == [pa.int64(), pa.bool_(), pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.binary(),
                            pa.timestamp("us")]
    table = make_table([("a", "STRING"), ("b", "INT"), ("c", "DOUBLE")], ("c", "a"))
    assert key_schema(table) == pa.schema([("c", pa.float64()), ("a", pa.string())])


# ---- round trips ------------------------------------------------------------

@st.composite
def all_type_rows(draw):
    rows = []
    for k in range(draw(st.integers(0, 12))):
        row = {"k": k}
        for column in ALL_TYPES.columns[1:]:
            choice = draw(st.sampled_from(["value", "none", "missing"]))
            if choice == "value":
                row[column.name] = draw(VALUES[column.type])
            elif choice == "none":
                row[column.name] = None
        rows.append(row)
    return rows


@FAST
@given(all_type_rows())
@example([{"k": 0, "b": True, "i": -2**31, "l": 2**63 - 1, "d": -0.0, "s": "", "y": b"", "t": 0},
          {"k": 1, "i": 2**31 - 1, "l": -2**63, "d": math.nan, "s": "ü\x00", "y": b"\x00\xff",
           "t": dt.datetime(1, 1, 1)},
          {"k": 2, "d": -math.inf}, {"k": 3, "d": math.inf, "t": dt.datetime(9999, 12, 31, 23, 59, 59, 999999)}])
def test_values_round_trip_every_type_with_nulls(rows):
    c = RowCodec(ALL_TYPES)
    batch = c.to_batch(rows)
    keys, values = c.encode(batch)
    assert len(keys) == len(values) == len(rows)
    assert all(type(v) is bytes for v in keys + values)
    same(c.decode_values(values), batch)
    same(c.decode_keys(keys), batch.select(["k"]))
    same(c.decode_values(pa.array(values, pa.binary())), batch)
    same(c.decode_values(pa.array(values, pa.large_binary())), batch)


@FAST
@given(st.data())
def test_round_trip_when_every_type_is_the_key(data):
    key_types = data.draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3), label="key types")
    names = [f"k{j}" for j in range(len(key_types))]
    table = make_table(list(zip(names, key_types)) + [("v", "STRING")], tuple(reversed(names)))
    c = RowCodec(table)
    rows = data.draw(st.lists(st.fixed_dictionaries(
        {n: VALUES[t] for n, t in zip(names, key_types)}, optional={"v": st.none() | st.text()}), max_size=10))
    batch = c.to_batch(rows)
    keys, values = c.encode(batch)
    assert keys == c.encode_keys(batch) == c.encode_keys(batch.select(list(table.primary_key)))
    expected_keys = c.to_batch([{n: canonical_key(t, r[n]) for n, t in zip(names, key_types)} for r in rows])
    same(c.decode_keys(keys), expected_keys.select(list(table.primary_key)))
    same(c.decode_values(values), batch)


def test_doubles_keep_their_bits_in_values_and_nan_is_canonical_in_keys():
    c = RowCodec(make_table([("d", "DOUBLE"), ("x", "DOUBLE")], ("d",)))
    odd_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF0000000000123))[0]
    batch = c.to_batch([{"d": odd_nan, "x": odd_nan}, {"d": -0.0, "x": -0.0}, {"d": math.nan, "x": 0.0}])
    keys, values = c.encode(batch)
    assert keys[0] == keys[2] == bytes.fromhex("fff8000000000000")
    assert keys[1] == bytes.fromhex("7fffffffffffffff")  # -0.0 sorts just below 0.0 (0x8000000000000000)
    x = c.decode_values(values).column("x").view(pa.int64()).to_pylist()
    assert x[0] == struct.unpack("<q", struct.pack("<Q", 0xFFF0000000000123))[0]
    assert x[1] == struct.unpack("<q", struct.pack("<d", -0.0))[0]


def test_empty_batches_and_sliced_inputs():
    c = RowCodec(ALL_TYPES)
    empty = c.to_batch([])
    assert empty.num_rows == 0 and empty.schema == c.schema
    assert c.encode(empty) == ([], [])
    assert c.decode_values([]).num_rows == 0 and c.decode_values([]).schema == c.schema
    assert c.decode_keys([]).schema == c.key_schema
    rows = [{"k": k, "s": "x" * k, "b": k % 2 == 0, "d": None if k % 3 else k / 3} for k in range(20)]
    batch = c.to_batch(rows)
    keys, values = c.encode(batch)
    part = batch.slice(5, 9)  # non-zero offsets in every column, incl. the bit-packed ones
    assert c.encode(part) == (keys[5:14], values[5:14])
    same(c.decode_values(pa.array(values, pa.binary()).slice(5, 9)), part)
    same(c.decode_keys(pa.chunked_array([keys[:7], keys[7:]], pa.binary())), batch.select(["k"]))


def test_chunked_encode_and_decode_match_one_pass(monkeypatch):
    c = RowCodec(ALL_TYPES)
    batch = c.to_batch([{"k": k, "s": "é" * (k % 5), "i": None if k % 4 else k, "b": k % 3 == 0} for k in range(50)])
    whole = c.encode(batch)
    monkeypatch.setattr(codec, "CHUNK_ROWS", 7)
    assert c.encode(batch) == whole
    same(c.decode_values(whole[1]), batch)
    same(c.decode_keys(whole[0]), batch.select(["k"]))
    broken = list(whole[1])
    broken[23] = broken[23][:-1]
    with pytest.raises(InvalidRowError, match=r"row 23\b"):  # row numbers count across chunks
        c.decode_values(broken)


@pytest.mark.parametrize("chunk_rows", [codec.CHUNK_ROWS, 7])
def test_encode_arrays_hold_the_same_bytes_as_encode(monkeypatch, chunk_rows):
    monkeypatch.setattr(codec, "CHUNK_ROWS", chunk_rows)
    fixed = make_table([("a", "INT"), ("b", "BIGINT"), ("v", "STRING")], ("b", "a"))
    mixed = make_table([("a", "STRING"), ("b", "INT"), ("v", "BYTES")], ("a", "b"))
    cases = [(RowCodec(ALL_TYPES), [{"k": k, "s": "é\x00" * (k % 5), "i": None if k % 4 else k} for k in range(50)]),
             (RowCodec(fixed), [{"a": -k, "b": k * 7, "v": "x" * k} for k in range(30)]),
             (RowCodec(mixed), [{"a": "a\x00" * (k % 3), "b": k, "v": None if k % 2 else b"\x00"} for k in range(30)])]
    for c, rows in cases:
        batch = c.to_batch(rows)
        keys, values = c.encode_arrays(batch)
        assert keys.type == values.type == pa.binary()
        assert (keys.to_pylist(), values.to_pylist()) == c.encode(batch)
        assert c.encode_key_array(batch.select(list(c.table.primary_key))).to_pylist() == c.encode_keys(batch)
        assert [len(k) for k in keys.to_pylist()] == [c.key_width] * len(rows) or c.key_width is None
        assert [len(a) for a in c.encode_arrays(batch.slice(0, 0))] == [0, 0]
    assert (RowCodec(ALL_TYPES).key_width, RowCodec(fixed).key_width, RowCodec(mixed).key_width) == (8, 12, None)


# ---- key order --------------------------------------------------------------

def cmp(a, b) -> int:
    return -1 if a < b else (1 if a > b else 0)


@FAST
@given(st.data())
def test_key_bytes_order_is_key_tuple_order(data):
    key_types = data.draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3), label="key types")
    names = [f"k{j}" for j in range(len(key_types))]
    c = RowCodec(make_table(list(zip(names, key_types)), tuple(names)))
    rows = data.draw(st.lists(st.fixed_dictionaries({n: VALUES[t] for n, t in zip(names, key_types)}),
                              min_size=2, max_size=12))
    keys = c.encode_keys(c.to_batch(rows))
    tuples = [tuple(order_key(t, r[n]) for n, t in zip(names, key_types)) for r in rows]
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert cmp(keys[i], keys[j]) == cmp(tuples[i], tuples[j]), (rows[i], rows[j])


@pytest.mark.parametrize("type_", ["STRING", "BYTES"])
def test_prefixes_and_zero_bytes_sort_like_tuples(type_):
    words = ["", "a", "a\x00", "a\x00\x00", "a\x00\x01", "a\x00b", "a\x01", "ab", "b", "\x00"]
    if type_ == "BYTES":
        words = [w.encode() for w in words] + [b"a\xff", b"\xff"]
    single = RowCodec(make_table([("s", type_)], ("s",)))
    keys = single.encode_keys(single.to_batch([{"s": w} for w in words]))
    assert sorted(words, key=lambda w: keys[words.index(w)]) == sorted(words)
    pair = RowCodec(make_table([("s", type_), ("n", "INT")], ("s", "n")))
    rows = [(w, n) for w in words for n in (-1, 0, 1)]
    keys = pair.encode_keys(pair.to_batch([{"s": w, "n": n} for w, n in rows]))
    assert [rows[i] for i in sorted(range(len(rows)), key=keys.__getitem__)] == sorted(rows)


def test_key_layouts_are_pinned():
    c = RowCodec(make_table([("s", "STRING"), ("n", "BIGINT"), ("i", "INT"), ("b", "BOOLEAN"), ("d", "DOUBLE"),
                             ("t", "TIMESTAMP"), ("y", "BYTES")], ("s", "n", "i", "b", "d", "t", "y")))
    key = c.encode_keys(c.to_batch([{"s": "a\x00", "n": 1, "i": -1, "b": True, "d": 1.5, "t": -1, "y": b""}]))[0]
    assert key.hex(" ") == ("61 00 ff 00 01 "  # 'a', escaped 0x00, terminator
                            "80 00 00 00 00 00 00 01 "  # BIGINT 1, sign bit flipped
                            "7f ff ff ff "  # INT -1
                            "01 "  # True
                            "bf f8 00 00 00 00 00 00 "  # 1.5: sign bit set
                            "7f ff ff ff ff ff ff ff "  # TIMESTAMP -1 µs
                            "00 01")  # empty BYTES: just the terminator


def test_value_layout_is_pinned():
    c = RowCodec(make_table([("k", "INT"), ("s", "STRING"), ("d", "DOUBLE"), ("b", "BOOLEAN")], ("k",)))
    _, values = c.encode(c.to_batch([{"k": 2, "s": "hé", "b": False}]))
    assert values[0].hex(" ") == ("02 "  # format version
                                  "01 00 00 00 "  # schema id 1, uint32 little-endian
                                  "04 "  # null bitmap: column 2 (d) is null
                                  "02 00 00 00 00 00 00 00 00 00 00 00 00 "  # fixed part: INT 2, DOUBLE null (zeros),
                                  "03 00 00 00 68 c3 a9")  # BOOLEAN False; the STRING's length (uint32), its UTF-8


# ---- errors -----------------------------------------------------------------

KV = make_table([("id", "BIGINT"), ("name", "STRING"), ("n", "INT"), ("y", "BYTES"), ("ok", "BOOLEAN"),
                 ("d", "DOUBLE"), ("t", "TIMESTAMP")], ("id",))


@pytest.mark.parametrize("bad, message", [
    ({"id": "abc"}, "row 3, column 'id': expected BIGINT, got 'abc'"),
    ({"id": 9, "zzz": 1}, "row 3, column 'zzz': unknown column"),
    ({"name": "x"}, "row 3, column 'id': primary key is missing"),
    ({"id": None}, "row 3, column 'id': primary key is null"),
    ({"id": 9, "n": 2**31}, "row 3, column 'n': 2147483648 is out of range for INT (-2147483648..2147483647)"),
    ({"id": 2**63}, "row 3, column 'id': 9223372036854775808 is out of range for BIGINT "
                    "(-9223372036854775808..9223372036854775807)"),
    ({"id": True}, "row 3, column 'id': expected BIGINT, got True"),
    ({"id": 1.0}, "row 3, column 'id': expected BIGINT, got 1.0"),
    ({"id": 9, "name": b"x"}, "row 3, column 'name': expected STRING, got b'x'"),
    ({"id": 9, "name": "\ud800"}, "row 3, column 'name': expected STRING"),
    ({"id": 9, "y": "text"}, "row 3, column 'y': expected BYTES, got 'text'"),
    ({"id": 9, "ok": 1}, "row 3, column 'ok': expected BOOLEAN, got 1"),
    ({"id": 9, "d": "1.5"}, "row 3, column 'd': expected DOUBLE, got '1.5'"),
    ({"id": 9, "t": "2020-01-01"}, "row 3, column 't': expected TIMESTAMP, got '2020-01-01'"),
    (["id", 9], "row 3: expected a dict"),
])
def test_to_batch_errors_name_row_and_column(bad, message):
    rows = [{"id": 0}, {"id": 1, "name": "a"}, {"id": 2, "d": 3}, bad, {"id": "later"}]
    with pytest.raises(InvalidRowError) as info:
        RowCodec(KV).to_batch(rows)
    assert message in str(info.value)


def test_to_batch_accepts_the_documented_python_types():
    c = RowCodec(KV)
    aware = dt.datetime(2020, 1, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    batch = c.to_batch([{"id": np.int64(1), "d": 2, "y": bytearray(b"x"), "t": aware, "ok": np.bool_(True)},
                        {"id": 2, "d": np.float32(0.5), "t": 1_577_836_800_000_000}])
    rows = batch.to_pylist()
    assert rows[0]["t"] == rows[1]["t"] == dt.datetime(2020, 1, 1)  # aware -> UTC; int = µs since epoch
    assert rows[0]["d"] == 2.0 and rows[1]["d"] == 0.5 and rows[0]["y"] == b"x" and rows[0]["ok"] is True
    assert rows[1]["name"] is None  # missing non-key column


def good_batch() -> pa.RecordBatch:
    return RowCodec(KV).to_batch([{"id": 1, "name": "a"}, {"id": 2, "n": 5}, {"id": 3}])


def test_validate_reorders_and_fills_missing_non_key_columns():
    c = RowCodec(KV)
    batch = pa.RecordBatch.from_pydict({"n": pa.array([5, None], pa.int32()), "id": pa.array([2, 1], pa.int64())})
    checked = c.validate(batch)
    assert checked.schema == c.schema
    assert checked.to_pylist()[0] == {"id": 2, "name": None, "n": 5, "y": None, "ok": None, "d": None, "t": None}
    assert c.encode(batch) == c.encode(checked)


@pytest.mark.parametrize("change, message", [
    (lambda b: b.set_column(2, "n", b.column(2).cast(pa.int64())),
     "column 'n': expected INT (int32), got int64 (values could be lost: cast them first)"),
    (lambda b: b.set_column(5, "d", b.column(5).cast(pa.decimal128(20, 2))), "column 'd': expected DOUBLE"),
    (lambda b: b.set_column(1, "name", b.column(1).cast(pa.large_string())), "column 'name': expected STRING"),
    (lambda b: b.append_column("zzz", pa.array([1, 2, 3])), "column 'zzz': unknown column"),
    (lambda b: b.drop_columns(["id"]), "column 'id': primary key column is missing"),
    (lambda b: b.append_column("n", pa.array([1, 2, 3], pa.int32())), "column 'n' appears more than once"),
    (lambda b: b.set_column(0, "id", pa.array([1, None, 3], pa.int64())), "row 1, column 'id': primary key is null"),
    (lambda b: pa.Table.from_batches([b]), "expected an Arrow RecordBatch"),
    # readable as a datetime or not at all: a QA walkthrough stored 2**62 µs and no dict read of its bucket worked
    (lambda b: b.set_column(6, "t", pa.array([None, 0, 2**62], pa.timestamp("us"))),
     "row 2, column 't': 4611686018427387904 µs since the epoch is outside the TIMESTAMP range (years 1 to 9999)"),
    (lambda b: b.set_column(6, "t", pa.array([TIMESTAMP_MIN_US - 1, 0, 0], pa.timestamp("us"))),
     "row 0, column 't': -62135596800000001 µs"),
])
def test_validate_rejects_bad_batches(change, message):
    c = RowCodec(KV)
    bad = change(good_batch())
    for call in (c.validate, c.encode, c.encode_values):
        with pytest.raises(InvalidRowError) as info:
            call(bad)
        assert message in str(info.value)


def test_encode_keys_checks_key_columns_too():
    c = RowCodec(KV)
    with pytest.raises(InvalidRowError, match="column 'id': primary key column is missing"):
        c.encode_keys(pa.RecordBatch.from_pydict({"name": ["a"]}))
    with pytest.raises(InvalidRowError, match="row 0, column 'id': primary key is null"):
        c.encode_keys(pa.RecordBatch.from_pydict({"id": pa.array([None], pa.int64())}))


@pytest.mark.parametrize("keys, message", [
    ([1, None], "row 1, column 'id': primary key is null"),
    ([1, "x"], "row 1, column 'id': expected BIGINT, got 'x'"),
    ([1, 2, 2**63], "row 2, column 'id': 9223372036854775808 is out of range for BIGINT"),
])
def test_keys_to_batch_checks_key_values_as_to_batch_checks_rows(keys, message):
    c = RowCodec(KV)
    assert c.keys_to_batch([[3, 1]]).equals(c.to_batch([{"id": 3}, {"id": 1}]).select(["id"]))
    assert c.keys_to_batch([[]]).schema == c.key_schema
    with pytest.raises(InvalidRowError) as info:
        c.keys_to_batch([keys])
    assert message in str(info.value)
    with pytest.raises(InvalidRowError) as info:
        c.to_batch([{"id": k} for k in keys])
    assert message in str(info.value)


def test_encode_checked_keys_are_encode_keys_of_a_batch_the_codec_made():
    c = RowCodec(KV)
    batch = good_batch()
    assert c.encode_checked_keys(batch) == c.encode_keys(batch) == c.encode_checked_keys(batch.select(["id"]))


def test_decode_rejects_bytes_that_are_not_rows_of_the_table():
    c = RowCodec(KV)
    keys, values = c.encode(good_batch())
    cases = [
        (values[:2] + [values[2][:-1]], "row 2: not a value of this table"),
        (values[:1] + [values[1] + b"x"], "row 1: not a value of this table (has trailing bytes)"),
        ([b"\x03" + values[0][1:]], "row 0: not a value of this table (format version 3, expected 1 or 2"),
        ([values[0][:3]], "row 0: not a value of this table (shorter than its header)"),
        ([values[0], b""], "row 1: not a value of this table (shorter than its header)"),
        ([values[0], None], "row 1: value is null"),
        ([values[0], 5], "row 1: value must be bytes"),
    ]
    for bad, message in cases:
        with pytest.raises(InvalidRowError) as info:
            c.decode_values(bad)
        assert message in str(info.value)
    with pytest.raises(InvalidRowError, match="row 1: not a key of this table"):
        c.decode_keys([keys[0], keys[1][:-1]])
    strings = RowCodec(make_table([("s", "STRING")], ("s",)))
    with pytest.raises(InvalidRowError, match="row 0: not a key of this table"):
        strings.decode_keys([b"no terminator"])
    with pytest.raises(InvalidRowError, match="not valid UTF-8"):
        strings.decode_keys([b"\xff\x00\x01"])


# ---- buckets ----------------------------------------------------------------

def test_bucket_of_is_pinned_crc32():
    assert [bucket_of(k, 16) for k in (b"", b"hello", bytes.fromhex("8000000000000001"), b"a\x00\x01")] == [
        0, 6, 5, 3]
    assert bucket_of(b"hello", 1_000_003) == 907060870 % 1_000_003 == zlib.crc32(b"hello") % 1_000_003
    c = RowCodec(make_table([("id", "BIGINT")], ("id",)))
    keys = c.encode_keys(c.to_batch([{"id": i} for i in range(6)]))
    assert bucket_of_keys(keys, 8) == [bucket_of(k, 8) for k in keys] == [3, 5, 7, 1, 2, 4]


@FAST
@given(st.lists(st.binary(), max_size=20), st.integers(1, 1024))
def test_buckets_in_range_and_same_one_by_one(keys, num_buckets):
    buckets = bucket_of_keys(keys, num_buckets)
    assert buckets == [bucket_of(k, num_buckets) for k in keys]
    assert all(0 <= b < num_buckets for b in buckets)


def test_bucket_count_must_be_positive():
    with pytest.raises(ValueError):
        bucket_of(b"x", 0)
    with pytest.raises(ValueError):
        bucket_of_keys([b"x"], 0)


# ---- Arrow IPC ----------------------------------------------------------------

def test_ipc_round_trip():
    batch = RowCodec(ALL_TYPES).to_batch([{"k": 1, "s": "é", "d": math.nan, "t": 3}, {"k": 2, "y": b"\x00"}])
    data = batch_to_ipc(batch)
    assert isinstance(data, bytes)
    same(ipc_to_batch(data), batch)
    empty = RowCodec(ALL_TYPES).to_batch([])
    assert ipc_to_batch(batch_to_ipc(empty)).schema == empty.schema
    with pytest.raises(InvalidRowError, match="not an Arrow IPC stream"):
        ipc_to_batch(b"garbage")


def test_ipc_stream_of_several_batches_is_one_batch():
    batch = RowCodec(KV).to_batch([{"id": 1}, {"id": 2}])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch.slice(1))
    assert ipc_to_batch(sink.getvalue()).column("id").to_pylist() == [1, 2, 2]
    with pa.ipc.new_stream(sink := pa.BufferOutputStream(), batch.schema):
        pass
    assert ipc_to_batch(sink.getvalue()).num_rows == 0


