"""An alter of a table's schema reaches the tablet servers holding its buckets (docs/schemas.md, "Schema
evolution"): a coordinator and two tablet servers in this process, a real ZooKeeper, RocksDB and gRPC on
loopback. Every replica (leader and follower, a partition's too) holds the new view of its table, without
its bucket being reopened or its leadership changing, and a later push of an older view does not undo it."""

from __future__ import annotations

import pytest

from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_replicated_buckets import FAST, SCHEMA
from tests.tablet.test_tablet_server import Cluster

pytestmark = pytest.mark.zk


@pytest.fixture
def cluster(make_config, tmp_path):
    c = Cluster(make_config, FAST)
    try:
        for server_id in (1, 2):
            c.tablet(server_id, tmp_path / f"t{server_id}")
        wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "two tablet servers")
        yield c
    finally:
        c.close()


def held_schema(c, physical_id: int) -> list[int | None]:
    """The schema id of the view each tablet server holds of ``physical_id`` (None: it holds none)."""
    return [getattr(server.replicas.table(physical_id), "schema_id", None) for server in c.tablets]


def test_every_replica_holds_the_altered_schema_and_keeps_serving(cluster):
    c = cluster
    table = c.admin.create_table("db.t", SCHEMA, ["id"], 2, replication_factor=2)
    wait_until(lambda: held_schema(c, table.table_id) == [1, 1], 20, "both tablet servers to hold the table")
    with TableClient(c.admin, "db.t") as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(10)])
        leaders = {b: a.leader_id for b, a in c.leaders(table.table_id).items()}
        stores = {(s.server_id, key): r.store for s in c.tablets for key, r in s.replicas._replicas.items()}
        altered = c.admin.alter_table("db.t", add_column="c BIGINT COMMENT 'later'")
        wait_until(lambda: held_schema(c, table.table_id) == [2, 2], 15, "both tablet servers to hold schema 2")
        view = c.tablets[0].replicas.table(table.table_id)
        assert view.columns == altered.columns and view.column("c") == Column("c", "BIGINT", 2, "later")
        # the same stores (not reopened), the same leaders, and what was written reads back
        assert {(s.server_id, key): r.store for s in c.tablets for key, r in s.replicas._replicas.items()} == stores
        assert {b: a.leader_id for b, a in c.leaders(table.table_id).items()} == leaders
        assert [row["v"] for row in client.lookup([{"id": i} for i in range(10)])] == [f"v{i}" for i in range(10)]


def test_a_partitioned_tables_partitions_take_the_altered_schema(cluster):
    c = cluster
    c.admin.create_table("db.p", [Column("day", "STRING"), Column("id", "BIGINT")], ["day", "id"], 1,
                         partition_key=["day"])
    _table, partition = c.admin.create_partition("db.p", "20261130")
    wait_until(lambda: 1 in held_schema(c, partition.partition_id), 15, "the partition's bucket held")
    c.admin.alter_table("db.p", add_column="v STRING")
    holders = wait_until(lambda: [s for s in held_schema(c, partition.partition_id) if s is not None] == [2], 15,
                         "the partition's replica to hold schema 2")
    assert holders


def test_an_older_view_pushed_late_does_not_replace_the_newer_one(cluster):
    c = cluster
    old = c.admin.create_table("db.t", SCHEMA, ["id"], 1)
    server = wait_until(lambda: next((s for s in c.tablets if s.replicas.table(old.table_id)), None), 15, "held")
    c.admin.alter_table("db.t", comment="new")
    wait_until(lambda: server.replicas.table(old.table_id).schema_id == 2, 15, "schema 2")
    (replica,) = [r for key, r in server.replicas._replicas.items() if key[0] == old.table_id]
    replica.take_table(old)  # a push of schema 1 overtaken by the one of schema 2
    assert replica.table.schema_id == 2 and replica.table.comment == "new"
