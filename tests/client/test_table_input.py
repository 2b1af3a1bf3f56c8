"""The table client's one pass over its input (client/table_input.py): what it sends equals the steps taken one
by one, keys of one form take no Python step per key yet fail as the key-by-key route does, and the codec
checks the input once."""

from __future__ import annotations

import collections
import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from kvlease.client.table_input import _key_rows, key_batch, keys_by_bucket, row_batch, rows_by_bucket, split
from kvlease.common.codec import RowCodec
from kvlease.common.errors import InvalidRowError
from kvlease.common.tables import Column, TableInfo

pytestmark = pytest.mark.unit

ONE = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING"), Column("d", "DOUBLE"),
                               Column("at", "TIMESTAMP")), ("id",), 4)
TWO = TableInfo(8, "db", "c", (Column("a", "INT"), Column("b", "STRING"), Column("x", "DOUBLE")), ("a", "b"), 3)
Pair = collections.namedtuple("Pair", "a b")


def same_parts(got, expected) -> None:
    assert [b for b, _, _ in got] == [b for b, _, _ in expected]
    for (_, rows, indices), (_, rows_expected, indices_expected) in zip(got, expected):
        assert rows.equals(rows_expected) and np.array_equal(indices, indices_expected)


def key_by_key(codec: RowCodec, keys: list) -> pa.RecordBatch:
    """The route every key took before the one pass: each key a dict, converted as a row."""
    return codec.to_batch(_key_rows(codec.table.primary_key, keys)).select(list(codec.table.primary_key))


def rows_of_one(n: int) -> list[dict]:
    at = dt.datetime(2026, 1, 1)
    return [{"id": i, "v": f"v{i}", "d": i / 4, "at": at + dt.timedelta(seconds=i)} for i in range(n)]


@pytest.mark.parametrize("form", ["dicts", "batch", "table"])
def test_rows_by_bucket_sends_what_the_steps_one_by_one_send(form):
    codec = RowCodec(ONE)
    rows = rows_of_one(300)
    given = {"dicts": rows, "batch": codec.to_batch(rows),
             "table": pa.Table.from_batches([codec.to_batch(rows[:100]), codec.to_batch(rows[100:])])}[form]
    parts = rows_by_bucket(codec, given)
    same_parts(parts, split(codec, row_batch(codec, given)))
    assert sorted(np.concatenate([i for _, _, i in parts]).tolist()) == list(range(300))


@pytest.mark.parametrize("table, keys", [
    (ONE, list(range(50))),
    (ONE, [np.int64(5), 7, (9,), [11], {"id": 13}]),  # a mix goes key by key
    (ONE, [(i,) for i in range(50)]),
    (TWO, [(i, f"s{i}") for i in range(50)]),
    (TWO, [[i, f"s{i}"] for i in range(50)]),
    (TWO, [Pair(i, f"s{i}") for i in range(50)]),
    (TWO, [(1, "a"), {"a": 2, "b": "b"}]),
    (ONE, []),
    (TWO, []),
])
def test_keys_by_bucket_sends_what_the_key_by_key_route_sends(table, keys):
    codec = RowCodec(table)
    batch = key_batch(codec, keys)
    assert batch.equals(key_by_key(codec, keys)) and batch.schema == codec.key_schema
    same_parts(keys_by_bucket(codec, keys), split(codec, key_by_key(codec, keys)))


@pytest.mark.parametrize("table, keys", [
    (ONE, [1, None, 3]),
    (ONE, [1, "two"]),
    (ONE, [1, 2**63]),
    (ONE, [True]),
    (ONE, [1.5]),
    (ONE, [(1,), (None,)]),
    (TWO, [(1, "a"), (2, None)]),
    (TWO, [(1, "a"), ("b", 2)]),
    (TWO, [(1, "a"), (2**31, "b")]),
    (TWO, [(1, "a"), (2,)]),
    (TWO, [(1, "a"), 2]),
    (TWO, [(1, "a"), {"a": 2}]),
    (TWO, [{"a": 1, "b": "x", "x": "not a double"}]),
])
def test_a_bad_key_fails_as_on_the_key_by_key_route(table, keys):
    codec = RowCodec(table)
    with pytest.raises(InvalidRowError) as expected:
        key_by_key(codec, keys)
    with pytest.raises(InvalidRowError) as got:
        key_batch(codec, keys)
    assert got.value.message == expected.value.message


def test_the_one_pass_checks_the_input_once(monkeypatch):
    """table_input calls the codec twice, to check and convert the input, then to encode its keys, which are
    not checked again (the codec, in common/, cannot call back: tests/project/test_layers.py)."""
    codec = RowCodec(ONE)
    calls = []
    for name in ("to_batch", "keys_to_batch", "validate", "encode_keys", "encode_checked_keys", "_key_batch"):
        method = getattr(codec, name)
        monkeypatch.setattr(codec, name, lambda *a, _m=method, _n=name: calls.append(_n) or _m(*a))
    rows = rows_of_one(20)
    rows_by_bucket(codec, rows)
    assert calls == ["to_batch", "encode_checked_keys"]
    calls.clear()
    rows_by_bucket(codec, pa.Table.from_pylist(rows, schema=codec.schema))
    assert calls == ["validate", "encode_checked_keys"]
    calls.clear()
    keys_by_bucket(codec, list(range(20)))
    assert calls == ["keys_to_batch", "encode_checked_keys"]
