"""The table client against a real coordinator and real tablet servers in-process on ZooKeeper,
over real gRPC on loopback: round trips, bad rows, the changelog, and leaders that stop and restart."""

from __future__ import annotations

import threading
import time

import grpc
import pyarrow as pa
import pytest

from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.common.tables import Column
from kvlease.client.table import TableClient
from kvlease.common.codec import batch_to_ipc
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster



# -- zk: a real coordinator and real tablet servers in-process -------------------------------------------


@pytest.fixture
def local_cluster(make_config, tmp_path):
    clusters = []

    def make(tablets: int = 2, tablet_overrides: dict | None = None) -> LocalCluster:
        clusters.append(LocalCluster(make_config, tmp_path, tablets, tablet_overrides))
        return clusters[-1]

    yield make
    for cluster in clusters:
        cluster.close()


ROWS_COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


def test_round_trip_over_several_buckets(local_cluster):
    cluster = local_cluster(2)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 6)
    with TableClient(cluster.admin, "db.t") as client:
        assert len(set(client.leaders().values())) == 2
        written = client.upsert([{"id": i, "v": f"v{i}"} for i in range(2000)])
        assert sorted(written) == list(range(6))
        assert sum(end - base for base, end in written.values()) == 2000  # one +I each
        rows = client.lookup(list(range(-5, 2005)))
        assert rows[:5] == [None] * 5 and rows[-5:] == [None] * 5
        assert rows[5:2005] == [{"id": i, "v": f"v{i}"} for i in range(2000)]
        client.upsert(pa.record_batch({"v": pa.array(["new"] * 10), "id": pa.array(range(10), pa.int64())}))
        deleted = client.delete(list(range(5, 15)) + [99999])
        assert sum(end - base for base, end in deleted.values()) == 10
        assert client.lookup([0, 4, 5, 14, 15]) == [{"id": 0, "v": "new"}, {"id": 4, "v": "new"}, None, None,
                                                    {"id": 15, "v": "v15"}]
        offsets = client.list_offsets()
        assert sorted(offsets) == list(range(6)) and all(earliest == 0 for earliest, _ in offsets.values())
        assert sum(latest for _, latest in offsets.values()) == 2000 + 2 * 10 + 10
        committed = client.trigger_snapshot(wait=True)
        assert [s.bucket for s in committed] == list(range(6))
        assert all(s.log_offset == offsets[s.bucket][1] for s in committed)
        listed = {(s.bucket.bucket, s.snapshot_id) for s in cluster.admin.list_kv_snapshots(client.table.table_id)}
        assert {(s.bucket, s.snapshot_id) for s in committed} <= listed
        assert client.trigger_snapshot(wait=True) == []  # nothing changed since


def test_bad_rows_are_rejected_by_the_client_and_by_the_server(local_cluster):
    cluster = local_cluster(1)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 2)
    with TableClient(cluster.admin, "db.t") as client:
        client.upsert([{"id": 1, "v": "one"}])
        before = client.list_offsets()
        with pytest.raises(errors.InvalidRowError, match=r"row 1, column 'id': expected BIGINT"):
            client.upsert([{"id": 2, "v": "two"}, {"id": "3", "v": "three"}])
        # the same kinds of bad batch, sent straight to the server
        address = client.leaders()[0]
        bad_batches = [
            pa.record_batch({"id": pa.array([2, 3], pa.int32()), "v": pa.array(["a", "b"])}),  # wrong type
            pa.record_batch({"id": pa.array([2, None], pa.int64()), "v": pa.array(["a", "b"])}),  # null key
            pa.record_batch({"id": pa.array([2], pa.int64()), "zzz": pa.array(["a"])}),  # unknown column
        ]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.TabletServiceStub(channel)
            for batch in bad_batches:
                response = stub.PutKv(pb.PutKvRequest(table_id=client.table.table_id, bucket=0,
                                                      upserts=batch_to_ipc(batch)), timeout=10)
                assert response.error.code == errors.ErrorCode.INVALID_ROW, response
            response = stub.PutKv(pb.PutKvRequest(table_id=client.table.table_id, bucket=0, upserts=b"not arrow"),
                                  timeout=10)
            assert response.error.code == errors.ErrorCode.INVALID_ROW
        assert client.list_offsets() == before
        assert client.lookup([1, 2, 3]) == [{"id": 1, "v": "one"}, None, None]


def test_fetch_log_shows_every_change_with_before_images(local_cluster):
    cluster = local_cluster(1)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 1)
    with TableClient(cluster.admin, "db.t") as client:
        assert client.fetch_log(0, 0) == ([], 0)
        before = time.time_ns() // 1_000_000
        client.upsert([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
        client.upsert([{"id": 1, "v": "A"}])
        client.delete([2, 3])
        after = time.time_ns() // 1_000_000
        records, end = client.fetch_log(0, 0)
        assert end == 5
        assert [{k: v for k, v in r.items() if k != "timestamp"} for r in records] == [
            {"offset": 0, "change_type": "+I", "row": {"id": 1, "v": "a"}},
            {"offset": 1, "change_type": "+I", "row": {"id": 2, "v": "b"}},
            {"offset": 2, "change_type": "-U", "row": {"id": 1, "v": "a"}},
            {"offset": 3, "change_type": "+U", "row": {"id": 1, "v": "A"}},
            {"offset": 4, "change_type": "-D", "row": {"id": 2, "v": "b"}},
        ]
        # every record has its entry's append time (one entry per write), never going backwards
        stamps = [r["timestamp"] for r in records]
        assert before <= stamps[0] == stamps[1] <= stamps[2] == stamps[3] <= stamps[4] <= after
        assert client.fetch_log(0, 3)[0] == records[3:]  # from the middle of an entry
        first, _ = client.fetch_log(0, 0, max_bytes=1)  # at least one entry, however small max_bytes
        assert first and first[0]["offset"] == 0
        assert client.fetch_log(0, 5) == ([], 5)
        batch, _ = client.fetch_log_batch(0, 2)
        assert batch.schema.names == ["offset", "change_type", "timestamp", "id", "v"]
        assert batch.schema.field("timestamp").type == pa.int64()
        assert batch.column("timestamp").to_pylist() == stamps[2:]
        assert client.list_offsets() == {0: (0, 5)}
        with pytest.raises(errors.InvalidRequestError):
            client.fetch_log(0, 99)


def test_a_stopped_leader_is_a_typed_error_and_a_restarted_one_serves_again(local_cluster):
    cluster = local_cluster(2)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 4)
    with TableClient(cluster.admin, "db.t", retry_total_s=1.5) as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(400)])
        _, leaders = cluster.admin.get_table_assignment(client.table.table_id)
        on_1 = {b for b, leader in leaders.items() if leader.leader_id == 1}
        assert on_1 and len(on_1) < 4
        keys_on_1 = [i for i in range(400) if client.split(client.key_batch([i]))[0][0] in on_1]
        keys_elsewhere = [i for i in range(400) if i not in set(keys_on_1)]
        old_address = cluster.tablets[1].address

        cluster.stop_tablet(1)
        start = time.monotonic()
        with pytest.raises(errors.LeaderNotAvailableError):
            client.lookup(keys_on_1[:3])
        assert time.monotonic() - start < 10
        with pytest.raises(errors.LeaderNotAvailableError):
            client.upsert([{"id": keys_on_1[0], "v": "lost?"}])
        assert client.lookup(keys_elsewhere[:3]) == [{"id": i, "v": f"v{i}"} for i in keys_elsewhere[:3]]

        cluster.start_tablet(1)  # same data dir, a new port: the client finds it by refreshing
        assert cluster.tablets[1].address != old_address
        rows = client.lookup(list(range(400)))
        assert rows == [{"id": i, "v": f"v{i}"} for i in range(400)]
        client.upsert([{"id": keys_on_1[0], "v": "back"}])
        assert client.lookup([keys_on_1[0]]) == [{"id": keys_on_1[0], "v": "back"}]


def test_a_request_waits_out_a_restart_within_its_budget(local_cluster):
    cluster = local_cluster(1)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 2)
    with TableClient(cluster.admin, "db.t", retry_total_s=30) as client:
        client.upsert([{"id": 1, "v": "x"}])
        cluster.stop_tablet(1)
        retries, backoff = [], client.retry.sleep
        client.retry = client.retry.but(sleep=lambda s: (retries.append(s), backoff(s)))
        result = {}
        thread = threading.Thread(target=lambda: result.update(rows=client.lookup([1, 2])))
        thread.start()
        wait_until(lambda: len(retries) >= 2, 10, "the lookup retried twice")
        assert thread.is_alive()  # still retrying
        cluster.start_tablet(1)
        thread.join(30)
        assert result["rows"] == [{"id": 1, "v": "x"}, None]


def first_at_or_after(records: list[dict], timestamp: int, end: int) -> int:
    """By brute force: the offset of the first record appended at or after ``timestamp``, else ``end``."""
    return next((r["offset"] for r in records if r["timestamp"] >= timestamp), end)


def test_list_offsets_by_timestamp_over_segments_and_after_retention(local_cluster):
    cluster = local_cluster(1, {"log.segment.bytes": "4kb", "log.retention": "0ms"})
    table = cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 2)
    with TableClient(cluster.admin, "db.t") as client:
        assert client.list_offsets(timestamp=0) == {0: 0, 1: 0}  # empty buckets: their end
        for i in range(40):
            client.upsert([{"id": i * 10 + j, "v": "x" * 40} for j in range(10)])  # an entry in each bucket
            time.sleep(0.003)  # most entries get a time of their own; equal times are checked too
        stores = {b: cluster.tablets[1].replicas.get(table.table_id, b).store for b in (0, 1)}
        assert all(len(store.log_segments()) >= 3 for store in stores.values())
        records, ends = {}, {}
        for b in (0, 1):
            records[b], ends[b] = client.fetch_log(b, 0, max_bytes=1 << 30)
            assert len(records[b]) == ends[b] > 0

        def check(kept):
            times = sorted({r["timestamp"] for b in (0, 1) for r in records[b]})
            probes = sorted({0, times[-1] + 1, *times, *(t - 1 for t in times), *(t + 1 for t in times)})
            for t in probes:
                expected = {b: first_at_or_after([r for r in records[b] if r["offset"] >= kept[b]], t, ends[b])
                            for b in (0, 1)}
                assert client.list_offsets(timestamp=t) == expected, t
            assert client.list_offsets([1], timestamp=times[-1] + 1) == {1: ends[1]}  # after all: the end

        check({0: 0, 1: 0})
        middle = records[0][len(records[0]) // 2]  # exactly an entry's time: the first record of that time
        assert client.list_offsets([0], timestamp=middle["timestamp"]) == {
            0: next(r["offset"] for r in records[0] if r["timestamp"] == middle["timestamp"])}

        client.trigger_snapshot(wait=True)  # retention (log.retention 0ms) then deletes all but the active segment
        kept = {b: earliest for b, (earliest, _) in client.list_offsets().items()}
        assert all(kept[b] > 0 for b in (0, 1))
        assert client.list_offsets(timestamp=0) == kept  # before everything kept: the earliest kept offset
        assert client.list_offsets([0], timestamp=records[0][0]["timestamp"]) == {0: kept[0]}
        check(kept)


def test_list_offsets_refuses_a_negative_timestamp_on_the_server_too(local_cluster):
    cluster = local_cluster(1)
    table = cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 1)
    with TableClient(cluster.admin, "db.t") as client:
        with pytest.raises(errors.InvalidRequestError, match="timestamp"):
            client.list_offsets(timestamp=-1)
    channel = grpc.insecure_channel(cluster.tablets[1].address)
    try:
        stub = pb_grpc.TabletServiceStub(channel)
        response = stub.ListOffsets(pb.ListOffsetsRequest(table_id=table.table_id, buckets=[0], timestamp=-5),
                                    timeout=10)
        assert response.error.code == errors.ErrorCode.INVALID_REQUEST and "timestamp" in response.error.message
        response = stub.ListOffsets(pb.ListOffsetsRequest(table_id=table.table_id, buckets=[0]), timeout=10)
        assert not response.offsets[0].HasField("timestamp_offset")  # only asked for with a timestamp
    finally:
        channel.close()


def test_bad_calls_a_qa_walkthrough_made_are_typed_errors_at_once(local_cluster):
    """Each of these was a 29 s retry, a wrong answer or a client that went on working after close."""
    cluster = local_cluster(1)
    cluster.create_table("db.t", ROWS_COLUMNS, ["id"], 1)
    client = TableClient(cluster.admin, "db.t")
    client.upsert([{"id": 1, "v": "one"}])
    for call in (lambda: client.fetch_log(1, 0), lambda: client.fetch_log(-1, 0),
                 lambda: client.fetch_log_entries(3, 0)):
        started = time.monotonic()
        with pytest.raises(errors.BucketOutOfRangeError, match="table db.t has buckets 0..0"):
            call()
        assert time.monotonic() - started < 2  # not the "no leader" of a bucket that does not exist, retried
    with pytest.raises(errors.InvalidRequestError, match="fetch_log: bad argument: Value out of range"):
        client.fetch_log(0, 2**63)
    with pytest.raises(errors.InvalidRequestError, match="list_offsets: bad argument"):
        client.list_offsets(timestamp=2**63)
    with pytest.raises(errors.InvalidScanRequestError, match="limit must be an int >= 0, got -5"):
        client.scan(limit=-5)
    assert client.scan(limit=0).num_rows == 0
    client.close()
    client.close()
    for call in (lambda: client.lookup([1]), lambda: client.upsert([{"id": 2, "v": "two"}]), client.scan,
                 lambda: client.scanner(0)):
        with pytest.raises(errors.InvalidRequestError, match="this TableClient of db.t is closed"):
            call()
    assert cluster.admin.list_tables()[0].path == "db.t"  # the admin client it shared is still open
