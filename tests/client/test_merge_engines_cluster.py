"""Merge engines and partial updates through the table client, against a real coordinator and real tablet
servers on ZooKeeper (docs/merge-engines.md): each engine, the change feed it writes, a lost answer resent,
and an aggregation table across a leader failover with replication factor 3."""

from __future__ import annotations

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.merge_engine import parse_engine
from kvlease.common.tables import parse_schema
from kvlease.ops.wait import wait_until
from tests.client.test_table_client_cluster import local_cluster  # noqa: F401 (fixture)
from tests.tablet.replication.test_rebuild import (RETENTION, come_back_wiped, lose_follower, rows_of,
                                                  snapshot_and_retain)
from tests.tablet.replication.test_replicated_buckets import bucket_state, crash, server_by_id, three_servers, wait_in_sync

COLUMNS = parse_schema("id BIGINT, ver BIGINT, total BIGINT, n INT, tags STRING, top BIGINT, note STRING")
AGGREGATES = {"total": "sum", "n": "sum", "tags": "listagg", "top": "max"}


def create(cluster, path: str, kind: str | None, buckets: int = 2, **options):
    info = cluster.admin.create_table(path, COLUMNS, ["id"], buckets, merge_engine=parse_engine(kind, **options))
    wait_until(lambda: all(b.leader_address for b in cluster.admin.get_table_assignment(info.table_id)[1].values()),
               30, f"{path} led")
    return info


def feed(client: TableClient, columns=("total",)) -> list[tuple]:
    """Every change record of every bucket: (change type, id, the named columns)."""
    out = []
    for bucket in range(client.table.buckets):
        records, _ = client.fetch_log(bucket, 0)
        out += [(r["change_type"], r["row"]["id"], *(r["row"][c] for c in columns)) for r in records]
    return sorted(out, key=lambda r: r[1])


def test_each_engine_and_partial_updates_through_the_client(local_cluster):
    cluster = local_cluster(2)
    create(cluster, "db.first", "first_row")
    create(cluster, "db.ver", "versioned", version_column="ver")
    create(cluster, "db.agg", "aggregation", aggregates=AGGREGATES, delete_behavior="ignore")
    create(cluster, "db.plain", None)
    assert cluster.admin.get_table("db.agg").merge_engine.describe() == (
        "aggregation (total=sum, n=sum, tags=listagg, top=max, deletes ignore)")
    with TableClient(cluster.admin, "db.first") as first:
        first.upsert([{"id": i, "note": f"a{i}"} for i in range(4)])
        first.upsert([{"id": i, "note": f"b{i}"} for i in range(6)])
        assert [r["note"] for r in first.lookup(range(6))] == ["a0", "a1", "a2", "a3", "b4", "b5"]
        assert {r[0] for r in feed(first)} == {"+I"} and len(feed(first)) == 6  # insert-only
        with pytest.raises(errors.InvalidRequestError, match="refuses deletes: its merge engine is first_row"):
            first.delete([1])
    with TableClient(cluster.admin, "db.ver") as ver:
        ver.upsert([{"id": 1, "ver": 5, "note": "five"}, {"id": 2, "ver": 1, "note": "one"}])
        ver.upsert([{"id": 1, "ver": 4, "note": "four"}, {"id": 2, "ver": 2, "note": "two"}])
        assert [r["note"] for r in ver.lookup([1, 2])] == ["five", "two"]
        with pytest.raises(errors.InvalidRowError, match="column 'ver': the version column is null"):
            ver.upsert([{"id": 3, "note": "none"}])
    with TableClient(cluster.admin, "db.agg") as agg:
        agg.upsert([{"id": 1, "total": 10, "n": 1, "tags": "a", "top": 3}, {"id": 2, "total": 1, "n": 1}])
        agg.upsert([{"id": 1, "total": 5, "n": 1, "tags": "b", "top": 2, "note": "x"}])
        agg.retract([{"id": 1, "total": 7, "n": 1}, {"id": 99, "total": 1}])  # 99: no row, nothing to take from
        assert agg.lookup([1, 99]) == [{"id": 1, "ver": None, "total": 8, "n": 1, "tags": "a,b", "top": 3,
                                        "note": "x"}, None]
        with pytest.raises(errors.InvalidRowError, match="column 'top': max cannot take a retract"):
            agg.retract([{"id": 1, "top": 3}])
        agg.delete([2])  # --delete-behavior ignore
        assert agg.lookup([2])[0]["total"] == 1
        assert [r for r in feed(agg) if r[1] == 1] == [("+I", 1, 10), ("-U", 1, 10), ("+U", 1, 15), ("-U", 1, 15),
                                                        ("+U", 1, 8)]
    with TableClient(cluster.admin, "db.plain") as plain:
        plain.upsert([{"id": 1, "note": "n", "total": 1, "tags": "t"}])
        plain.upsert([{"id": 1, "total": 2}, {"id": 1, "tags": None}, {"id": 2, "note": "new"}], partial=True)
        assert plain.lookup([1, 2]) == [
            {"id": 1, "ver": None, "total": 2, "n": None, "tags": None, "top": None, "note": "n"},
            {"id": 2, "ver": None, "total": None, "n": None, "tags": None, "top": None, "note": "new"}]
        assert [r for r in feed(plain, ("total", "note")) if r[1] == 1][-2:] == [("-U", 1, 2, "n"), ("+U", 1, 2, "n")]
        with pytest.raises(errors.InvalidRowError, match="column 'id'"):
            plain.upsert([{"total": 3}], partial=True)
        with pytest.raises(errors.InvalidRequestError, match="cannot take a retract"):
            plain.retract([{"id": 1, "total": 1}])


def test_a_lost_answer_resent_is_summed_once(local_cluster, monkeypatch):
    cluster = local_cluster(1)
    create(cluster, "db.sums", "aggregation", buckets=1, aggregates={"total": "sum"})
    real_send = TableClient.send
    lost = []

    def send(self, routing, address, method, request, **kwargs):
        response = real_send(self, routing, address, method, request, **kwargs)
        if method == "PutKv" and not lost:  # appended on the server, the answer lost on the way back
            lost.append((request.writer_id, request.sequence))
            raise errors.NetworkError("injected: the answer was lost")
        return response

    monkeypatch.setattr(TableClient, "send", send)
    with TableClient(cluster.admin, "db.sums") as client:
        client.upsert([{"id": 1, "total": 5}])
        client.upsert([{"id": 1, "total": 5}])
        assert lost and client.lookup([1])[0]["total"] == 10  # the first batch was sent twice, applied once
        client.retract([{"id": 1, "total": 3}])
        assert client.lookup([1])[0]["total"] == 7
        assert [r[0] for r in feed(client)] == ["+I", "-U", "+U", "-U", "+U"]


def test_aggregation_survives_a_leader_failover_and_the_followers_agree(make_config, tmp_path):
    with three_servers(make_config, tmp_path) as c:
        table = c.admin.create_table("db.failover", COLUMNS, ["id"], 1, replication_factor=3,
                                     merge_engine=parse_engine("aggregation", aggregates=AGGREGATES))
        wait_in_sync(c, table.table_id)
        with TableClient(c.admin, "db.failover") as client:
            for i in range(5):
                client.upsert([{"id": k, "total": i + 1, "tags": str(i)} for k in range(3)])
            client.retract([{"id": 0, "total": 5}])
            old_leader = bucket_state(c, table.table_id).leader_id
            crash(c, server_by_id(c, old_leader))
            wait_until(lambda: (s := bucket_state(c, table.table_id)).leader_id not in (None, -1, old_leader), 30,
                       "a new leader")
            client.upsert([{"id": k, "total": 100, "tags": "x"} for k in range(3)])
            client.retract([{"id": 1, "total": 1}])
            rows = client.lookup([0, 1, 2])
            assert [r["total"] for r in rows] == [110, 114, 115]
            assert rows[0]["tags"] == "0,1,2,3,4,x"
            leader = bucket_state(c, table.table_id).leader_id
            follower = next(s for s in c.tablets if s.server_id != leader)
            wait_until(lambda: _rows(follower, table) == _rows(server_by_id(c, leader), table), 20,
                       "the follower holds the leader's rows")
            assert len(_rows(follower, table)) == 3


def _rows(server, table) -> dict[bytes, bytes]:
    """The rows a tablet server's replica of bucket 0 holds in RocksDB (followed or led), encoded."""
    return rows_of(server.replicas.replica(table.physical_id, 0).store)


def test_a_wiped_follower_of_an_aggregation_table_is_rebuilt_with_the_leaders_sums(make_config, tmp_path):
    """The follower comes back with no data after the leader's log head was removed (snapshot + retention): it
    is rebuilt from the snapshot and the changelog's tail, and holds the leader's rows, sums included."""
    with three_servers(make_config, tmp_path, RETENTION) as c:
        table = c.admin.create_table("db.rebuilt", COLUMNS, ["id"], 1, replication_factor=3, min_insync_replicas=2,
                                     merge_engine=parse_engine("aggregation", aggregates=AGGREGATES))
        with TableClient(c.admin, "db.rebuilt", retry_total_s=30) as client:
            wait_in_sync(c, table.table_id)
            for i in range(10):
                client.upsert([{"id": k, "total": i, "note": "x" * 200} for k in range(20)])
            server_id, leader = lose_follower(c, table.table_id)
            for i in range(10, 20):
                client.upsert([{"id": k, "total": i} for k in range(20)])
            snapshot_and_retain(leader, table.table_id)
            client.retract([{"id": k, "total": 100} for k in range(10)])  # the tail after the snapshot
            leader_store = leader.replicas.replica(table.table_id, 0).store
            assert leader_store.list_offsets()[0] > 0  # the log head is gone: fetching from 0 cannot work
            back, store = come_back_wiped(c, tmp_path, server_id, table.table_id)
            wait_until(lambda: store.high_watermark >= leader_store.high_watermark, 20, "the rebuilt follower")
            assert back.fetchers.rebuilder.rebuilt == 1
            assert rows_of(store) == rows_of(leader_store)
            assert [r["total"] for r in client.lookup([0, 19])] == [sum(range(20)) - 100, sum(range(20))]


def test_partial_updates_and_retracts_of_a_partitioned_table(local_cluster):
    cluster = local_cluster(1)
    columns = parse_schema("day STRING, id BIGINT, total BIGINT, note STRING")
    cluster.admin.create_table("db.days", columns, ["day", "id"], 2, partition_key=["day"],
                               merge_engine=parse_engine("aggregation", aggregates={"total": "sum"}))
    with TableClient(cluster.admin, "db.days") as client:
        client.upsert([{"day": "a", "id": 1, "total": 5, "note": "n"}, {"day": "b", "id": 1, "total": 7}])
        client.upsert([{"day": "a", "id": 1, "total": 1}, {"day": "b", "id": 1, "total": 1}], partial=True)
        client.retract([{"day": "b", "id": 1, "total": 2}])
        assert client.lookup([("a", 1), ("b", 1)]) == [{"day": "a", "id": 1, "total": 6, "note": "n"},
                                                       {"day": "b", "id": 1, "total": 6, "note": None}]
