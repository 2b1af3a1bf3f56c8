"""Live scans against a real coordinator and tablet server: whole-table scans equal lookups, limits,
scan + changelog from log_offset under concurrent writes, early break, empty tables and bad buckets."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until



# -- integration: a real coordinator and tablet server ------------------------------------------------------

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]


@pytest.fixture
def cluster(make_config, tmp_path):  # tmp_path first: the servers stop before it is removed
    from tests.support.local_cluster import LocalCluster

    made = []

    def make(tablets: int = 1) -> LocalCluster:
        made.append(LocalCluster(make_config, tmp_path, tablets))
        return made[-1]

    yield make
    for c in made:
        c.close()


def table_client(c, name: str, buckets: int, retry_total_s: float = 20):
    from kvlease.client.table import TableClient

    c.create_table(name, SCHEMA, ["id"], buckets)  # waits until every bucket has a live leader
    return TableClient(c.admin, name, retry_total_s=retry_total_s)


def open_scanners(server) -> int:
    """Sessions open on a tablet server (its ScanService's books)."""
    service = getattr(server, "scans", None) or getattr(server, "scan_service", None)
    if service is None:
        service = next(v for v in vars(server).values() if type(v).__name__ == "ScanService")
    return service.counts()[0]


def as_dict(rows) -> dict[int, dict]:
    return {row["id"]: row for row in rows}


def test_full_table_scan_equals_lookups_of_all_keys(cluster):
    c = cluster(2)
    with table_client(c, "db.full", 4) as client:
        client.upsert([{"id": i, "v": f"v{i}" * (i % 7)} for i in range(3000)])
        client.delete(list(range(0, 3000, 10)))
        client.upsert([{"id": i, "v": "updated"} for i in range(5, 3000, 50)])
        looked_up = [r for r in client.lookup(list(range(3000))) if r is not None]
        for streaming in (False, True):
            result = client.scan(streaming=streaming, batch_size_bytes=2000)  # many batches per bucket
            assert sorted(result.rows, key=lambda r: r["id"]) == looked_up
            assert result.num_rows == 2700 and len(result.batches) > 8 and result.one_snapshot
            ends = {b: latest for b, (_, latest) in client.list_offsets().items()}
            assert result.log_offsets == ends  # nothing was written since
        # one bucket, and the table's schema on every batch
        bucket_rows = client.scan(buckets=[2]).rows
        assert bucket_rows and all(client.split(client.codec.to_batch([r]))[0][0] == 2 for r in bucket_rows)
        assert all(b.schema == client.codec.schema for b in client.scan().batches)
        assert sum(open_scanners(t) for t in c.tablets.values()) == 0


def test_limit_over_the_table_and_per_bucket(cluster):
    c = cluster()
    with table_client(c, "db.limit", 3) as client:
        client.upsert([{"id": i, "v": "x"} for i in range(600)])
        result = client.scan(limit=250, batch_size_bytes=500)
        assert result.num_rows == 250 and len({r["id"] for r in result.rows}) == 250
        assert list(result.log_offsets)[0] == 0  # buckets in order, the last ones maybe not reached
        with client.scanner(1, limit=7, batch_size_bytes=30) as s:
            assert sum(b.num_rows for b in s) == 7
        empty = client.scan(limit=1, buckets=[0])
        assert empty.num_rows == 1
        assert open_scanners(c.tablets[1]) == 0


def test_log_offsets_plus_changelog_reach_the_current_state_under_concurrent_writes(cluster):
    from kvlease.client.table import TableClient

    c = cluster()
    with table_client(c, "db.live", 3) as client, TableClient(c.admin, "db.live") as writer:
        client.upsert([{"id": i, "v": "initial"} for i in range(2000)])
        stop, written = threading.Event(), [0]

        def write() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                writer.upsert([{"id": (n * 7 + k) % 2500, "v": f"w{n}"} for k in range(20)])
                writer.delete([(n * 13) % 2000])
                written[0] = n

        def more_writes(at_least: int) -> None:
            done = written[0]
            wait_until(lambda: written[0] >= done + at_least, 10, f"{at_least} more writes", interval_s=0.005)

        thread = threading.Thread(target=write)
        thread.start()
        try:
            more_writes(2)
            # small batches, each taken after one more write: the writes interleave with the scan
            result = client.scan(batch_size_bytes=400, on_batch=lambda bucket, batch: more_writes(1))
            more_writes(2)
        finally:
            stop.set()
            thread.join()
        assert written[0] > 5
        state = as_dict(result.rows)
        for bucket, offset in result.log_offsets.items():
            end = client.list_offsets([bucket])[bucket][1]
            assert offset < end  # writes went on during and after the scan
            while offset < end:
                records, _ = client.fetch_log(bucket, offset)
                for record in records:
                    if record["change_type"] in ("+I", "+U"):
                        state[record["row"]["id"]] = record["row"]
                    elif record["change_type"] == "-D":
                        state.pop(record["row"]["id"], None)
                offset = records[-1]["offset"] + 1
        current = [r for r in client.lookup(list(range(2500))) if r is not None]
        assert sorted(state.values(), key=lambda r: r["id"]) == current


def test_early_break_closes_the_server_session(cluster):
    c = cluster()  # kv.scanner.max-per-bucket: 8 (the default)
    server = c.tablets[1]
    with table_client(c, "db.close", 1, retry_total_s=0.5) as client:
        client.upsert([{"id": i, "v": "y" * 50} for i in range(2000)])
        for i in range(20):
            streaming = i % 2 == 1
            for _ in client.scanner(0, batch_size_bytes=1000, streaming=streaming):
                assert open_scanners(server) == 1
                break
            if streaming:  # its close is a cancel: the server frees the session when gRPC delivers it
                wait_until(lambda: open_scanners(server) == 0, 5, "the stream's session to end")
            else:  # a unary close returns once the server has freed the session
                assert open_scanners(server) == 0
        # a scanner dropped without close: __del__ closes it
        s = client.scanner(0, batch_size_bytes=1000)
        s.poll()
        assert open_scanners(server) == 1
        del s
        gc.collect()
        wait_until(lambda: open_scanners(server) == 0, 5, "__del__'s close")
        # none leaked: the per-bucket limit of 8 is all there
        held = [client.scanner(0, batch_size_bytes=1000).open() for _ in range(8)]
        assert open_scanners(server) == 8
        with pytest.raises(errors.TooManyScannersError):
            client.scanner(0, batch_size_bytes=1000).poll()
        for s in held:
            s.close()
        assert open_scanners(server) == 0


def test_scan_of_an_empty_table_and_a_bad_bucket(cluster):
    c = cluster()
    server = c.tablets[1]
    with table_client(c, "db.empty", 2) as client:
        result = client.scan()
        assert result.rows == [] and result.log_offsets == {0: 0, 1: 0}
        assert client.scan(streaming=True).log_offsets == {0: 0, 1: 0}
        with pytest.raises(errors.BucketOutOfRangeError):
            client.scan(buckets=[2])
        with pytest.raises(errors.BucketOutOfRangeError):
            client.scanner(5)
        assert open_scanners(server) == 0
