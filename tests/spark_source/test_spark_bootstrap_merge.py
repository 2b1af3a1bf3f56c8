"""A hybrid split's merge of a snapshot's value chunks with a changelog range's final states, without Spark:
the rows come out in key order, each key once, with its latest state, whatever the chunks' boundaries."""

from __future__ import annotations

import random

import pytest

from kvlease.common.codec import RowCodec
from kvlease.common.tables import Column, TableInfo
from kvlease.spark_source.bootstrap import merge

pytestmark = pytest.mark.unit

BY_ID = TableInfo(1, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
# a two-column key with a string first: escaped bytes and a terminator decide the order
BY_NAME = TableInfo(2, "db", "u", (Column("name", "STRING"), Column("n", "INT"), Column("v", "DOUBLE")),
                    ("name", "n"), 1)


def encoded(codec: RowCodec, rows: list[dict]) -> tuple[list[bytes], list[bytes]]:
    if not rows:
        return [], []
    keys, values = codec.encode(codec.to_batch(rows))
    return keys, values


def snapshot_chunks(codec: RowCodec, rows: list[dict], chunk: int) -> list[list[bytes]]:
    """The rows' values in key order, cut into chunks of ``chunk`` (what a snapshot's values iterator gives)."""
    keys, values = encoded(codec, rows)
    ordered = [v for _, v in sorted(zip(keys, values))]
    return [ordered[i:i + chunk] for i in range(0, len(ordered), chunk)]


def merged(codec: RowCodec, chunks: list[list[bytes]], changes: dict[bytes, bytes | None]) -> list[dict]:
    out = list(merge(iter(chunks), changes, codec))
    assert all(b.schema.equals(codec.schema) for b in out)
    return [row for batch in out for row in batch.to_pylist()]


def expected(codec: RowCodec, snapshot: list[dict], changes: dict[bytes, bytes | None]) -> list[dict]:
    keys, values = encoded(codec, snapshot)
    state = dict(zip(keys, values))
    state.update(changes)
    live = sorted((k, v) for k, v in state.items() if v is not None)
    return codec.decode_values([v for _, v in live]).to_pylist() if live else []


def changes_of(codec: RowCodec, upserts: list[dict], deletes: list[dict]) -> dict[bytes, bytes | None]:
    keys, values = encoded(codec, upserts)
    out: dict[bytes, bytes | None] = dict(zip(keys, values))
    out.update(dict.fromkeys(codec.encode_keys(codec.to_batch(deletes)) if deletes else [], None))
    return out


@pytest.mark.parametrize("chunk", [1, 3, 4, 1000])
def test_updates_deletes_and_inserts_before_inside_between_and_after_the_chunks(chunk):
    codec = RowCodec(BY_ID)
    snapshot = [{"id": i, "v": f"s{i}"} for i in range(0, 40, 4)]  # 0, 4, ..., 36
    changes = changes_of(codec, upserts=[{"id": -5, "v": "first"}, {"id": 4, "v": "new4"}, {"id": 5, "v": "ins5"},
                                         {"id": 12, "v": "new12"}, {"id": 99, "v": "last"}],
                         deletes=[{"id": 8}, {"id": 36}, {"id": 37}])  # 37: never existed
    rows = merged(codec, snapshot_chunks(codec, snapshot, chunk), changes)
    assert rows == expected(codec, snapshot, changes)
    assert [r["id"] for r in rows] == [-5, 0, 4, 5, 12, 16, 20, 24, 28, 32, 99]
    assert {r["id"]: r["v"] for r in rows}[12] == "new12"


def test_no_changes_pass_the_chunks_through_and_no_snapshot_gives_the_changes_alone():
    codec = RowCodec(BY_ID)
    snapshot = [{"id": i, "v": str(i)} for i in range(10)]
    assert merged(codec, snapshot_chunks(codec, snapshot, 4), {}) == snapshot
    changes = changes_of(codec, upserts=[{"id": 3, "v": "x"}, {"id": 1, "v": "y"}], deletes=[{"id": 2}])
    assert merged(codec, [], changes) == [{"id": 1, "v": "y"}, {"id": 3, "v": "x"}]


@pytest.mark.parametrize("seed", range(5))
def test_random_changes_over_string_keys_match_the_folded_state(seed):
    rng = random.Random(seed)
    codec = RowCodec(BY_NAME)
    names = ["", "a", "a\x00", "a\x00b", "ab", "b", "\x00", "zz"]

    def row(name, n):
        return {"name": name, "n": n, "v": rng.choice([None, rng.uniform(-1, 1)])}

    snapshot = [row(name, n) for name in names for n in range(-2, 3) if rng.random() < 0.6]
    upserts = [row(rng.choice(names), rng.randint(-3, 3)) for _ in range(rng.randint(0, 20))]
    upserts = list({(r["name"], r["n"]): r for r in upserts}.values())
    deletes = [{"name": rng.choice(names), "n": rng.randint(-3, 3)} for _ in range(rng.randint(0, 10))]
    deletes = [d for d in {(d["name"], d["n"]): d for d in deletes}.values()
               if (d["name"], d["n"]) not in {(r["name"], r["n"]) for r in upserts}]
    changes = changes_of(codec, upserts, deletes)
    rows = merged(codec, snapshot_chunks(codec, snapshot, rng.randint(1, 7)), changes)
    assert rows == expected(codec, snapshot, changes)
    keys = codec.encode_keys(codec.to_batch(rows)) if rows else []
    assert keys == sorted(set(keys))  # key order, each key once
