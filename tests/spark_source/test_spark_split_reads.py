"""The readers' parts that Spark calls, run in-process against a real cluster (no Spark job): a split read
again holds its snapshot, a missing snapshot file is told apart from a reclaimed snapshot, a dropped table is
named, the table client retries as the options say."""

from __future__ import annotations

import pytest

from kvlease.client.table import TableClient
from kvlease.common.model import TableBucket
from kvlease.ops.wait import wait_until
from kvlease.spark_source import options as opts
from kvlease.spark_source.bootstrap import SnapshotFileMissingError
from kvlease.spark_source.enumerator import plan_bootstrap
from kvlease.spark_source.reader import read_split
from kvlease.spark_source.schema import table_schema
from kvlease.spark_source.splits import HybridSplit, ReadContext
from tests.support.spark_tables import kv, row, seed  # noqa: F401  (kv is a fixture)


def plan(kv, lease_id: str) -> tuple[ReadContext, list]:
    """A full read's context and splits, planned (and leased) as the driver plans them."""
    options = opts.parse({"bootstrap": kv.coordinator.address, "table": "shop.orders"})
    info = kv.admin.get_table("shop.orders")
    storage = kv.admin.coordinator_info(kv.admin.address).remote_storage()
    columns = tuple(f.name for f in table_schema(info, with_changes=True).fields)
    with TableClient(kv.admin, info.table_id) as table:
        splits = plan_bootstrap(kv.admin, table, options, lease_id, owner=f"{lease_id}-owner", release=True)
    return ReadContext(options.bootstrap, info, storage, columns), splits


def ids(batches) -> list:
    return sorted(i for b in batches for i in b.column("id").to_pylist())


def test_a_split_read_again_takes_its_snapshot_back_for_the_read(kv):
    """Spark reads a DataFrame's plan again for each later query on it; the first read gave the bucket back."""
    seed(kv, 1, 50)
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([row(i, 1) for i in range(50, 60)])
    ctx, (split,) = plan(kv, "plan-1")
    assert isinstance(split, HybridSplit)
    first = ids(read_split(ctx, split))
    assert kv.admin.list_leases() == []  # read, so given back

    again = read_split(ctx, split)
    batch = next(again)  # while the split reads, its lease holds the snapshot it was planned on
    held = kv.admin.describe_lease("plan-1").buckets
    assert held == {TableBucket(ctx.table.table_id, 0): split.snapshot_id}
    assert ids([batch, *again]) == first == list(range(60))
    assert kv.admin.list_leases() == []


def test_a_missing_file_of_a_held_snapshot_is_named_not_blamed_on_the_lease(kv):
    seed(kv, 1, 20)
    ctx, (split,) = plan(kv, "plan-3")
    prefix = f"kv/{ctx.table.table_id}/"
    sst = next(p for p in ctx.storage.list(prefix) if p.endswith(".sst"))
    ctx.storage.delete(sst)
    with pytest.raises(SnapshotFileMissingError, match=f"is held by the read's lease, but its file .*{sst} is "
                                                       "missing from remote storage"):
        list(read_split(ctx, split))
    assert kv.admin.list_leases() == []  # a split that failed gave its bucket back (a retry takes it again)


def test_a_split_stopped_early_gives_its_bucket_back(kv, monkeypatch):
    """Spark stops reading a split once a LIMIT has its rows."""
    from kvlease.spark_source import bootstrap

    monkeypatch.setattr(bootstrap, "CHUNK_ROWS", 100)  # several batches from a small snapshot
    seed(kv, 1, 300)
    ctx, (split,) = plan(kv, "plan-6")
    rows = read_split(ctx, split)
    assert next(rows).num_rows == 100
    rows.close()
    assert kv.admin.list_leases() == []


def test_tablet_calls_retry_as_long_as_the_retry_timeout_option_says(kv):
    """Driver and executors alike open their table client through the options' settings."""
    from kvlease.spark_source.options import connect, open_table

    seed(kv, 1, 1)
    info = kv.admin.get_table("shop.orders")
    for given, expected in (({"retry.timeout": "2s"}, 2.0), ({"retry.timeout": "3m"}, 180.0)):
        security = opts.parse({"bootstrap": kv.coordinator.address, "table": "shop.orders", **given}).security
        with connect((kv.coordinator.address,), security) as admin, open_table(admin, info.table_id, security) as t:
            assert t.retry.total_s == admin.retry.total_s == expected


def test_a_table_dropped_under_a_stream_is_named_by_its_name(kv):
    from kvlease.spark_source.stream import StreamReader

    seed(kv, 2, 20)
    options = opts.parse({"bootstrap": kv.coordinator.address, "table": "shop.orders", "startup.mode": "earliest"})
    ctx, _ = plan(kv, "plan-5")
    kv.admin.drop_lease("plan-5")
    stream = StreamReader(options, ctx)
    try:
        start = stream.initialOffset()
        end = stream.latestOffset(start, None)
        kv.admin.drop_table("shop.orders")
        wait_until(lambda: all(t.replicas.table(ctx.table.table_id) is None for t in kv.tablets.values()), 30,
                   "the tablet servers dropped the table")
        with pytest.raises(Exception, match=f"table shop.orders \\(id {ctx.table.table_id}\\) no longer exists"):
            stream.latestOffset(end, None)
    finally:
        stream.stop()
