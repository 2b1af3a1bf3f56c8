"""Prefix lookups end to end (docs/python-api.md, "Prefix lookups"): a coordinator and tablet servers in-process
on a real ZooKeeper, real RocksDB, real gRPC. ``lookup_prefix`` returns exactly the rows a full scan filtered in
Python returns: across buckets, after updates and deletes, for strings that are prefixes of one another or
hold 0x00, a prefix cut into several answers, a partitioned table, a call retried while its leader restarts,
and after a leader failover (replication factor 2)."""

from __future__ import annotations

import random
import threading
import time
import zlib

import pytest

from kvlease.client import prefix_lookup
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.codec import batch_to_ipc
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster
from tests.support.spark_tables import kv  # noqa: F401 (fixture: 2 tablet servers)

pytestmark = pytest.mark.zk

COLUMNS = [Column("user", "STRING"), Column("seq", "BIGINT"), Column("v", "STRING")]
USERS = ["", "a", "ab", "abc", "a\x00", "a\x00b", "b", "\xff", "zz"]


@pytest.fixture
def cluster(kv) -> LocalCluster:
    return kv


def make_table(cluster: LocalCluster, path: str = "db.events", buckets: int = 4, **options):
    info = cluster.admin.create_table(path, COLUMNS, ["user", "seq"], buckets, bucket_key=["user"], **options)
    wait_until(lambda: all(b.leader_address for b in cluster.admin.get_table_assignment(info.table_id)[1].values())
               if not info.partitioned else True, 30, "every bucket led")
    return info


def scanned(client: TableClient) -> list[dict]:
    return [row for batch in client.scan().batches for row in batch.to_pylist()]


def expected(rows: list[dict], users) -> list[dict]:
    """The rows of ``users`` as a prefix lookup answers them: prefix by prefix, each in key order (bytes
    order of the UTF-8 text, then seq)."""
    return [row for user in users
            for row in sorted((r for r in rows if r["user"] == user), key=lambda r: r["seq"])]


def write_history(client: TableClient, seed: int) -> None:
    rng = random.Random(seed)
    client.upsert([{"user": u, "seq": s, "v": f"{u}-{s}"} for u in USERS for s in range(-3, 40)])
    client.upsert([{"user": rng.choice(USERS), "seq": rng.randrange(-3, 40), "v": "updated"} for _ in range(100)])
    client.delete([(rng.choice(USERS), rng.randrange(-3, 40)) for _ in range(80)])


def test_prefix_lookup_returns_exactly_the_rows_of_a_filtered_scan(cluster):
    make_table(cluster)
    with TableClient(cluster.admin, "db.events") as client:
        write_history(client, 1)
        rows = scanned(client)
        buckets = {b for b, _rows, _idx in client.split(client.key_batch([(u, 0) for u in USERS]))}
        assert len(buckets) > 1  # the users spread over several buckets
        for user in USERS:  # one prefix at a time, and all of them in one call
            assert client.lookup_prefix([user]) == expected(rows, [user]), user
        wanted = USERS[::-1] + ["nobody", "a"]
        assert client.lookup_prefix(wanted) == expected(rows, wanted)
        assert client.lookup_prefix([{"user": "ab"}]) == client.lookup_prefix([("ab",)]) == expected(rows, ["ab"])
        batch = client.lookup_prefix_batch(client.key_batch([("a", 0)]).select(["user"]))
        assert batch.to_pylist() == expected(rows, ["a"])
        # every row of a user is in the bucket of its user alone
        for bucket, part, _ in client.split(client.codec.to_batch(rows)):
            assert len({client.split(client.key_batch([(r["user"], 0)]))[0][0] for r in part.to_pylist()}) == 1
            assert {client.split(client.key_batch([(r["user"], 0)]))[0][0] for r in part.to_pylist()} == {bucket}


def test_a_prefix_is_read_in_several_answers_when_it_is_larger_than_one(cluster, monkeypatch):
    make_table(cluster, buckets=2)
    with TableClient(cluster.admin, "db.events") as client:
        write_history(client, 2)
        rows = scanned(client)
        calls = []
        real = client._call_bucket
        monkeypatch.setattr(client, "_call_bucket", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
        got = prefix_lookup.lookup_prefix_batch(client, USERS, max_bytes=200).to_pylist()
        assert got == expected(rows, USERS)
        assert calls.count("PrefixLookup") > len(rows) * 20 // 200  # about 200 bytes of rows an answer


def test_bad_prefixes_and_a_table_without_a_bucket_key_are_one_line_errors(cluster):
    make_table(cluster)
    cluster.create_table("db.plain", COLUMNS, ["user", "seq"], 2)
    with TableClient(cluster.admin, "db.events") as client:
        for bad, message in (([{"seq": 1}], "column 'seq' is not in the bucket key (user)"),
                             ([{}], "bucket key column 'user' is missing"),
                             ([("a", 1)], "the bucket key has 1 column(s) (user), got 2 value(s)"),
                             ([None], "column 'user': primary key is null"),
                             ([7], "column 'user': expected STRING"),
                             ("a", "put a single prefix in a list")):
            with pytest.raises(errors.InvalidRowError) as refused:
                client.lookup_prefix(bad)
            assert message in refused.value.message and "\n" not in refused.value.message
    with TableClient(cluster.admin, "db.plain") as client:
        with pytest.raises(errors.InvalidRequestError, match="table db.plain has no bucket key"):
            client.lookup_prefix(["a"])
    for bucket_key, message in ((["seq"], "is not a prefix of the primary key (user, seq)"),
                                (["nope"], "bucket key column 'nope' is not a column of the primary key"),
                                (["user", "seq"], "is the whole primary key")):
        with pytest.raises(errors.InvalidTableError, match=message.replace("(", r"\(").replace(")", r"\)")):
            cluster.admin.create_table("db.bad", COLUMNS, ["user", "seq"], 2, bucket_key=bucket_key)


def test_a_partitioned_table_prefix_names_its_partition(cluster):
    columns = [Column("day", "STRING"), Column("user", "STRING"), Column("seq", "BIGINT")]
    with pytest.raises(errors.InvalidTableError, match="leaves out partition column 'day'"):
        cluster.admin.create_table("db.p", columns, ["user", "day", "seq"], 2, partition_key=["day"],
                                   bucket_key=["user"])
    cluster.admin.create_table("db.p", columns, ["day", "user", "seq"], 3, partition_key=["day"],
                               bucket_key=["day", "user"])
    with TableClient(cluster.admin, "db.p") as client:
        client.upsert([{"day": d, "user": u, "seq": s} for d in ("d1", "d2") for u in ("a", "ab", "b")
                       for s in range(5)])
        got = client.lookup_prefix([("d2", "ab"), ("d1", "a"), ("d3", "a")])
        assert got == ([{"day": "d2", "user": "ab", "seq": s} for s in range(5)]
                       + [{"day": "d1", "user": "a", "seq": s} for s in range(5)])


def test_a_prefix_lookup_is_retried_while_its_leader_restarts(cluster):
    make_table(cluster, buckets=2)
    with TableClient(cluster.admin, "db.events", retry_total_s=60) as client:
        write_history(client, 3)
        rows = scanned(client)
        bucket = client.split(client.key_batch([("ab", 0)]))[0][0]
        address = client.leaders()[bucket]
        victim = next(i for i, t in cluster.tablets.items() if t.address == address)
        cluster.stop_tablet(victim)
        restart = threading.Timer(1.0, cluster.start_tablet, args=(victim,))
        restart.start()
        started = time.monotonic()
        try:
            assert client.lookup_prefix(["ab"]) == expected(rows, ["ab"])
        finally:
            restart.join()
        assert time.monotonic() - started >= 0.9  # answered once the leader was back: the call was retried


def test_prefix_lookup_after_a_leader_failover(cluster):
    info = make_table(cluster, buckets=2, replication_factor=2)
    with TableClient(cluster.admin, "db.events") as client:
        write_history(client, 4)
        rows = scanned(client)
    wait_until(lambda: all(len(b.isr) == 2 for b in cluster.admin.get_table_assignment(info.table_id)[1].values()),
               20, "both replicas in sync")
    victim = cluster.admin.get_table_assignment(info.table_id)[1][0].leader_id
    server = cluster.tablets.pop(victim)
    server._controlled_shutdown = lambda: None  # as kill -9: its leaderships are not handed over
    server.stop()
    wait_until(lambda: all(b.leader_id not in (-1, victim)
                           for b in cluster.admin.get_table_assignment(info.table_id)[1].values()), 20, "new leaders")
    with TableClient(cluster.admin, "db.events") as client:
        assert client.lookup_prefix(USERS) == expected(rows, USERS)


def test_the_server_hashes_the_bucket_key_for_writes_and_prefix_lookups(cluster):
    make_table(cluster, buckets=8)
    with TableClient(cluster.admin, "db.events") as client:
        codec = client.codec
        rows = codec.to_batch([{"user": "ab", "seq": s, "v": "x"} for s in range(40)])
        right = int(codec.buckets(codec.encode_keys(rows))[0])
        # by the whole key the rows would spread over buckets; by the bucket key all are in one
        assert len({zlib.crc32(k) % 8 for k in codec.encode_keys(rows)}) > 1
        wrong = (right + 1) % 8
        for bucket, fine in ((right, True), (wrong, False)):
            request = pb.PutKvRequest(table_id=client.table.table_id, bucket=bucket, upserts=batch_to_ipc(rows))
            if fine:
                client._call_bucket(bucket, "PutKv", request, idempotent=False)
                continue
            with pytest.raises(errors.InvalidRowError, match=r"belongs to bucket \d+ .*crc32\(encoded bucket key\)"):
                client._call_bucket(bucket, "PutKv", request, idempotent=False)
        prefixes = batch_to_ipc(rows.select(["user"]).slice(0, 1))
        with pytest.raises(errors.InvalidRowError, match=f"prefix 0 .* belongs to bucket {right}, not to bucket"):
            client._call_bucket(wrong, "PrefixLookup", pb.PrefixLookupRequest(
                table_id=client.table.table_id, bucket=wrong, prefixes=prefixes), idempotent=True)
        with pytest.raises(errors.InvalidRequestError, match="start_after_key is not a key of the first prefix"):
            client._call_bucket(right, "PrefixLookup", pb.PrefixLookupRequest(
                table_id=client.table.table_id, bucket=right, prefixes=prefixes, start_after_key=b"zz"),
                idempotent=True)
        assert [r["seq"] for r in client.lookup_prefix(["ab"])] == list(range(40))
