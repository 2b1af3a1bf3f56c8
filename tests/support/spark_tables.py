"""Tables and rows shared by the Spark source's tests: every supported type, deterministic data."""

from __future__ import annotations

import datetime as dt

import pytest

from kvlease.common.tables import Column
from tests.support.local_cluster import LocalCluster

ALL_TYPES = [Column("id", "BIGINT"), Column("name", "STRING"), Column("qty", "INT"), Column("price", "DOUBLE"),
             Column("ok", "BOOLEAN"), Column("raw", "BYTES"), Column("at", "TIMESTAMP")]
EPOCH = dt.datetime(2026, 1, 1)


def row(i: int, version: int = 0) -> dict:
    """Row ``i`` (every column set, some nulls) in its ``version``."""
    return {"id": i, "name": None if i % 7 == 3 else f"n{i}-v{version}", "qty": i * 10 + version,
            "price": i / 4 + version, "ok": None if i % 5 == 4 else bool((i + version) % 2),
            "raw": None if i % 11 == 5 else bytes([i % 256, version % 256]),
            "at": None if i % 13 == 6 else EPOCH + dt.timedelta(seconds=i, microseconds=version)}


def spark_row(r: dict) -> dict:
    """What Spark returns for a row: timestamps come back as UTC-aware or naive datetimes; compare naive."""
    out = dict(r)
    at = out.get("at")
    if at is not None and at.tzinfo is not None:
        out["at"] = at.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if out.get("raw") is not None:
        out["raw"] = bytes(out["raw"])
    return out


def rows_of(df) -> dict:
    """``id -> row`` of a DataFrame's table columns."""
    names = [c.name for c in ALL_TYPES]
    return {r["id"]: spark_row({n: r[n] for n in names}) for r in df.collect()}


def seed(cluster: LocalCluster, buckets: int, rows: int, table: str = "shop.orders") -> None:
    """Create ``table`` (every type) with rows ``0..rows-1`` and snapshot it."""
    from kvlease.client.table import TableClient

    cluster.create_table(table, ALL_TYPES, ["id"], buckets)
    with TableClient(cluster.admin, table) as client:
        client.upsert([row(i) for i in range(rows)])
        client.trigger_snapshot()


@pytest.fixture
def kv(make_config, tmp_path):
    """An in-process cluster (coordinator + 2 tablet servers) on this test's ZooKeeper chroot."""
    cluster = LocalCluster(make_config, tmp_path, 2)
    try:
        yield cluster
    finally:
        cluster.close()
