"""A tablet server says which buckets it cannot serve, instead of claiming them: over its capacity
(restarted with a lower ``tablet.buckets.max``), or failed to open; a failed bucket reopens by
itself once the cause is gone. In-process coordinator and tablet server on the test's ZooKeeper,
real gRPC, the health read from the tablet's real metrics endpoint."""

from __future__ import annotations

import os

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.ops.local_cluster import read_health
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]
ROWS = 60  # keys 0..59 reach each of 3 buckets


@pytest.fixture
def cluster(make_config, tmp_path):
    made: list[LocalCluster] = []

    def make(**tablet_overrides) -> LocalCluster:
        made.append(LocalCluster(make_config, tmp_path, 1, {"metrics.port": 0, **tablet_overrides}))
        return made[-1]

    yield make
    for c in made:
        c.close()


def health_of(c: LocalCluster) -> dict:
    return read_health(f"127.0.0.1:{c.tablets[1].metrics_port}")


def test_buckets_over_a_lowered_capacity_are_refused_clearly_and_reported(cluster):
    c = cluster(**{"tablet.buckets.max": 3})
    c.create_table("db.t", SCHEMA, ["id"], 3)
    with TableClient(c.admin, "db.t", retry_total_s=10) as table:
        table.upsert([{"id": i, "v": str(i)} for i in range(ROWS)])
    assert health_of(c)["healthy"]

    c.stop_tablet(1)
    c.tablet_overrides["tablet.buckets.max"] = 2  # restarted with less room than it leads
    c.start_tablet(1)
    health = wait_until(lambda: (h := health_of(c))["buckets"] == 3 and h, 30, "the push of 3 buckets")
    assert not health["healthy"] and (health["unserved"], health["capacity"]) == (3 - 2, 2)
    assert "over its capacity of 2 (tablet.buckets.max)" in health["problems"][0]
    with TableClient(c.admin, "db.t", retry_total_s=0) as table:
        served = 0
        for bucket in range(3):
            try:
                table.list_offsets([bucket])
                served += 1
            except errors.LeaderNotAvailableError as exc:
                assert f"bucket {bucket} of table" in exc.message and "capacity of 2" in exc.message
        assert served == 2


def test_a_bucket_that_cannot_open_is_reported_and_reopens_by_itself_when_fixed(cluster):
    c = cluster(**{"tablet.bucket.reopen-backoff": "100ms", "tablet.bucket.reopen-backoff.max": "200ms"})
    info = c.create_table("db.t", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "db.t", retry_total_s=10) as table:
        table.upsert([{"id": i, "v": str(i)} for i in range(ROWS)])
    c.stop_tablet(1)
    log_dir = c.base_dir / "t1" / str(info.table_id) / "0" / "log"
    os.rename(log_dir, log_dir.with_name("log.away"))
    log_dir.write_text("not a directory")  # its changelog cannot open
    c.start_tablet(1)

    health = wait_until(lambda: (h := health_of(c))["unserved"] and h, 30, "the bucket reported failed")
    assert not health["healthy"] and health["buckets"] == 1
    assert f"bucket 0 of table {info.table_id}" in health["problems"][0]
    with TableClient(c.admin, "db.t", retry_total_s=0) as table, pytest.raises(errors.KvLeaseError):
        table.lookup([1])

    log_dir.unlink()
    os.rename(log_dir.with_name("log.away"), log_dir)  # fixed: no request needed for it to come back
    wait_until(lambda: health_of(c)["healthy"], 30, "the bucket reopened by itself")
    with TableClient(c.admin, "db.t", retry_total_s=10) as table:
        assert table.lookup(list(range(ROWS))) == [{"id": i, "v": str(i)} for i in range(ROWS)]


def test_a_failed_bucket_with_a_live_scan_ends_the_session_reopens_and_the_scan_resumes(cluster, monkeypatch):
    c = cluster(**{"tablet.bucket.reopen-backoff": "300ms", "tablet.bucket.reopen-backoff.max": "300ms"})
    c.create_table("db.t", SCHEMA, ["id"], 1)
    with TableClient(c.admin, "db.t", retry_total_s=10) as table:
        table.upsert([{"id": i, "v": "x" * 200} for i in range(2000)])
        scanner = table.scanner(0, batch_size_bytes=4096, resume=True)
        seen = scanner.poll().column("id").to_pylist()  # a session holds a snapshot of the bucket now

        real_writev = os.writev

        def disk_full(fd, buffers):
            monkeypatch.setattr(os, "writev", real_writev)  # once
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "writev", disk_full)
        with pytest.raises(errors.KvLeaseError, match="No space left"):
            table.upsert([{"id": -1, "v": "refused"}])
        assert not health_of(c)["healthy"]
        wait_until(lambda: health_of(c)["healthy"], 30, "the bucket reopened, its scan session ended")
        for batch in scanner:  # the scan goes on: a new session after the key it had reached
            seen += batch.column("id").to_pylist()
        assert sorted(seen) == list(range(2000)) and scanner.resumed >= 1
        table.upsert([{"id": -1, "v": "after"}])
        assert table.lookup([-1]) == [{"id": -1, "v": "after"}]
