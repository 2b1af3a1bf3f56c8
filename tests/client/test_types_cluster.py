"""Every column type through the table client on a real replicated cluster (three tablet servers in this
process, real ZooKeeper, RocksDB and gRPC): upserts, lookups, live scans (batch and streaming) in key order,
the changelog with its before images, a snapshot read, the followers' copies, and a follower rebuilt from a
snapshot after losing its data."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from kvlease.client.snapshot_read import read_snapshot
from kvlease.client.table import TableClient
from kvlease.common.codec import RowCodec, value_schema_ids
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_rebuild import (RETENTION, come_back_wiped, lose_follower, rows_of,
                                                   snapshot_and_retain)
from tests.tablet.replication.test_replicated_buckets import server_by_id, three_servers, wait_in_sync

pytestmark = pytest.mark.zk

#: A key of three new types (order-preserving across all three), and a value column of every other type.
COLUMNS = [Column("day", "DATE"), Column("amount", "DECIMAL(12,2)"), Column("seq", "SMALLINT"),
           Column("t8", "TINYINT"), Column("f", "FLOAT"), Column("big", "DECIMAL(38,10)"), Column("tod", "TIME"),
           Column("at", "TIMESTAMP"), Column("local", "TIMESTAMP_NTZ"), Column("tags", "ARRAY<STRING>"),
           Column("attrs", "MAP<STRING,BIGINT>"), Column("line", "STRUCT<sku STRING,qty INT,when DATE>"),
           Column("raw", "BYTES"), Column("d", "DOUBLE")]
KEY = ["day", "amount", "seq"]
BASE = dt.datetime(2026, 3, 1, 12, 0, 0)


def key(i: int) -> dict:
    """Keys of mixed signs and dates on both sides of 1970; a few share a day or a day and an amount."""
    return {"day": dt.date(1969, 12, 25) + dt.timedelta(days=(i * 7) % 13), "amount": Decimal(i * 37 % 41 - 20) / 4,
            "seq": (i % 5) - 2}


def typed_row(i: int, version: int = 0) -> dict:
    return {**key(i), "t8": (i % 200) - 100, "f": i / 8, "big": Decimal(f"-{i}1234567890123.0123456789"),
            "tod": dt.time(i % 24, 30, 15, 123456 + version), "at": BASE + dt.timedelta(microseconds=i * 7 + version),
            "local": BASE - dt.timedelta(days=i, microseconds=1),
            "tags": None if i % 5 == 0 else [f"t{i}-{version}", None][: 1 + i % 2],
            "attrs": {"n": i, "v": version} if i % 4 else None,
            "line": {"sku": f"s{i}", "qty": None if i % 3 else i, "when": dt.date(2000, 1, 1)},
            "raw": bytes([i % 256, 0, version]), "d": -i / 3}


def plain(row: dict | None) -> dict | None:
    """A row read back, comparable with :func:`typed_row`: a MAP comes back as a list of pairs."""
    if row is None or row["attrs"] is None:
        return row
    return {**row, "attrs": dict(row["attrs"])}


def by_key(rows) -> dict:
    return {key_tuple(r): plain(r) for r in rows}


def key_tuple(row: dict) -> tuple:
    return tuple(row[k] for k in KEY)


def test_every_type_through_the_client_a_scan_the_changelog_a_snapshot_and_the_replicas(make_config, tmp_path):
    with three_servers(make_config, tmp_path, RETENTION) as c:
        table = c.admin.create_table("db.typed", COLUMNS, KEY, 1, replication_factor=3, min_insync_replicas=2)
        wait_in_sync(c, table.table_id)
        keys = {key_tuple(typed_row(i)): i for i in range(120)}  # the last row of a key wins
        with TableClient(c.admin, "db.typed", retry_total_s=30) as client:
            client.upsert([typed_row(i) for i in range(120)])
            expected = {k: typed_row(i) for k, i in keys.items()}
            assert [plain(r) for r in client.lookup([key(i) for i in keys.values()])] == list(expected.values())

            for streaming in (False, True):  # a live scan: every row, in key order
                scanned = pa.Table.from_batches(client.scan(streaming=streaming).batches).to_pylist()
                assert [key_tuple(r) for r in scanned] == sorted(expected)
                assert by_key(scanned) == expected

            first = next(iter(keys.values()))
            client.upsert([typed_row(first, 1)])  # an update: its before and after images in the changelog
            records, _ = client.fetch_log(0, 0)
            assert [r["change_type"] for r in records[-2:]] == ["-U", "+U"]
            assert plain(records[-2]["row"]) == typed_row(first) and plain(records[-1]["row"]) == typed_row(first, 1)
            expected[key_tuple(typed_row(first))] = typed_row(first, 1)

            server_id, leader = lose_follower(c, table.table_id)
            handle = snapshot_and_retain(leader, table.table_id)
            snapshot = read_snapshot(c.admin, handle, table=table).to_pylist()
            assert by_key(snapshot) == expected
            later = [typed_row(i, 2) for i in range(200, 210)]
            client.upsert(later)  # the tail after the snapshot
            client.delete([key(1)])
            expected.update({key_tuple(r): r for r in later})
            expected.pop(key_tuple(typed_row(1)), None)
            leader_store = leader.replicas.replica(table.table_id, 0).store
            back, store = come_back_wiped(c, tmp_path, server_id, table.table_id)
            wait_until(lambda: store.high_watermark >= leader_store.high_watermark, 20, "the rebuilt follower")
            assert back.fetchers.rebuilder.rebuilt == 1
            for server in c.tablets:  # every replica holds the same bytes, and they decode to the rows
                replica = server.replicas.replica(table.table_id, 0).store
                wait_until(lambda: replica.high_watermark >= leader_store.high_watermark, 20, "a follower")
                stored = rows_of(replica)
                assert stored == rows_of(leader_store)
                values = list(stored.values())
                assert set(value_schema_ids(values).tolist()) == {1}
                decoded = RowCodec(table).decode_values(values).to_pylist()
                assert by_key(decoded) == expected
            assert server_by_id(c, server_id) is back
