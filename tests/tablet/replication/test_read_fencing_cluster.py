"""Log reads fenced by the leader epoch, on real servers (a coordinator and tablet servers in this process, a
real ZooKeeper, real RocksDB and gRPC on loopback): after a restore or an unclean election reuses offsets, a
reader that sends the epoch of the last entry it read is refused with DATA_LOST naming the range instead of
being served the new changes; a clean leader change refuses no one."""

from __future__ import annotations

import json
import re

import pytest

from kvlease.client.log_position import LogPosition
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.tablet.replication.test_data_loss_cluster import (  # noqa: F401
    _restart_wiped, _served, cluster, lose_and_restore, one_replica_with_tail, two_in_sync)
from tests.tablet.replication.test_replicated_buckets import SCHEMA, bucket_state, crash, server_by_id

pytestmark = pytest.mark.zk


def _read_all(client: TableClient, position: LogPosition, end: int) -> tuple[list[int], LogPosition]:
    """The offsets read from ``position`` up to ``end`` with fenced fetches, and the position after them."""
    offsets: list[int] = []
    while position.offset < end:
        records, _end, position = client.fetch_log_from(0, position)
        offsets += [r["offset"] for r in records]
    return offsets, position


def test_a_reader_of_a_restored_bucket_is_refused_at_reused_offsets(cluster, tmp_path, caplog):
    """...and the tablet server logs what it judged the reader on: its leader epochs, log end and HW."""
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.one", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "db.one") as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(10)])
        assert server.replicas.snapshot_changed() == 1  # snapshot at log offset 10
        client.upsert([{"id": i, "v": f"w{i}"} for i in range(10, 15)])
        read, old = _read_all(client, LogPosition(0), 15)
        assert read == list(range(15)) and old.offset == 15 and old.epoch is not None
        assert client.end_positions() == {0: old}  # ListOffsets tells the epoch below the end
    assert server.log_ends.run_once() == 1

    lose_and_restore(c, tmp_path, table, range(20, 26))  # offsets 10..15: reused
    with TableClient(c.admin, "db.one") as client:
        with caplog.at_level("WARNING", logger="kvlease.tablet.bucket.reads"), pytest.raises(
                errors.DataLostError, match=r"bucket 0 of table db\.one: offsets 10\.\.14 this reader read"):
            client.fetch_log_from(0, old)
        refused = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
        assert refused and re.search(rf"a reader at offset 15 \(last read under leader epoch {old.epoch}\) is refused: "
                                     r"this log's leader epochs start at \[\(\d+, 10\)\], it ends at 16, high "
                                     r"watermark 16", refused[0]), refused
        with pytest.raises(errors.DataLostError, match=r"offsets 10\.\.14"):  # a retry is refused the same
            client.fetch_log_entries(0, 15, last_fetched_epoch=old.epoch)
        unfenced, _end = client.fetch_log(0, 15)  # an old client: no epoch, no check
        assert [r["offset"] for r in unfenced] == [15] and unfenced[0]["row"]["id"] == 25
        # a reader that had read only what the snapshot holds (0..9) goes on at 10: nothing it read was lost
        at_snapshot = LogPosition(10, old.epoch)
        read, new = _read_all(client, at_snapshot, 16)
        assert read == list(range(10, 16)) and new.epoch is not None and new.epoch > old.epoch
        assert client.end_positions() == {0: new}
        assert client.fetch_log_from(0, new)[0] == []  # the right epoch at the end: served, nothing new


def test_a_position_planned_inside_the_log_fences_a_reader_that_starts_there(cluster, tmp_path):
    """``positions``/``epochs_at`` (ListOffsets' epochs_at): a reader that read up to a planned offset below
    the end (a cut micro-batch end, a split's start) is fenced there after a restore reused it."""
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.cut", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "db.cut") as client:
        client.upsert([{"id": i, "v": "a"} for i in range(10)])  # offsets 0..9, one entry
        assert server.replicas.snapshot_changed() == 1  # snapshot at log offset 10
        for i in range(10, 15):  # offsets 10..14, one entry each
            client.upsert([{"id": i, "v": "b"}])
        end = client.end_positions()[0]
        at = client.epochs_at({0: [0, 5, 12, 15, 16]})
        assert at == {0: {0: None, 5: at[0][5], 12: end.epoch, 15: end.epoch, 16: None}} and at[0][5] is not None
        cut = client.positions({0: 12})
        assert cut == {0: LogPosition(12, end.epoch)} and client.positions({0: 12}) == cut  # a retry: the same
        read, position = [], LogPosition(0)
        while position.offset < 12:  # the batch before the cut read 0..11, one entry per fetch
            records, _end, position = client.fetch_log_from(0, position, max_bytes=1)
            read += [r["offset"] for r in records]
        assert read == list(range(12)) and position == cut[0]  # the planned epoch: the one read there
    assert server.log_ends.run_once() == 1

    lose_and_restore(c, tmp_path, table, range(20, 26))  # offsets 10..15: reused
    with TableClient(c.admin, "db.cut") as client:
        with pytest.raises(errors.DataLostError, match=r"bucket 0 of table db\.cut: offsets 10\.\.11 this reader read"):
            client.fetch_log_from(0, cut[0])
        restored = client.positions({0: 10})[0]
        assert restored == LogPosition(10, None)  # the restored log's start: nothing of it below
        records, _end, after = client.fetch_log_from(0, restored)
        assert [r["row"]["id"] for r in records] == list(range(20, 26)) and after.epoch > end.epoch
        assert client.positions({0: 12}) == {0: LogPosition(12, after.epoch)}  # the new history's epoch


def test_an_unclean_leader_refuses_a_reader_past_its_log_end(cluster, tmp_path):
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, "db.two")
    with TableClient(c.admin, "db.two") as client:
        client.upsert([{"id": i, "v": "a"} for i in range(8)])
    crash(c, server_by_id(c, follower))
    wait_until(lambda: bucket_state(c, table.table_id).isr == (leader,), 20, "the follower out of the ISR")
    with TableClient(c.admin, "db.two") as client:
        client.upsert([{"id": i, "v": "b"} for i in range(8, 12)])
        _read, old = _read_all(client, LogPosition(0), 12)
    server_by_id(c, leader).log_ends.run_once()
    _restart_wiped(c, leader, tmp_path / f"t{leader}")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline")
    c.tablet(follower, tmp_path / f"t{follower}")
    wait_until(lambda: len(c.admin.list_tablet_servers()) == 2, 15, "both registered")
    c.admin.elect_leader("db.two", 0, unclean=True, tablet=follower)
    with TableClient(c.admin, "db.two") as client:
        wait_until(lambda: _served(client), 20, "the new leader to serve")
        client.upsert([{"id": i, "v": "c"} for i in range(30, 36)])  # offsets 8..13 under the new epoch
        with pytest.raises(errors.DataLostError, match=r"offsets 8\.\.11 this reader read"):
            client.fetch_log_from(0, old)


def test_a_clean_leader_change_refuses_no_reader(cluster, tmp_path):
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, "db.clean")
    with TableClient(c.admin, "db.clean") as client:
        client.upsert([{"id": i, "v": "a"} for i in range(6)])
        _read, position = _read_all(client, LogPosition(0), 6)
        crash(c, server_by_id(c, leader))  # the in-sync follower takes over
        wait_until(lambda: bucket_state(c, table.table_id).leader_id == follower, 20, "the follower to lead")
        client.upsert([{"id": i, "v": "b"} for i in range(6, 9)])
        read, after = _read_all(client, position, 9)
        assert read == [6, 7, 8] and after.epoch is not None and after.epoch > position.epoch


def test_a_split_reading_while_the_bucket_is_restored_stops_at_the_reused_offsets(cluster, tmp_path, monkeypatch):
    """A Spark split's changelog read (spark_source/changelog.py, without Spark) on real servers: the bucket
    is wiped and restored, and new changes take offsets the split already read, between two of its fetches."""
    from kvlease.spark_source import changelog

    monkeypatch.setattr(changelog, "FETCH_BYTES", 1)  # one entry per fetch
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.split", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "db.split") as reader:
        for i in range(6):  # one entry per write: offsets 0..5
            reader.upsert([{"id": i, "v": "old"}])
        assert server.replicas.snapshot_changed() == 1  # at offset 6
        for i in range(6, 9):
            reader.upsert([{"id": i, "v": "old"}])
        entries = changelog.read_entries(reader, 0, 0, 9, start_epoch=None)
        read = [next(entries).base_offset for _ in range(8)]  # offsets 0..7 read, 8 not yet
        server.log_ends.run_once()
        _restart_wiped(c, 1, tmp_path / "t1")
        wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "offline")
        c.admin.restore_bucket("db.split", 0, accept_data_loss=True)
        with TableClient(c.admin, "db.split") as writer:
            wait_until(lambda: _served(writer), 20, "the restored bucket to serve")
            for i in range(20, 24):
                writer.upsert([{"id": i, "v": "new"}])  # offsets 6..9 of the restored log
        with pytest.raises(errors.DataLostError, match=r"offsets 6\.\.7 this reader read"):
            read.extend(e.base_offset for e in entries)  # the split's client goes on with the restored leader
    assert read == list(range(8))  # nothing of the restored log's offset 8 was handed on


def test_kvlease_log_from_an_offset_is_fenced_from_its_first_fetch(cluster, tmp_path, monkeypatch):
    """`kvlease log --from N` asks the epoch below N first (ListOffsets' epochs_at): a restore that reuses
    offsets below N before its first fetch fails it with DATA_LOST naming them, instead of printing the new
    changes under offsets N.. as if they followed what was below."""
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = one_replica_with_tail(c, server, "db.from")  # offsets 0..9 in the snapshot at 10, 10..14 not
    assert server.log_ends.run_once() == 1
    at = ("--bootstrap", c.coordinator.address)
    fetch = TableClient.fetch_log_from

    def lost_first(self, *args, **kwargs):  # the bucket is wiped and restored before the first fetch
        monkeypatch.setattr(TableClient, "fetch_log_from", fetch)
        lose_and_restore(c, tmp_path, table, range(20, 26))  # offsets 10..15 of the restored log
        return fetch(self, *args, **kwargs)

    monkeypatch.setattr(TableClient, "fetch_log_from", lost_first)
    refused = assert_one_line_error(run("log", "db.from", "--bucket", "0", "--from", "12", *at))
    assert re.search(r"bucket 0 of table db\.from: offsets 10\.\.11 this reader read .* not in the bucket's log", refused)
    started_after = run("log", "db.from", "--bucket", "0", "--from", "12", "--json", *at)  # the new history
    assert started_after.exit_code == 0, started_after.output
    assert [r["row"]["id"] for r in json.loads(started_after.stdout)["records"]] == [22, 23, 24, 25]
