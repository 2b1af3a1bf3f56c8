"""Row TTL on a real coordinator and real tablet servers (in-process, on ZooKeeper, over gRPC, RocksDB):
lookups and scans leave expired rows out before they are deleted; the leader's background rounds delete
them with -D records (bounded per round), or with records the change feed skips (``--ttl-changelog
none``); a row written again just before it expires is kept; after a failover the new leader deletes.

Two clusters, each shared by its tests: ``idle`` (rounds only when a test runs one, at most 5 rows each)
and ``active`` (two tablet servers, replication factor 2, a round every 200 ms of at most 10 rows)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from kvlease.client.table import TableClient
from kvlease.common.config import Config
from kvlease.common.logentry import ChangeType
from kvlease.common.merge_engine import parse_engine
from kvlease.common.row_ttl import row_ttl
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.conftest import TEST_DEFAULTS
from tests.support.cli_runner import run
from tests.support.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)

COLUMNS = [Column("id", "BIGINT"), Column("ts", "BIGINT"), Column("v", "STRING")]
ACTIVE_MAX_ROWS = 10


def _cluster(zk_server, kvlease_tmp, tablets: int, overrides: dict):
    base = Path(tempfile.mkdtemp(prefix="row-ttl-", dir=kvlease_tmp))
    (base / "remote").mkdir()
    settings = {**TEST_DEFAULTS, "zookeeper.address": zk_server.connect_string,
                "zookeeper.path.root": f"/row-ttl-{uuid.uuid4().hex[:8]}", "remote.data.dir": f"file://{base / 'remote'}"}

    def make_config(more=None, /, **extra):
        return Config({**settings, **(more or {}), **extra}, env={})

    return base, LocalCluster(make_config, base, tablets, overrides)


@pytest.fixture(scope="module")
def idle(zk_server, kvlease_tmp):
    base, cluster = _cluster(zk_server, kvlease_tmp, 1, {"row-ttl.check-interval": "1h",
                                                          "row-ttl.max-rows-per-check": 5})
    try:
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def active(zk_server, kvlease_tmp):
    base, cluster = _cluster(zk_server, kvlease_tmp, 2, {"row-ttl.check-interval": "200ms",
                                                          "row-ttl.max-rows-per-check": ACTIVE_MAX_ROWS})
    try:
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(base, ignore_errors=True)


def _create(cluster: LocalCluster, ttl, buckets: int = 1, replication: int = 1, columns=COLUMNS) -> str:
    path = f"d{uuid.uuid4().hex[:8]}.t"
    info = cluster.admin.create_table(path, columns, ["id"], buckets, replication_factor=replication, row_ttl=ttl)

    def led():
        _, leaders = cluster.admin.get_table_assignment(info.table_id)
        return all(b.leader_address and len(b.isr) == replication for b in leaders.values())
    wait_until(led, 30, f"{path}: every bucket led")
    return path


def _now() -> int:
    return int(time.time() * 1000)


def _log(client: TableClient, bucket: int = 0) -> list[dict]:
    records, offset = [], 0
    while True:
        got, end = client.fetch_log(bucket, offset)
        records += got
        if not got or end <= (got[-1]["offset"] + 1 if got else offset):
            return records
        offset = got[-1]["offset"] + 1


def _entries(client: TableClient, bucket: int = 0) -> list[list[str]]:
    """The change types of each changelog entry of ``bucket``."""
    entries, offset = [], 0
    while True:
        got, end = client.fetch_log_entries(bucket, offset)
        if not got:
            return entries
        entries += [[ChangeType(t).short for t in e.records.column("change_type").to_pylist()] for e in got]
        offset = got[-1].next_offset
        if offset >= end:
            return entries


def test_expired_rows_vanish_at_once_and_a_round_deletes_a_bounded_number(idle):
    path = _create(idle, row_ttl("1h", "ts"))
    rounds = idle.tablets[1].expiry_rounds
    now = _now()
    with TableClient(idle.admin, path) as client:
        client.upsert([{"id": i, "ts": now - 7_200_000, "v": f"old{i}"} for i in range(12)]
                      + [{"id": 100 + i, "ts": now, "v": f"new{i}"} for i in range(3)])
        assert client.lookup([0, 11, 100, 102]) == [None, None, {"id": 100, "ts": now, "v": "new0"},
                                                    {"id": 102, "ts": now, "v": "new2"}]
        assert sorted(r["id"] for b in client.scan().batches for r in b.to_pylist()) == [100, 101, 102]
        assert [r["id"] for b in client.scan(limit=2).batches for r in b.to_pylist()] == [100, 101]
        streamed = client.scan(streaming=True, limit=3).batches
        assert [r["id"] for b in streamed for r in b.to_pylist()] == [100, 101, 102]
        assert {r["change_type"] for r in _log(client)} == {"+I"}  # nothing deleted yet: only left out
        deleted = [rounds.run_once() for _ in range(4)]
        assert deleted == [5, 5, 2, 0] and rounds.last_round == (0, 0)  # 5 rows read per round at most
        log = _log(client)
        gone = [r for r in log if r["change_type"] == "-D"]
        assert sorted(r["row"]["id"] for r in gone) == list(range(12))
        assert all(r["row"]["v"] == f"old{r['row']['id']}" for r in gone)  # the before-image
        assert [len(e) for e in _entries(client) if e[0] == "-D"] == [5, 5, 2]
        assert client.lookup([100, 101, 102]) == [{"id": 100 + i, "ts": now, "v": f"new{i}"} for i in range(3)]
    idle.admin.drop_table(path)


def test_prefix_lookups_leave_expired_rows_out(idle):
    path = f"d{uuid.uuid4().hex[:8]}.t"
    columns = [Column("u", "STRING"), *COLUMNS]
    idle.admin.create_table(path, columns, ["u", "id"], 2, replication_factor=1, row_ttl=row_ttl("1h", "ts"),
                            bucket_key=["u"])
    now = _now()
    with TableClient(idle.admin, path) as client:
        client.upsert([{"u": u, "id": i, "ts": now - (7_200_000 if i % 2 else 0), "v": f"{u}{i}"}
                       for u in ("a", "b") for i in range(5)])
        assert [(r["u"], r["id"]) for r in client.lookup_prefix(["b", "a"])] == [
            ("b", 0), ("b", 2), ("b", 4), ("a", 0), ("a", 2), ("a", 4)]  # the odd ones expired an hour ago
    idle.admin.drop_table(path)


def test_merge_engines_fold_an_expired_row_as_a_missing_one_and_expiry_deletes_bypass_them(idle):
    now = _now()
    engines = {"sum": parse_engine("aggregation", aggregates={"n": "sum"}), "first": parse_engine("first_row")}
    paths = {}
    for name, engine in engines.items():
        paths[name] = f"d{uuid.uuid4().hex[:8]}.t"
        idle.admin.create_table(paths[name], [Column("id", "BIGINT"), Column("ts", "BIGINT"), Column("n", "BIGINT")],
                                ["id"], 1, replication_factor=1, row_ttl=row_ttl("1h", "ts"), merge_engine=engine)
    with TableClient(idle.admin, paths["sum"]) as sums, TableClient(idle.admin, paths["first"]) as firsts:
        for client in (sums, firsts):
            client.upsert([{"id": 1, "ts": now - 7_200_000, "n": 5}, {"id": 2, "ts": now, "n": 5}])
            client.upsert([{"id": 1, "ts": now, "n": 3}, {"id": 2, "ts": now, "n": 3}])
        # the expired row 1 is gone for the engines: a new sum, a new first row; row 2 folds as usual
        assert sums.lookup([1, 2]) == [{"id": 1, "ts": now, "n": 3}, {"id": 2, "ts": now, "n": 8}]
        assert firsts.lookup([1, 2]) == [{"id": 1, "ts": now, "n": 3}, {"id": 2, "ts": now, "n": 5}]
        assert [r["change_type"] for r in _log(sums)][-4:] == ["-U", "+U", "-U", "+U"]  # before-images kept
        firsts.upsert([{"id": 3, "ts": now - 7_200_000, "n": 1}])
        assert idle.tablets[1].expiry_rounds.run_once() >= 1  # a first_row table refuses deletes, not expiry
        assert [(r["change_type"], r["row"]["id"]) for r in _log(firsts)][-1] == ("-D", 3)
    for path in paths.values():
        idle.admin.drop_table(path)


def _wait_records(client: TableClient, count: int, bucket: int = 0, timeout: float = 10) -> None:
    wait_until(lambda: client.list_offsets()[bucket][1] >= count, timeout, f"{count} records in bucket {bucket}",
               interval_s=0.1)


def test_the_leader_deletes_expired_rows_with_minus_d_records(active):
    path = _create(active, row_ttl("2s", "ts"), replication=2)
    now = _now()
    with TableClient(active.admin, path) as client:
        client.upsert([{"id": i, "ts": now, "v": f"v{i}"} for i in range(25)])
        assert len([r for r in client.lookup(list(range(25))) if r is not None]) == 25
        _wait_records(client, 50)
        assert _now() - now >= 2000  # not before they expired
        gone = [r for r in _log(client) if r["change_type"] == "-D"]
        assert sorted(r["row"]["id"] for r in gone) == list(range(25))
        assert all(r["row"]["v"] == f"v{r['row']['id']}" for r in gone)
        assert all(len(e) <= ACTIVE_MAX_ROWS for e in _entries(client) if e[0] == "-D")  # bounded per round
        assert client.lookup(list(range(25))) == [None] * 25
    active.admin.drop_table(path)


def test_with_ttl_changelog_none_the_deletes_are_applied_but_not_in_the_change_feed(active):
    path = _create(active, row_ttl("1s", "ts", "none"), replication=2)
    now = _now()
    with TableClient(active.admin, path) as client:
        client.upsert([{"id": i, "ts": now, "v": f"v{i}"} for i in range(8)])
        _wait_records(client, 16)  # 8 inserts, 8 deletes
        assert [r["change_type"] for r in _log(client)] == ["+I"] * 8
        assert sum(b.num_rows for b in client.scan().batches) == 0
    active.admin.drop_table(path)


def test_a_row_written_again_before_it_expires_is_kept(active):
    path = _create(active, row_ttl("4s"), replication=2, columns=[Column("id", "BIGINT"), Column("v", "STRING")])
    with TableClient(active.admin, path) as client:
        client.upsert([{"id": i, "v": "first"} for i in range(10)])
        start = time.monotonic()
        time.sleep(2)
        client.upsert([{"id": i, "v": "again"} for i in range(5)])  # a refresh: a new write time
        _wait_records(client, 10 + 10 + 5, timeout=8)  # +I x10, -U/+U x5, -D x5
        assert time.monotonic() - start < 5.5, "too slow a machine for this test's margins"
        log = _log(client)
        assert sorted(r["row"]["id"] for r in log if r["change_type"] == "-D") == [5, 6, 7, 8, 9]
        rows = client.lookup(list(range(10)))
        assert [r["v"] for r in rows[:5]] == ["again"] * 5 and rows[5:] == [None] * 5
        assert all(r["_write_time"] is not None for r in rows[:5])
    active.admin.drop_table(path)


def test_after_a_failover_the_new_leader_deletes(active):
    path = _create(active, row_ttl("3s", "ts"), replication=2)
    now = _now()
    with TableClient(active.admin, path) as client:
        client.upsert([{"id": i, "ts": now, "v": f"v{i}"} for i in range(6)])
        info = active.admin.get_table(path)
        old = active.admin.get_table_assignment(info.table_id)[1][0].leader_id
        active.stop_tablet(old)
        assert _now() < now + 3000, "the old leader stopped after the rows expired: too slow for this test"
        try:
            new = wait_until(lambda: (b := active.admin.get_table_assignment(info.table_id)[1][0]).leader_address
                             and b.leader_id != old and b.leader_id, 30, "a new leader")
            client.refresh()
            _wait_records(client, 12, timeout=15)
            assert sorted(r["row"]["id"] for r in _log(client) if r["change_type"] == "-D") == list(range(6))
        finally:
            active.start_tablet(old)
        # the old leader, a follower now, catches up on the deletes: its copy holds none of the rows
        replica = active.tablets[old].replicas

        def caught_up():
            try:
                store = replica.replica(info.table_id, 0).store
            except Exception:
                return False
            return store.log_end_offset >= 12 and store.applied_offset >= 12
        wait_until(caught_up, 30, "the old leader caught up")
        store = replica.replica(info.table_id, 0).store
        with store.snapshot() as snapshot:
            assert list(store.iter_rows(snapshot)) == []
        assert new != old
    active.admin.drop_table(path)


def test_the_cli_creates_and_describes_a_ttl_table(idle):
    bootstrap = ("--bootstrap", idle.coordinator.address)
    made = run(*bootstrap, "table", "create", "cli.t", "--schema", "id BIGINT, v STRING", "--primary-key", "id",
               "--buckets", "1", "--ttl", "90s", "--ttl-changelog", "none")
    assert made.exit_code == 0, made.output
    assert "row TTL 90s after the write time (column _write_time); expired rows deleted without" in made.stdout
    described = run(*bootstrap, "table", "describe", "cli.t", "--json")
    assert json.loads(described.stdout)["row_ttl"] == {"ttl_ms": 90_000, "column": "_write_time", "write_time": True,
                                                       "changelog": "none"}
    assert "_write_time" in json.dumps(json.loads(described.stdout)["schema"])
    assert "row TTL" in run(*bootstrap, "table", "describe", "cli.t").stdout
    idle.admin.drop_table("cli.t")
