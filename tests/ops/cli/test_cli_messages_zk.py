"""Messages that name the cause, on real servers (a coordinator and tablet servers in this process, a real
ZooKeeper, RocksDB, gRPC on loopback) through the CLI in-process: a bucket that waits for its last in-sync
replica says so, and a ``kvlease put`` that failed after some of its rows were written says how many."""

from __future__ import annotations

import json

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.tablet.replication.test_data_loss_cluster import cluster, two_in_sync  # noqa: F401
from tests.tablet.replication.test_replicated_buckets import SCHEMA, bucket_state, crash, server_by_id

pytestmark = pytest.mark.zk


def test_a_bucket_waiting_for_its_last_in_sync_replica_says_so_while_another_replica_is_live(cluster, tmp_path):
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, "db.wait")
    crash(c, server_by_id(c, follower))
    wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the follower out of the ISR")
    with TableClient(c.admin, "db.wait") as client:
        client.upsert([{"id": i, "v": "only on the leader"} for i in range(4)])
    crash(c, server_by_id(c, leader))
    c.tablet(follower, tmp_path / f"t{follower}")  # live, out of sync
    wait_until(lambda: {s.id for s in c.admin.list_tablet_servers()} == {follower}, 15, "the follower registered")
    offline = bucket_state(c, table.table_id)
    assert (offline.leader_id, offline.isr, offline.offline_reason) == (-1, (leader,), "")

    at = ("--bootstrap", c.coordinator.address, "--retry-timeout", "300ms")
    line = assert_one_line_error(run(*at, "log", "db.wait", "--bucket", "0", "--follow"))
    assert (f"bucket 0 of table db.wait: offline: it waits for its last in-sync replica, tablet server {leader}, to "
            f"come back (start it); tablet server {follower} is not in sync: `kvlease bucket elect --unclean` lets "
            f"it lead, losing the changes only tablet server {leader} has") in line, line
    assert "with room" not in line


def test_a_put_that_failed_after_writing_some_rows_says_how_many_were_written(cluster, tmp_path):
    """30 rows over three one-replica buckets, one of them on a tablet server that is down: the rows of the
    other buckets are written, and the error counts them (the rows found afterwards are exactly those)."""
    c = cluster
    for server_id in (1, 2):
        c.tablet(server_id, tmp_path / f"t{server_id}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "two tablet servers")
    table = c.admin.create_table("db.put", SCHEMA, ["id"], 3)
    leaders = wait_until(lambda: (b := c.leaders(table.table_id)) and all(x.leader_address for x in b.values()) and b,
                         15, "every bucket led")
    down = leaders[0].leader_id
    crash(c, server_by_id(c, down))
    rows = [{"id": i, "v": f"r{i}"} for i in range(30)]
    at = ("--bootstrap", c.coordinator.address, "--retry-timeout", "300ms")
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = assert_one_line_error(run(*at, "put", "db.put", str(source)))

    with TableClient(c.admin, "db.put") as client:
        live = [(bucket, part) for bucket, part, _ in client.split(client.codec.to_batch(rows))
                if leaders[bucket].leader_id != down]
        found = [r for bucket, part in live for r in client.lookup(part.select(["id"]))]
    written = len(found)
    assert all(found) and 0 < written < 30
    assert (f"(writing lines 1-30: {written} of their 30 row(s) were written, the other {30 - written} were not; "
            f"{written} row(s) written in all)") in line, line
    assert f"tablet server {down}, is not live" in line


def test_a_failed_write_counts_the_rows_each_bucket_acknowledged_before_it_failed(cluster, tmp_path, monkeypatch):
    """A bucket's rows go in several requests (each at most MAX_REQUEST_BYTES); its third request fails (a
    fault injected on the way to the real server): the error counts the rows of its first two, and of the
    other bucket, which were written, as the rows found afterwards show."""
    from kvlease.client import table_writes as table_module

    c = cluster
    c.tablet(1, tmp_path / "t1")
    c.admin.create_table("db.chunks", SCHEMA, ["id"], 2)
    monkeypatch.setattr(table_module, "MAX_REQUEST_BYTES", 200)
    call = TableClient._call_bucket
    sent: dict[int, int] = {}

    def third_of_bucket_0_fails(self, bucket, method, request, **kwargs):
        sent[bucket] = sent.get(bucket, 0) + 1
        if method == "PutKv" and bucket == 0 and sent[bucket] == 3:
            raise errors.InvalidRequestError("injected: the third request of bucket 0 fails")
        return call(self, bucket, method, request, **kwargs)

    rows = [{"id": i, "v": "x" * 20} for i in range(40)]
    with TableClient(c.admin, "db.chunks") as client:
        parts = {bucket: part for bucket, part, _ in client.split(client.codec.to_batch(rows))}
        monkeypatch.setattr(TableClient, "_call_bucket", third_of_bucket_0_fails)
        with pytest.raises(errors.InvalidRequestError) as raised:
            client.upsert(rows)
        monkeypatch.setattr(TableClient, "_call_bucket", call)
        counted = raised.value.details["written_rows"]
        found = {b: sum(r is not None for r in client.lookup(part.select(["id"]))) for b, part in parts.items()}
    assert counted == found and counted[1] == parts[1].num_rows and 0 < counted[0] < parts[0].num_rows
    assert set(raised.value.details["written"]) == {1}  # the buckets written whole
