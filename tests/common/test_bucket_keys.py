"""Bucket keys (common/bucket_keys.py, common/prefix_codec.py): the bucketing rule, the prefix ranges a prefix
lookup scans for every key type, and the one-line errors of a bad bucket key."""

from __future__ import annotations

import bisect
import datetime as dt
import math
import zlib
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlease.common.bucket_keys import KeyPrefix, check_bucket_key, prefix_upper
from kvlease.common.codec import RowCodec
from kvlease.common.errors import InvalidRequestError, InvalidTableError
from kvlease.common.prefix_codec import PrefixCodec
from kvlease.common.tables import Column, TableInfo, TableSpec, validate_spec

pytestmark = pytest.mark.unit

#: per key type, values with the edges of its encoding: signs, 0x00 and 0xFF bytes, strings that are prefixes
#: of one another or hold 0x00, the largest value (all 0xFF bytes: a range with no upper end)
POOLS = {
    "BOOLEAN": [False, True],
    "TINYINT": [-128, -1, 0, 1, 127],
    "SMALLINT": [-32768, -1, 0, 255, 256, 32767],
    "INT": [-2**31, -1, 0, 1, 2**31 - 1],
    "BIGINT": [-2**63, -1, 0, 1, 255, 2**63 - 1],
    "FLOAT": [-math.inf, -1.5, -0.0, 0.0, 1.5, math.inf, math.nan],
    "DOUBLE": [-math.inf, -1e300, -0.0, 0.0, 5e-324, math.inf, math.nan],
    "DECIMAL(12,2)": [Decimal("-9999999999.99"), Decimal("-0.01"), Decimal("0.00"), Decimal("0.01"),
                      Decimal("9999999999.99")],
    "DECIMAL(30,3)": [Decimal("-1.000"), Decimal("0.000"), Decimal("123456789012345678901234567.890")],
    "STRING": ["", "a", "ab", "abc", "a\x00", "a\x00b", "\x00", "\x00\x01", "b", "é", "\uffff"],
    "BYTES": [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"\x00\xff", b"\x01", b"a", b"a\x00", b"\xff", b"\xff\xff"],
    "DATE": [dt.date(1, 1, 1), dt.date(1969, 12, 31), dt.date(1970, 1, 1), dt.date(9999, 12, 31)],
    "TIME": [dt.time(0, 0), dt.time(12, 30, 1, 5), dt.time(23, 59, 59, 999999)],
    "TIMESTAMP": [dt.datetime(1, 1, 1), dt.datetime(1970, 1, 1),  # naive: UTC, as read back
                  dt.datetime(2026, 11, 30, 10, 0, 0, 1)],
    "TIMESTAMP_NTZ": [dt.datetime(1969, 12, 31, 23, 59, 59), dt.datetime(2026, 11, 30)],
}
SECOND = {"BIGINT": [-1, 0, 7], "STRING": ["", "\x00", "x", "xy"]}


def table(first: str, second: str, buckets: int = 8, bucket_key=("k1",)) -> TableInfo:
    columns = (Column("k1", first), Column("k2", second), Column("k3", "INT"), Column("v", "STRING"))
    return TableInfo(1, "db", "t", columns, ("k1", "k2", "k3"), buckets, bucket_key=tuple(bucket_key))


def same(a, b) -> bool:
    """Whether two values of a key column are the same key value (-0.0 is not 0.0, NaN is NaN)."""
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (math.isnan(a) and math.isnan(b)))
    return a == b


def check_ranges(info: TableInfo, rows: list[dict], targets: list) -> None:
    """For every target prefix value: the keys in ``[P, prefix_upper(P))`` of the sorted encoded keys are
    exactly the rows whose bucket-key value is the target, each starts with P, and all are in P's bucket."""
    codec = RowCodec(info)
    prefixes = PrefixCodec(codec)
    keys = sorted(codec.encode_keys(codec.to_batch(rows)))
    decoded = codec.decode_keys(keys).to_pylist()
    encoded = prefixes.encode(prefixes.to_batch([(t,) for t in targets]))
    for target, prefix, bucket in zip(targets, encoded, prefixes.buckets(encoded).tolist()):
        upper = prefix_upper(prefix)
        lo = bisect.bisect_left(keys, prefix)
        hi = len(keys) if upper is None else bisect.bisect_left(keys, upper)
        in_range = decoded[lo:hi]
        assert in_range == [d for d in decoded if same(d["k1"], target)], (target, prefix)
        assert all(key.startswith(prefix) for key in keys[lo:hi])
        assert set(codec.buckets(keys[lo:hi]).tolist()) <= {bucket}


@pytest.mark.parametrize("first", sorted(POOLS))
@pytest.mark.parametrize("second", sorted(SECOND))
def test_a_prefix_range_holds_exactly_the_keys_of_its_values_for_every_key_type(first, second):
    info = table(first, second)
    pool = POOLS[first]
    rows = [{"k1": a, "k2": b, "k3": c} for a in pool for b in SECOND[second] for c in (-1, 0, 1)]
    check_ranges(info, rows, pool)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=6), min_size=1, max_size=12), st.lists(st.text(max_size=4), min_size=1,
                                                                         max_size=6))
def test_byte_and_text_prefixes_of_one_another_never_leak_into_a_range(blobs, texts):
    rows = [{"k1": b, "k2": t, "k3": 0} for b in blobs for t in texts]
    check_ranges(table("BYTES", "STRING"), rows, blobs + [b"\x00", b"\xff"])


def test_rows_of_one_bucket_key_share_a_bucket_and_a_table_without_one_hashes_its_whole_key():
    keyed, plain = table("STRING", "BIGINT", 16), table("STRING", "BIGINT", 16, bucket_key=())
    rows = [{"k1": u, "k2": s, "k3": 0} for u in ("a", "ab", "b\x00") for s in range(50)]
    codec = RowCodec(keyed)
    keys = codec.encode_keys(codec.to_batch(rows))
    buckets = codec.buckets(keys).tolist()
    for user in ("a", "ab", "b\x00"):
        mine = {b for b, r in zip(buckets, rows) if r["k1"] == user}
        prefix = user.encode().replace(b"\x00", b"\x00\xff") + b"\x00\x01"
        assert mine == {zlib.crc32(prefix) % 16}
    plain_keys = RowCodec(plain).encode_keys(RowCodec(plain).to_batch(rows))
    assert plain_keys == keys  # the same key bytes; only the bucket rule differs
    assert RowCodec(plain).buckets(plain_keys).tolist() == [zlib.crc32(k) % 16 for k in keys]
    assert len(set(RowCodec(plain).buckets(plain_keys).tolist())) > 3
    # stable forever: the bucket of a known key of a table without a bucket key
    assert RowCodec(plain).buckets([b"a\x00\x01" + bytes(12)]).tolist() == [zlib.crc32(b"a\x00\x01" + bytes(12)) % 16]


def test_a_fixed_width_and_a_two_column_bucket_key_cut_the_right_bytes():
    assert KeyPrefix([8, 4], 1).cut([b"12345678abcd"]) == [b"12345678"]
    assert KeyPrefix([None, 8, None], 2).cut([b"a\x00\xff\x00\x0112345678z\x00\x01"]) == [b"a\x00\xff\x00\x0112345678"]
    info = table("BIGINT", "STRING", bucket_key=("k1", "k2"))
    codec = RowCodec(info)
    rows = [{"k1": a, "k2": b, "k3": c} for a in (1, 2) for b in ("", "x", "x\x00") for c in range(3)]
    keys = codec.encode_keys(codec.to_batch(rows))
    prefixes = PrefixCodec(codec)
    encoded = prefixes.encode(prefixes.to_batch([(r["k1"], r["k2"]) for r in rows]))
    assert codec.bucket_keys(keys) == encoded and all(k.startswith(p) for k, p in zip(keys, encoded))


def test_prefix_upper_is_the_least_string_above_the_prefix_range():
    assert prefix_upper(b"a\x00\x01") == b"a\x00\x02"
    assert prefix_upper(b"a\xff\xff") == b"b"
    assert prefix_upper(b"\xff\xff") is None
    assert prefix_upper(b"") is None


@pytest.mark.parametrize("bucket_key, partition_key, message", [
    (["b"], (), "bucket key (b) is not a prefix of the primary key (a, b, c): it must be its first columns"),
    (["x"], (), "bucket key column 'x' is not a column of the primary key (a, b, c)"),
    (["v"], (), "bucket key column 'v' is not a column of the primary key (a, b, c)"),
    (["a", "a"], (), "bucket key (a, a) names a column twice"),
    (["a", "b", "c"], (), "bucket key (a, b, c) is the whole primary key, which is the default"),
    ("a", (), "bucket key 'a' must be a list of column names, not a string"),
    (["a"], ("b",), "bucket key (a) leaves out partition column 'b'"),
])
def test_a_bad_bucket_key_is_a_one_line_error_naming_it(bucket_key, partition_key, message):
    spec = TableSpec("db", "t", (Column("a", "STRING"), Column("b", "STRING"), Column("c", "INT"),
                                 Column("v", "INT")), ("a", "b", "c"), 2, partition_key=partition_key,
                     bucket_key=bucket_key)
    with pytest.raises(InvalidTableError) as refused:
        validate_spec(spec)
    assert refused.value.message.startswith(message) and "\n" not in refused.value.message


def test_a_good_bucket_key_is_kept_and_travels_through_json_and_the_wire():
    from kvlease.common.wire import table_from_pb, table_spec_from_pb, table_spec_to_pb, table_to_pb

    spec = validate_spec(TableSpec("db", "t", (Column("a", "STRING"), Column("b", "INT")), ("a", "b"), 2,
                                   bucket_key=["a"]))
    assert spec.bucket_key == ("a",) and table_spec_from_pb(table_spec_to_pb(spec)).bucket_key == ("a",)
    info = table("STRING", "BIGINT")
    assert TableInfo.from_json(info.to_json()) == info and table_from_pb(table_to_pb(info)) == info
    plain = table("STRING", "BIGINT", bucket_key=())
    assert "bucket_key" not in plain.to_json() and table_from_pb(table_to_pb(plain)).bucket_key == ()
    with pytest.raises(InvalidRequestError, match="has no bucket key"):
        PrefixCodec(RowCodec(plain))
    check_bucket_key(("a", "b"), ("a",), ("a",))  # a partition column in the bucket key: fine
