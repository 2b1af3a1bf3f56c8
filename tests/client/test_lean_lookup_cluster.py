"""Lean lookups (client/lean_lookup.py: a few keys encoded and their rows decoded without Arrow) answer exactly
what the vectorized packed path and the plain path answer, against a real coordinator and tablet servers on
ZooKeeper over gRPC: every column type (the wide schema, its ARRAY columns decoded the vectorized way), absent,
deleted and repeated keys, rows of an older schema id, a client opened before a schema change, rows a row TTL
expired, merge-engine tables and a partitioned table (which go the vectorized way)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvlease.client import lean_lookup
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.merge_engine import parse_engine
from kvlease.common.row_ttl import row_ttl
from kvlease.common.tables import Column, parse_schema
from kvlease.ops.bench.wide_schema import WIDE_COLUMNS, wide_batch
from kvlease.ops.wait import wait_until
from tests.common.test_codec_lean import same
from tests.support.local_cluster import LocalCluster

FLAT_WIDE = [c for c in WIDE_COLUMNS if not c.type.startswith("ARRAY")]


@pytest.fixture
def cluster(make_config, tmp_path):
    c = LocalCluster(make_config, tmp_path, 1)
    try:
        yield c
    finally:
        c.close()


def led(c, path: str) -> None:
    table_id = c.admin.get_table(path).table_id
    wait_until(lambda: all(b.leader_address for b in c.admin.get_table_assignment(table_id)[1].values()), 30,
               f"{path} led")


def plain_rows(plain: TableClient, keys: list) -> list[dict | None]:
    """What ``lookup`` answered before the lean path: the vectorized path's batch as dicts."""
    batch = plain.lookup_batch(keys)
    found = batch.column(plain.table.primary_key[0]).is_valid().to_pylist()
    return [row if hit else None for row, hit in zip(batch.to_pylist(), found)]


def check(fast: TableClient, plain: TableClient, keys: list, lean: bool = True) -> list[dict | None]:
    """``fast.lookup(keys)`` equals the plain and vectorized answers (types and reprs too); ``lean``: it went
    the lean way (else the vectorized way)."""
    want = plain_rows(plain, keys)
    assert same_rows(plain_rows(fast, keys), want)
    got = lean_lookup.lookup(fast, keys)
    assert (got is not None) == lean, keys
    assert same_rows(fast.lookup(keys), want)
    if lean:
        assert same_rows(got, want)
    return want


def same_rows(a: list, b: list) -> bool:
    return len(a) == len(b) and all((x is None and y is None) or (x is not None and y is not None and same(x, y))
                                    for x, y in zip(a, b))


def test_every_type_absent_deleted_and_older_schema_rows(cluster):
    rng = np.random.default_rng(51)
    for path, columns in (("db.wide", WIDE_COLUMNS), ("db.flat", FLAT_WIDE)):
        cluster.admin.create_table(path, columns, ["id"], 3)
        led(cluster, path)
        with TableClient(cluster.admin, path) as fast, TableClient(cluster.admin, path, packed_lookups=False) as plain:
            fast.upsert(wide_batch(np.arange(300, dtype=np.int64), salt=2).select([c.name for c in columns]))
            fast.delete(list(range(0, 300, 7)))
            for _ in range(60):
                check(fast, plain, [int(rng.integers(-5, 320))])
            by_bucket = {}
            for key in range(-5, 320):
                by_bucket.setdefault(int(fast.codec.buckets(lean_lookup._lean(fast.codec)[0].encode([key]))[0]),
                                     []).append(key)
            some = by_bucket[0][:8]
            some[1] = some[0]  # a repeated key
            assert any(row is None for row in check(fast, plain, some))  # several keys of one bucket, absent ones
            check(fast, plain, [by_bucket[0][0], by_bucket[1][0]], lean=False)  # two buckets
            check(fast, plain, list(range(9)), lean=False)  # more than LEAN_KEYS
            check(fast, plain, [np.int64(3)], lean=False)  # a key of another Python type
            check(fast, plain, [(by_bucket[0][2],), [by_bucket[0][3]]])  # keys as tuples and lists
            with pytest.raises(errors.InvalidRowError):
                fast.lookup([True])
    cluster.admin.alter_table("db.flat", add_column="extra STRING")
    with TableClient(cluster.admin, "db.flat") as fast, TableClient(cluster.admin, "db.flat",
                                                                     packed_lookups=False) as plain:
        fast.upsert([{"id": 1, "extra": "x"}])
        check(fast, plain, [2])  # a row of the older schema id: decoded the vectorized way
        assert check(fast, plain, [1])[0]["extra"] == "x"
    with TableClient(cluster.admin, "db.wide") as before:
        cluster.admin.alter_table("db.wide", add_column="extra STRING")
        wait_until(lambda: lean_lookup.lookup(before, [1]) is None, 30, "the leader reading the new schema")
        with TableClient(cluster.admin, "db.wide", packed_lookups=False) as plain:
            assert same_rows(before.lookup([1, 2]), plain_rows(before, [1, 2]))


def test_ttl_merge_engine_and_partitioned_tables(cluster):
    now_ms = int(time.time() * 1000)
    cluster.admin.create_table("db.ttl", parse_schema("id BIGINT, name STRING, ts TIMESTAMP, v STRING"),
                               ["id", "name"], 2, row_ttl=row_ttl("1h", "ts"))
    cluster.admin.create_table("db.agg", parse_schema("id INT, total BIGINT, top BIGINT, note STRING"), ["id"], 2,
                               merge_engine=parse_engine("aggregation", aggregates={"total": "sum", "top": "max"}))
    cluster.admin.create_table("db.parts", [Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "STRING")],
                               ["day", "id"], 2, partition_key=["day"])
    for path in ("db.ttl", "db.agg"):
        led(cluster, path)
    with TableClient(cluster.admin, "db.ttl") as fast, TableClient(cluster.admin, "db.ttl",
                                                                   packed_lookups=False) as plain:
        old = now_ms - 2 * 3600_000
        fast.upsert([{"id": i, "name": "a", "ts": (old if i % 2 else now_ms) * 1000, "v": str(i)} for i in range(20)])
        for i in range(22):
            assert (check(fast, plain, [(i, "a")])[0] is not None) == (i < 20 and i % 2 == 0)
    with TableClient(cluster.admin, "db.agg") as fast, TableClient(cluster.admin, "db.agg",
                                                                   packed_lookups=False) as plain:
        for round_ in range(3):
            fast.upsert([{"id": i, "total": i * round_, "top": round_, "note": f"r{round_}"} for i in range(10)])
        for i in range(12):
            check(fast, plain, [i])
    with TableClient(cluster.admin, "db.parts") as fast, TableClient(cluster.admin, "db.parts",
                                                                     packed_lookups=False) as plain:
        fast.upsert([{"day": "d1", "id": i, "v": "a"} for i in range(5)])
        check(fast, plain, [("d1", 1)], lean=False)
        check(fast, plain, [("d1", 9), ("d2", 1)], lean=False)
