"""Tablet servers refuse what would break a bucket, and keep serving: raw gRPC against real servers."""

from __future__ import annotations

import grpc
import pytest

from kvlease.common import errors
from kvlease.common.codec import RowCodec, batch_to_ipc, bucket_of
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.model import TableBucket
from kvlease.common.tables import Column
from kvlease.client.table import TableClient
from kvlease.ops.wait import wait_until
from tests.tablet.test_tablet_server import cluster, fetch_all, lookup, put  # noqa: F401 (fixture)

pytestmark = pytest.mark.zk

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]


def _ids_of_bucket(table, bucket, count):
    codec = RowCodec(table)
    out, i = [], 0
    while len(out) < count:
        key = codec.encode_keys(codec.to_batch([{"id": i}]).select(["id"]))[0]
        if bucket_of(key, table.buckets) == bucket:
            out.append(i)
        i += 1
    return out


def test_keys_of_another_bucket_are_refused(cluster, tmp_path):
    c = cluster()
    c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.wrong_bucket", SCHEMA, ["id"], 2)
    stub0, stub1 = c.stub(table.table_id, 0), c.stub(table.table_id, 1)
    mine, other = _ids_of_bucket(table, 0, 3), _ids_of_bucket(table, 1, 1)[0]
    put(stub0, table, [{"id": i, "v": "a"} for i in mine])
    end = fetch_all(stub0, table)[1].log_end_offset
    with pytest.raises(errors.InvalidRowError, match=rf"upsert row 2 \(key .*{other}.*\) belongs to bucket 1"):
        put(stub0, table, [{"id": mine[0], "v": "b"}, {"id": mine[1], "v": "b"}, {"id": other, "v": "x"}])
    with pytest.raises(errors.InvalidRowError, match="delete row 0 .* belongs to bucket 1"):
        put(stub0, table, delete_keys=[{"id": other}])
    with pytest.raises(errors.InvalidRowError, match="lookup row 1 .* belongs to bucket 1"):
        lookup(stub0, table, [mine[0], other])
    # nothing changed, and both buckets keep serving
    assert fetch_all(stub0, table)[1].log_end_offset == end
    assert lookup(stub0, table, mine) == [{"id": i, "v": "a"} for i in mine]
    put(stub1, table, [{"id": other, "v": "x"}], bucket=1)
    assert lookup(stub1, table, [other], bucket=1) == [{"id": other, "v": "x"}]


def test_row_over_max_row_size_is_refused_and_any_entry_can_be_fetched(cluster, tmp_path):
    c = cluster({"table.max-row-size": "40mb"})
    c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.big_rows", SCHEMA, ["id"], 1)
    c.stub(table.table_id, 0)
    big = "x" * (40 << 20)
    with TableClient(c.admin, table.table_id) as client:
        client.upsert([{"id": 1, "v": "small"}])
        with pytest.raises(errors.RecordTooLargeError, match=r"upsert row 0 \(key \{'id': 3\}\) is \d+ bytes"):
            client.upsert([{"id": 3, "v": big}])
        assert client.list_offsets([0])[0] == (0, 1)  # nothing written
        client.upsert([{"id": 1, "v": big[:39 << 20]}])
        client.upsert([{"id": 1, "v": big[:38 << 20]}])  # an update: an entry of ~77 MB, before + after
        # every entry can be read, also with a small max_bytes: one entry per answer at least
        offset, kinds = 0, []
        while offset < 5:
            entries, end = client.fetch_log_entries(0, offset, max_bytes=1 << 20)
            assert entries and end == 5
            kinds += [t for e in entries for t in e.records.column(0).to_pylist()]
            offset = entries[-1].next_offset
        assert kinds == [0, 1, 2, 1, 2]  # +I, then two updates (-U +U)
        assert len(client.lookup([1])[0]["v"]) == 38 << 20


def test_max_row_size_is_bounded_by_the_message_size():
    from kvlease.common.config import Config, ConfigError
    from kvlease.common.limits import MAX_MESSAGE_BYTES, MAX_ROW_SIZE_BOUND

    assert Config()["table.max-row-size"] == 8 << 20
    assert 2 * MAX_ROW_SIZE_BOUND < MAX_MESSAGE_BYTES
    with pytest.raises(ConfigError, match="table.max-row-size"):
        Config({"table.max-row-size": "200mb"})


def test_an_empty_open_at_the_scanner_limits_gets_its_empty_answer(cluster, tmp_path):
    from tests.tablet.scan.test_scan_server import Scan

    s = Scan(cluster({"kv.scanner.max-per-server": 1}), tmp_path, buckets=2)
    put(s.stubs[0], s.table, [{"id": i, "v": "x"} for i in _ids_of_bucket(s.table, 0, 5)], bucket=0)
    ids1 = _ids_of_bucket(s.table, 1, 2)
    put(s.stubs[1], s.table, [{"id": i, "v": "x"} for i in ids1], bucket=1)
    put(s.stubs[1], s.table, delete_keys=[{"id": i} for i in ids1], bucket=1)  # empty again, log offset 4
    held = s.open(bucket=0, size=1)
    assert held.error.code == 0 and held.has_more_results  # the one session this server allows
    assert s.open(bucket=0, size=1).error.code == errors.ErrorCode.TOO_MANY_SCANNERS  # rows to read: refused
    for answer in (s.open(bucket=1, size=1), s.open(bucket=0, size=1, limit=0),
                   s.open(bucket=0, size=1, after=b"\xff" * 16)):
        assert answer.error.code == 0, answer.error.message
        assert not answer.has_more_results and answer.scanner_id == b"" and answer.record_count == 0
        assert answer.HasField("log_offset")
    assert s.open(bucket=1, size=1).log_offset == 4
    assert s.counts()[:2] == (1, {TableBucket(s.table.table_id, 0): 1})
    assert s.close(held.scanner_id).error.code == 0


def test_a_forged_update_leadership_is_refused_and_the_real_coordinator_still_leads(cluster, tmp_path):
    c = cluster()
    tablet = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.forged", SCHEMA, ["id"], 1)
    stub = c.stub(table.table_id, 0)
    put(stub, table, [{"id": 1, "v": "a"}])
    table_dir = tmp_path / "t1" / str(table.table_id)
    for epoch in (c.coordinator.epoch + 1, 1 << 40):  # an epoch ZooKeeper does not have: refused
        forged = pb.UpdateLeadershipRequest(coordinator_epoch=epoch, server_id=1, dropped_tables=[table.table_id])
        answer = stub.UpdateLeadership(forged, timeout=10)
        assert answer.error.code == errors.ErrorCode.INVALID_REQUEST, answer
        assert "not sent by the active coordinator" in answer.error.message
    stale = pb.UpdateLeadershipRequest(coordinator_epoch=c.coordinator.epoch - 1, server_id=1)
    assert stub.UpdateLeadership(stale, timeout=10).error.code == errors.ErrorCode.COORDINATOR_FENCED
    assert table_dir.is_dir() and lookup(stub, table, [1]) == [{"id": 1, "v": "a"}]
    assert tablet.replicas.coordinator_epoch == c.coordinator.epoch
    # the real coordinator's next push is taken
    other = c.admin.create_table("db.after_forgery", SCHEMA, ["id"], 1)
    put(c.stub(other.table_id, 0), other, [{"id": 2, "v": "b"}])
    assert lookup(stub, table, [1]) == [{"id": 1, "v": "a"}]


def test_a_drop_push_for_a_live_table_keeps_its_data(cluster, tmp_path):
    c = cluster()
    tablet = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.kept", SCHEMA, ["id"], 1)
    stub = c.stub(table.table_id, 0)
    put(stub, table, [{"id": 1, "v": "a"}])
    current = tablet.replicas.coordinator_epoch
    forged = pb.UpdateLeadershipRequest(coordinator_epoch=current, server_id=1, dropped_tables=[table.table_id])
    assert stub.UpdateLeadership(forged, timeout=10).error.code == 0  # same epoch: cannot be told apart
    assert (tmp_path / "t1" / str(table.table_id)).is_dir()  # but ZooKeeper has the table: data kept
    other = c.admin.create_table("db.kept2", SCHEMA, ["id"], 1)  # the coordinator pushes the full set again
    c.stub(other.table_id, 0)
    assert lookup(c.stub(table.table_id, 0), table, [1]) == [{"id": 1, "v": "a"}]


def test_data_of_a_table_dropped_while_the_server_was_down_is_removed_at_registration(cluster, tmp_path):
    c = cluster()
    tablet = c.tablet(1, tmp_path / "t1")
    dropped = c.admin.create_table("db.dropped_while_down", SCHEMA, ["id"], 1)
    kept = c.admin.create_table("db.kept_while_down", SCHEMA, ["id"], 1)
    for t in (dropped, kept):
        put(c.stub(t.table_id, 0), t, [{"id": 1, "v": "a"}])
    tablet.stop()
    c.tablets.remove(tablet)
    c.admin.drop_table("db.dropped_while_down")
    assert (tmp_path / "t1" / str(dropped.table_id)).is_dir()
    c.tablet(1, tmp_path / "t1")
    assert not (tmp_path / "t1" / str(dropped.table_id)).exists()
    assert lookup(c.stub(kept.table_id, 0), kept, [1]) == [{"id": 1, "v": "a"}]


def test_trigger_snapshot_of_an_unknown_table_and_a_scan_of_a_dropped_table_say_so(cluster, tmp_path):
    from tests.tablet.scan.test_scan_server import Scan

    s = Scan(cluster(), tmp_path)
    put(s.stub, s.table, [{"id": i, "v": "x"} for i in range(10)])
    answer = s.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=12345, wait=True), timeout=30)
    assert answer.error.code == errors.ErrorCode.TABLE_NOT_EXIST, answer
    answer = s.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(table_id=12345, buckets=[0], wait=True), timeout=30)
    assert answer.error.code == errors.ErrorCode.TABLE_NOT_EXIST, answer
    first = s.open(size=1)
    assert first.has_more_results
    s.c.admin.drop_table(f"{s.table.database}.{s.table.name}")
    wait_until(lambda: s.counts()[0] == 0, 10, "the dropped table's scan sessions to end")
    answer = s.next(first.scanner_id, 0, size=1)
    assert answer.error.code == errors.ErrorCode.TABLE_NOT_EXIST, answer
    assert "dropped" in answer.error.message


def test_a_commit_beyond_the_buckets_log_end_is_refused(cluster, tmp_path):
    from tests.support.snapshot_manifests import commit_snapshot

    c = cluster()
    c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table("db.log_end", SCHEMA, ["id"], 1)
    stub = c.stub(table.table_id, 0)
    put(stub, table, [{"id": i, "v": "a"} for i in range(5)])
    end = fetch_all(stub, table)[1].log_end_offset
    tb = TableBucket(table.table_id, 0)
    with pytest.raises(errors.InvalidSnapshotError, match=f"log offset {end + 1} is beyond the bucket's changelog "
                                                          f"end {end}"):
        commit_snapshot(c.admin, tb, 10**15, end + 1)
    assert c.admin.get_latest_kv_snapshots(table.table_id) == {}  # nothing stored
    commit_snapshot(c.admin, tb, 7, end)  # at the end: fine (a real snapshot's manifest agrees too)
    assert c.admin.get_latest_kv_snapshots(table.table_id)[tb].snapshot_id == 7
