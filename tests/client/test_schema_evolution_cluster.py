"""Rows written before and after schema changes, read through every path on a real replicated cluster (three
tablet servers in this process, real ZooKeeper, RocksDB and gRPC): lookups, live scans, the changelog, a
snapshot taken before the changes, and a follower that leads after its leader dies, all read as the current
schema (the added column null, the renamed one under its new name, the widened one converted, the dropped
one gone); a client opened before the changes keeps its schema; writes with the old and the new columns."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from kvlease.client.snapshot_read import read_snapshot
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.codec import value_schema_ids
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_rebuild import RETENTION, rows_of, snapshot_and_retain
from tests.tablet.replication.test_replicated_buckets import crash, server_by_id, three_servers, wait_in_sync

pytestmark = pytest.mark.zk

COLUMNS = [Column("k", "BIGINT"), Column("n", "INT"), Column("s", "STRING"), Column("p", "DECIMAL(10,2)")]


def old_row(i: int) -> dict:
    return {"k": i, "n": i * 10, "s": f"s{i}", "p": Decimal(f"{i}.25")}


def new_row(i: int) -> dict:
    return {"k": i, "n": i * 100, "label": f"l{i}", "c": f"c{i}"}


def as_current(row: dict) -> dict:
    """An old row as the current schema (k, n BIGINT, label, c) reads it."""
    return {"k": row["k"], "n": row["n"], "label": row["s"], "c": None}


def by_k(rows) -> dict:
    return {r["k"]: r for r in rows}


def test_rows_of_every_schema_read_as_the_current_one_through_every_path(make_config, tmp_path):
    with three_servers(make_config, tmp_path, RETENTION) as c:
        table = c.admin.create_table("db.evolving", COLUMNS, ["k"], 1, replication_factor=3, min_insync_replicas=2)
        leader_id = wait_in_sync(c, table.table_id).leader_id
        opened_before = TableClient(c.admin, "db.evolving", retry_total_s=30)
        with opened_before:
            opened_before.upsert([old_row(i) for i in range(10)])
            handle = snapshot_and_retain(server_by_id(c, leader_id), table.table_id)  # schema 1 rows only
            c.admin.alter_table("db.evolving", add_column="c STRING")
            c.admin.alter_table("db.evolving", rename_column=("s", "label"))
            c.admin.alter_table("db.evolving", widen_column="n BIGINT")
            current = c.admin.alter_table("db.evolving", drop_column="p")
            assert [col.name for col in current.columns] == ["k", "n", "label", "c"] and current.schema_id == 5
            for server in c.tablets:  # every replica writes and reads with the new schema
                replica = server.replicas.replica(table.table_id, 0)
                wait_until(lambda: replica.store.codec.schema_id == 5, 15, "the new schema on every replica")

            with TableClient(c.admin, "db.evolving", retry_total_s=30) as client:
                client.upsert([new_row(i) for i in range(10, 15)])
                client.upsert([{"k": 3, "c": "updated"}])  # an old row rewritten with the new schema
                expected = {**{i: as_current(old_row(i)) for i in range(10)},
                            **{i: new_row(i) for i in range(10, 15)}}
                expected[3] = {"k": 3, "n": None, "label": None, "c": "updated"}
                assert by_k(client.lookup(list(range(15)))) == expected
                for streaming in (False, True):
                    assert by_k(pa.Table.from_batches(client.scan(streaming=streaming).batches).to_pylist()) == \
                        expected
                records, _ = client.fetch_log(0, 0)
                assert [r["row"] for r in records][:10] == [as_current(old_row(i)) for i in range(10)]
                assert [r["row"] for r in records if r["change_type"] == "+U"] == [expected[3]]
                assert by_k(read_snapshot(c.admin, handle).to_pylist()) == {
                    i: as_current(old_row(i)) for i in range(10)}

            # the client opened before the changes reads every row as schema 1, by field id
            seen = by_k(pa.Table.from_batches(opened_before.scan().batches).to_pylist())
            assert seen[2] == old_row(2)  # what schema 1 stored, with its dropped column
            assert seen[3] == {"k": 3, "n": None, "s": None, "p": None}
            assert seen[12] == {"k": 12, "n": 1200, "s": "l12", "p": None}  # the renamed column under its old name
            # writes with the old schema: mapped by field id (s is label now, p is gone, an INT fits BIGINT)
            opened_before.upsert([{"k": 20, "n": 7, "s": "old name", "p": Decimal("1.00")}])
            with pytest.raises(errors.InvalidRowError, match="'label': unknown column"):
                opened_before.upsert([{"k": 21, "label": "a name its schema does not have"}])
            with TableClient(c.admin, "db.evolving", retry_total_s=30) as client:
                client.upsert([{"k": 30, "n": 2**40}])  # past INT: the old reader cannot hold it
            with pytest.raises(errors.InvalidRowError, match="column 'n'.*does not fit this reader's type INT"):
                pa.Table.from_batches(opened_before.scan().batches)

        stored = rows_of(server_by_id(c, leader_id).replicas.replica(table.table_id, 0).store)
        assert set(value_schema_ids(list(stored.values())).tolist()) == {1, 5}
        crash(c, server_by_id(c, leader_id))  # a follower leads: it reads its copies the same way
        with TableClient(c.admin, "db.evolving", retry_total_s=30) as client:
            rows = wait_until(lambda: client.lookup([2, 12, 20]), 30, "a new leader")
        assert rows == [as_current(old_row(2)), new_row(12), {"k": 20, "n": 7, "label": "old name", "c": None}]
