"""The Spark source's parts for partitioned tables without Spark or a cluster: pruning by pushed filters, offsets
keyed by partition, discovery, and every kept partition leased in one acquire (on real Spark:
tests/spark_source/test_spark_partitions.py)."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, IsNull,
                                    LessThan, Not, StringStartsWith)

from kvlease.common import errors
from kvlease.common.tables import Column, TableInfo
from kvlease.spark_source import options as opts
from kvlease.spark_source.discovery import PartitionDiscovery, follow
from kvlease.spark_source.pruning import evaluate, kept
from kvlease.spark_source.splits import ReadContext
from kvlease.spark_source.stream import StreamReader
from kvlease.spark_source.stream_offsets import LeaseRef, _offset, _parse, partition_names

pytestmark = pytest.mark.unit

EVENTS = [Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "STRING")]
PARTITIONED = TableInfo(7, "shop", "events", tuple(EVENTS), ("day", "id"), 2, partition_key=("day",))


def test_filters_on_the_partition_column_prune_and_the_others_keep_every_partition():
    parts = [(11, "20261125"), (12, "20261126"), (13, "20261127")]

    def keeps(*filters) -> list[str]:
        return sorted(kept(PARTITIONED, parts, list(filters)).values())

    day = ("day",)
    assert keeps(EqualTo(day, "20261126"), IsNotNull(day)) == ["20261126"]
    assert keeps(In(day, ["20261125", "20261127", "x"])) == ["20261125", "20261127"]
    assert keeps(GreaterThanOrEqual(day, "20261126"), LessThan(day, "20261127")) == ["20261126"]
    assert keeps(GreaterThan(day, "20261127")) == [] and keeps(IsNull(day)) == []
    assert keeps(Not(EqualTo(day, "20261125"))) == ["20261126", "20261127"]
    assert keeps(StringStartsWith(day, "2026112"), EqualNullSafe(day, None)) == []
    assert keeps(EqualTo(("DAY",), "20261125")) == ["20261125"]  # names as Spark resolves them
    # what cannot be judged on a partition's value keeps it: other columns, other types, nested fields
    everything = ["20261125", "20261126", "20261127"]
    assert keeps(EqualTo(("id",), 5), EqualTo(day, 20261125), EqualTo(("day", "x"), "a")) == everything
    assert keeps(In(day, ["20261125", None])) == everything  # IN with a null: unknown, not false
    assert evaluate(Not(EqualTo(("v",), "a")), {"day": "x"}) is None


def test_a_partitioned_tables_reader_prunes_by_pushed_filters_only_where_spark_keeps_the_plan_with_its_query(
        monkeypatch):
    """Spark 4.3 reads the plan made for one query's pushed filters again for a later query of the DataFrame
    that pushes none: a reader that pruned there would answer that query with the pruned partitions' rows."""
    from pyspark.sql.datasource import DataSourceReader

    from kvlease.spark_source import batch

    monkeypatch.setattr(batch, "PUSHDOWN_PLANS_PER_SCAN", False)
    assert batch.partitioned_reader().pushFilters is DataSourceReader.pushFilters  # Spark pushes it nothing
    monkeypatch.setattr(batch, "PUSHDOWN_PLANS_PER_SCAN", True)
    assert batch.partitioned_reader() is batch.PruningBatchReader
    reader = batch.PruningBatchReader(None, ReadContext((), PARTITIONED, None, ("id",)))
    filters = [EqualTo(("day",), "20261126"), EqualTo(("id",), 5)]
    assert reader.pushFilters(filters) == filters and reader.filters == tuple(filters)  # every one given back


def test_option_partitions_names_partitions_of_the_tables_key():
    from kvlease.spark_source.batch import canonical_names, check_partition_names
    from kvlease.spark_source.options import OptionError, parse

    assert parse({"bootstrap": "h:1", "table": "a.b", "partitions": " x , y,x"}).partitions == ("x", "y")
    two = TableInfo(9, "db", "t", (Column("region", "STRING"), Column("day", "STRING"), Column("id", "BIGINT")),
                    ("region", "day", "id"), 1, partition_key=("region", "day"))
    assert canonical_names(two, ["day=1/region=eu", "region=eu/day=1"]) == ["region=eu/day=1"]
    with pytest.raises(OptionError, match="option 'partitions': bad partition name 'eu'"):
        check_partition_names(two, ("eu",))
    with pytest.raises(OptionError, match="option 'partitions' selects partitions of a partitioned table"):
        check_partition_names(TableInfo(3, "db", "u", two.columns, ("id",), 1), ("x",))


def test_partition_values_are_typed_as_their_columns():
    table = TableInfo(8, "db", "t", (Column("region", "STRING"), Column("n", "INT"), Column("ok", "BOOLEAN"),
                                     Column("id", "BIGINT")), ("region", "n", "ok", "id"), 1,
                      partition_key=("region", "n", "ok"))
    parts = [(1, "region=eu/n=7/ok=true"), (2, "region=us/n=12/ok=false")]
    assert kept(table, parts, [GreaterThan(("n",), 9)]) == {2: "region=us/n=12/ok=false"}
    assert kept(table, parts, [EqualTo(("ok",), True), EqualTo(("region",), "eu")]) == {1: "region=eu/n=7/ok=true"}
    assert kept(table, parts, [EqualTo(("n",), True)]) == dict(parts)  # a bool is not an INT's value


def test_offsets_of_a_partitioned_table_key_buckets_by_partition_and_round_trip():
    lease = LeaseRef("L", "o")
    doc = _offset(lease, {(12, 1): (5, 40), (12, 0): (-1, 3), (13, 0): (-1, -1), (13, 1): (-1, -1)}, 7,
                  {(12, 0): 1}, {(12, 0): 2}, {12: "20261126", 13: "20261127"})
    assert doc["buckets"]["p12-0"] == {"snapshot": -1, "offset": 3, "losses": 1, "epoch": 2}
    assert doc["buckets"]["p12-1"] == {"snapshot": 5, "offset": 40} and doc["partitions"]["13"] == "20261127"
    assert json.loads(json.dumps(doc)) == doc
    assert _parse(doc) == (7, lease, {(12, 0): (-1, 3), (12, 1): (5, 40), (13, 0): (-1, -1), (13, 1): (-1, -1)})
    assert partition_names(doc) == {12: "20261126", 13: "20261127"}
    stream = StreamReader(None, ReadContext((), PARTITIONED, None, ("id",)))
    assert stream._parse(doc) == (lease, _parse(doc)[2])
    with pytest.raises(errors.InvalidRequestError, match="has buckets 0..1 in each partition"):
        stream._parse({**doc, "partitions": {"12": "20261126"}})  # partition 13's buckets, of no partition
    unpartitioned = _offset(lease, {0: (-1, 3)}, 7)  # an unpartitioned table's stay as they were
    assert unpartitioned["buckets"] == {"0": {"snapshot": -1, "offset": 3}} and "partitions" not in unpartitioned


def test_discovery_lists_at_first_then_every_interval_and_partitions_join_once_and_leave_for_good():
    class Admin:
        listed = 0

        def list_partitions(self, table_id):
            Admin.listed += 1
            return None, [type("P", (), {"partition_id": p, "name": n})() for p, n in self.now.items()]

    admin, clock = Admin(), [100.0]
    admin.now = {12: "a", 13: "b"}
    discovery = PartitionDiscovery(admin, PARTITIONED, 10_000, clock=lambda: clock[0])
    assert discovery.poll() == {12: "a", 13: "b"} and discovery.poll() is None
    assert discovery.listing() == {12: "a", 13: "b"} and Admin.listed == 2  # at a query's start: polled next
    assert discovery.poll() == {12: "a", 13: "b"} and discovery.poll() is None and Admin.listed == 2
    clock[0] += 10
    admin.now = {13: "b", 14: "c"}
    listing = discovery.poll()
    assert listing == {13: "b", 14: "c"} and Admin.listed == 3
    names, starts = follow({12: "a", 13: "b"}, {(12, 0): (-1, 9), (12, 1): (-1, 9), (13, 0): (-1, 4),
                                                (13, 1): (-1, 5)}, listing, 2)
    assert names == {13: "b", 14: "c"}
    assert starts == {(13, 0): (-1, 4), (13, 1): (-1, 5), (14, 0): (-1, -1), (14, 1): (-1, -1)}
    assert follow(names, starts, None, 2) == (names, starts)  # nothing listed: nothing changes
    assert follow(names, starts, {13: "b", 14: "c", 15: "d"}, 2, admitted={13, 14})[0] == names  # AvailableNow
    with pytest.raises(opts.OptionError, match="option 'partition.discovery.interval'"):
        opts.parse({"bootstrap": "h:1", "table": "a.b", "partition.discovery.interval": "soon"})
    assert opts.parse({"bootstrap": "h:1", "table": "a.b", "partition.discovery.interval": "2s"}
                      ).partition_discovery_interval_ms == 2000


def test_every_kept_partition_is_leased_in_one_acquire_and_a_dropped_one_is_released_apart():
    from kvlease.client.admin import AcquireResult, SnapshotInfo
    from kvlease.common.model import SnapshotHandle, TableBucket
    from kvlease.spark_source.enumerator import acquire_latest, release_buckets

    class Admin:
        def __init__(self) -> None:
            self.acquires, self.releases = [], []

        def get_latest_kv_snapshots(self, table_id):
            return {tb: SnapshotInfo(SnapshotHandle(tb, 40 + tb.bucket, 100, "")) for tb in
                    (TableBucket(7, 0, 12), TableBucket(7, 1, 12), TableBucket(7, 0, 13), TableBucket(7, 0, 14))}

        def acquire_lease(self, lease_id, snapshots, duration_ms, owner=None):
            self.acquires.append(dict(snapshots))
            return AcquireResult(lease_id, 1, dict(snapshots), {})

        def release_lease(self, lease_id, buckets, owner=None):
            self.releases.append(sorted(tb.partition_id for tb in buckets))
            if any(tb.partition_id == 13 for tb in buckets):
                raise errors.PartitionNotExistsError("partition 13 of table shop.events does not exist")

    admin = Admin()
    options = opts.parse({"bootstrap": "h:1", "table": "shop.events"})
    held = acquire_latest(admin, PARTITIONED, "L", options, owner="o", keys=[(12, 0), (12, 1), (13, 0), (13, 1)])
    assert sorted(held) == [(12, 0), (12, 1), (13, 0)]  # (13, 1) has no snapshot: read from its changelog
    assert len(admin.acquires) == 1 and len(admin.acquires[0]) == 3  # partition 14 is not a kept one
    release_buckets(admin, "L", [TableBucket(7, 0, 12), TableBucket(7, 0, 13)], "o")
    assert admin.releases == [[12, 13], [12], [13]]  # refused as a whole: then each partition on its own
