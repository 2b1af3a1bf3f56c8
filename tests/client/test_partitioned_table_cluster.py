"""Partitioned tables end to end, in-process on ZooKeeper with real tablet servers over gRPC: rows routed to
their partitions, partitions made on write (and not, when told not to), lookups and deletes by key, a
partition's own buckets, changelog and snapshots, a dropped partition's data gone from every replica, and
a replicated partition whose leader is killed served again (docs/partitions.md)."""

from __future__ import annotations

import os

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster

pytestmark = pytest.mark.zk

COLUMNS = [Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "STRING")]


@pytest.fixture
def cluster(make_config, tmp_path):
    c = LocalCluster(make_config, tmp_path, 2)
    try:
        yield c
    finally:
        c.close()


def orders(cluster, **kwargs):
    return cluster.admin.create_table("db.orders", COLUMNS, ["day", "id"], 2, partition_key=["day"], **kwargs)


def rows(day, ids, v="a"):
    return [{"day": day, "id": i, "v": v} for i in ids]


def test_rows_go_to_their_partitions_which_writes_create(cluster):
    table = orders(cluster)
    with TableClient(cluster.admin, "db.orders") as client:
        written = client.upsert(rows("d1", range(10)) + rows("d2", range(5, 15)))
        assert {part for part, _bucket in written} == {"d1", "d2"}
        names = [p.name for p in cluster.admin.list_partitions("db.orders")[1]]
        assert names == ["d1", "d2"]
        assert client.lookup([("d1", 3), ("d2", 3), ("d2", 14), ("d3", 1)]) == [
            {"day": "d1", "id": 3, "v": "a"}, None, {"day": "d2", "id": 14, "v": "a"}, None]  # d3: no partition
        client.delete([("d1", 3), ("d2", 14)])
        assert client.lookup([("d1", 3), ("d2", 14), ("d1", 4)]) == [None, None, {"day": "d1", "id": 4, "v": "a"}]
        with pytest.raises(errors.InvalidRequestError, match="partitioned"):
            client.fetch_log(0, 0)  # a partitioned table's changelogs are its partitions'
    with TableClient(cluster.admin, "db.orders", partition="d1") as d1:
        assert d1.table.partition_name == "d1" and d1.table.partition_id is not None
        scanned = sorted(r["id"] for r in d1.scan().rows)
        assert scanned == [i for i in range(10) if i != 3]  # d1's rows only
        records = sum(len(d1.fetch_log(b, 0)[0]) for b in range(table.buckets))
        assert records == 11  # 10 inserts and a delete


def test_a_client_told_not_to_create_partitions_writes_nothing_to_a_missing_one(cluster):
    orders(cluster)
    with TableClient(cluster.admin, "db.orders", create_partitions=False) as client:
        with pytest.raises(errors.PartitionNotExistsError) as refused:
            client.upsert(rows("d1", range(3)))
        assert "kvlease partition add db.orders d1" in refused.value.message
    assert cluster.admin.list_partitions("db.orders")[1] == []


@pytest.mark.parametrize("bad, message", [({"day": "a b", "id": 1, "v": "x"}, "bad partition value"),
                                          ({"day": None, "id": 1, "v": "x"}, "day")])
def test_rows_whose_partition_value_names_no_partition_are_refused_and_nothing_is_written(cluster, bad, message):
    orders(cluster)
    with TableClient(cluster.admin, "db.orders") as client:
        with pytest.raises((errors.InvalidRowError, errors.InvalidRequestError)) as refused:
            client.upsert(rows("d1", range(3)) + [bad])
        assert message in refused.value.message and "\n" not in refused.value.message
    assert cluster.admin.list_partitions("db.orders")[1] == []


def test_a_dropped_partition_is_gone_from_every_replica_and_others_are_untouched(cluster):
    table = orders(cluster, replication_factor=2)
    with TableClient(cluster.admin, "db.orders") as client:
        client.upsert(rows("d1", range(20)) + rows("d2", range(20)))
    (d1, d2) = cluster.admin.list_partitions("db.orders")[1]
    dirs = [os.path.join(server.replicas.data_dir, str(d1.partition_id)) for server in cluster.tablets.values()]
    wait_until(lambda: all(os.path.isdir(d) for d in dirs), 10, "d1 on both replicas")
    cluster.admin.drop_partition("db.orders", "d1")
    wait_until(lambda: not any(os.path.exists(d) for d in dirs), 15, "d1's local data deleted")
    with TableClient(cluster.admin, "db.orders", create_partitions=False) as client:
        assert client.lookup([("d1", 1), ("d2", 1)]) == [None, {"day": "d2", "id": 1, "v": "a"}]
    with pytest.raises(errors.PartitionNotExistsError):
        TableClient(cluster.admin, "db.orders", partition="d1")
    assert [p.name for p in cluster.admin.list_partitions("db.orders")[1]] == ["d2"]
    leaders = cluster.admin.get_table_assignment(table.table_id, d2.partition_id)[1]
    assert all(b.leader_address for b in leaders.values())  # d2 untouched


def test_a_partition_bucket_is_served_again_after_its_leader_is_killed(cluster):
    orders(cluster, replication_factor=2)
    with TableClient(cluster.admin, "db.orders") as client:
        client.upsert(rows("d1", range(50)))
    table, (d1,) = cluster.admin.list_partitions("db.orders")

    def assignment():
        return cluster.admin.get_table_assignment(table.table_id, d1.partition_id)[1]
    wait_until(lambda: all(len(b.isr) == 2 for b in assignment().values()), 20, "both replicas in sync")
    victim = assignment()[0].leader_id
    server = cluster.tablets.pop(victim)
    server._controlled_shutdown = lambda: None  # as kill -9: its leaderships are not handed over
    server.stop()
    wait_until(lambda: assignment()[0].leader_id not in (-1, victim), 20, "a new leader of bucket 0")
    with TableClient(cluster.admin, "db.orders") as client:
        assert [r["id"] for r in client.lookup([("d1", i) for i in range(50)])] == list(range(50))
        client.upsert(rows("d1", range(50, 60)))  # and it takes writes
