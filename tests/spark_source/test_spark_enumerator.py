"""The source's driver and executor halves without Spark, against a real cluster: leasing with bounded
retry when snapshots are subsumed between "get" and "acquire", and splits whose snapshot is gone."""

from __future__ import annotations

import dataclasses
import time

import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common.config import CLIENT_RETRY_TOTAL
from kvlease.spark_source import bootstrap, options as opts
from kvlease.spark_source.bootstrap import SnapshotGoneError
from kvlease.spark_source.enumerator import SnapshotUnavailableError, acquire_latest, plan_bootstrap
from kvlease.spark_source.reader import read_split
from kvlease.spark_source.splits import HybridSplit, ReadContext
from tests.support.local_cluster import LocalCluster
from tests.support.spark_tables import ALL_TYPES, row


class StaleAdmin(AdminClient):
    """Answers "latest snapshots" from an old view ``stale`` times (forever with None), then truthfully."""

    def __init__(self, bootstrap, old, stale: int | None) -> None:
        super().__init__(bootstrap)
        self.old, self.stale, self.asked = old, stale, 0

    def get_latest_kv_snapshots(self, table_id):
        self.asked += 1
        if self.stale is None or self.asked <= self.stale:
            return self.old
        return super().get_latest_kv_snapshots(table_id)


@pytest.fixture
def cluster(make_config, tmp_path):
    one_kept = lambda overrides=None, /, **more: make_config({"kv.snapshot.num-retained": 1, **(overrides or {})},
                                                              **more)
    c = LocalCluster(one_kept, tmp_path, 1)
    try:
        yield c
    finally:
        c.close()


def subsumed_view(cluster: LocalCluster, client: TableClient):
    """The latest snapshots as they were before every bucket got a newer one (the old ones are deleted)."""
    client.upsert([row(i) for i in range(40)])
    client.trigger_snapshot()
    old = cluster.admin.get_latest_kv_snapshots(client.table.table_id)
    client.upsert([row(i, 1) for i in range(40)])
    client.trigger_snapshot()
    new = cluster.admin.get_latest_kv_snapshots(client.table.table_id)
    assert all(new[tb].snapshot_id != old[tb].snapshot_id for tb in old)
    return old, new


def options(**more) -> opts.Options:
    return opts.parse({"bootstrap": "127.0.0.1:1", "table": "shop.orders",
                       **{k.replace("_", ".").replace("max.", "max-"): v for k, v in more.items()}})


def test_a_snapshot_subsumed_between_get_and_acquire_is_retried(cluster):
    cluster.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with TableClient(cluster.admin, "shop.orders") as client:
        old, new = subsumed_view(cluster, client)
        naps = []
        with StaleAdmin([cluster.coordinator.address], old, stale=2) as admin:
            held = acquire_latest(admin, client.table, "L1", options(lease_acquire_max_attempts="5"),
                                  owner="o1", sleep=naps.append)
        assert {b: info.snapshot_id for b, info in held.items()} == {tb.bucket: s.snapshot_id for tb, s in new.items()}
        assert len(naps) == 2 and all(0 < n <= 30 for n in naps)
        assert dict(cluster.admin.describe_lease("L1").buckets) == {tb: s.snapshot_id for tb, s in new.items()}


def test_a_snapshot_that_never_becomes_available_fails_clearly_within_the_bound(cluster):
    cluster.create_table("shop.orders", ALL_TYPES, ["id"], 2)
    with TableClient(cluster.admin, "shop.orders") as client:
        old, _ = subsumed_view(cluster, client)
        with StaleAdmin([cluster.coordinator.address], old, stale=None) as admin:
            started = time.monotonic()
            with pytest.raises(SnapshotUnavailableError) as info:
                acquire_latest(admin, client.table, "L2", options(lease_acquire_max_attempts="1000",
                                                                  lease_acquire_max_wait="1s"), owner="o2")
            elapsed = time.monotonic() - started
            assert 1 < admin.asked < 1000
        assert elapsed < 5
        message = str(info.value)
        assert "table shop.orders" in message and "bucket(s) 0, 1" in message and "L2" in message
        assert "lease.acquire.max-attempts" in message

        with StaleAdmin([cluster.coordinator.address], old, stale=None) as admin:
            with pytest.raises(SnapshotUnavailableError, match=r"after 3 attempt"):
                acquire_latest(admin, client.table, "L3", options(lease_acquire_max_attempts="3"), owner="o3",
                               sleep=lambda s: None)
            assert admin.asked == 3


def test_a_split_read_after_its_snapshot_was_released_and_reclaimed_fails_clearly(cluster):
    cluster.create_table("shop.orders", ALL_TYPES, ["id"], 1)
    with TableClient(cluster.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(30)])
        client.trigger_snapshot()
        storage = cluster.admin.coordinator_info().remote_storage()
        ctx = ReadContext((cluster.coordinator.address,), client.table, storage, ("id",))
        (split,) = plan_bootstrap(cluster.admin, client, options(), "L4", owner="o4", release=True)
        assert isinstance(split, HybridSplit)
        first = sum(b.num_rows for b in read_split(ctx, split))
        assert first == 30
        assert cluster.admin.list_leases() == []  # released once read

        client.upsert([row(i, 1) for i in range(30)])
        client.trigger_snapshot()  # the released snapshot is subsumed and deleted

        with pytest.raises(SnapshotGoneError, match=r"lease L4.*snapshot \d+ that this read was planned on is no "
                                                    r"longer kept.*load\(\) the DataFrame again"):
            list(read_split(ctx, split))
        assert cluster.admin.list_leases() == []  # it took nothing back


def test_a_split_leaves_no_temp_dir_after_success_failure_or_an_early_stop(cluster, tmp_path, monkeypatch):
    local = tmp_path / "spark-local"
    local.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(local))
    monkeypatch.setattr(bootstrap, "CHUNK_ROWS", 1000)  # several chunks in 3000 rows (not 70,000: 25 s less)
    cluster.create_table("shop.orders", ALL_TYPES, ["id"], 1)
    with TableClient(cluster.admin, "shop.orders") as client:
        client.upsert([row(i) for i in range(3000)])  # more than one chunk of snapshot rows
        client.trigger_snapshot()
        client.upsert([row(i, 1) for i in range(10)])
        storage = cluster.admin.coordinator_info().remote_storage()
        ctx = ReadContext((cluster.coordinator.address,), client.table, storage, ("id", "_log_offset"))
        (split,) = plan_bootstrap(cluster.admin, client, options(), "L5", owner="o5", release=False)

        seen_dirs = []
        batches = read_split(ctx, split)
        first = next(batches)
        seen_dirs.append([p.name for p in local.iterdir()])
        batches.close()  # Spark stopped reading early (a LIMIT)
        assert first.schema.names == ["id", "_log_offset"] and first.num_rows
        assert seen_dirs[0] and seen_dirs[0][0].startswith("kvlease-split-") and list(local.iterdir()) == []

        read = [b.num_rows for b in read_split(ctx, split)]
        assert sum(read) == 3000 and len(read) > 1  # it stopped above in the first of several chunks
        assert list(local.iterdir()) == []

        beyond = HybridSplit(split.bucket, split.snapshot_id, split.end + 100, "L5", release=False)
        waits_2s = dataclasses.replace(ctx, security=((CLIENT_RETRY_TOTAL.name, "2s"),))  # option retry.timeout
        with pytest.raises(Exception, match="changelog ends at"):  # once the records did not come within 2 s
            list(read_split(waits_2s, beyond))
        assert list(local.iterdir()) == []
