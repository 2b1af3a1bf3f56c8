"""Partitioned tables through the Spark source (docs/spark.md, "Partitioned tables"): pruning by the filters
Spark pushes before anything is leased, one lease over every kept partition, a stream that finds new
partitions and outlives dropped ones, and writes that create partitions; then the pure parts (pruning,
offset keys, discovery) without Spark."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, IsNull,
                                    LessThan, Not, StringStartsWith)

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.auto_partition import AutoPartition, TimeUnit, value_at
from kvlease.common.tables import Column, TableInfo
from kvlease.ops.wait import NotReached, wait_until
from kvlease.spark_source import options as opts
from kvlease.spark_source.discovery import PartitionDiscovery, follow
from kvlease.spark_source.pruning import evaluate, kept
from kvlease.spark_source.splits import ReadContext
from kvlease.spark_source.stream import StreamReader
from kvlease.spark_source.stream_offsets import LeaseRef, _offset, _parse, partition_names
from tests.support.local_cluster import LocalCluster

EVENTS = [Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "STRING")]
DAYS = ("20261125", "20261126", "20261127")


@pytest.fixture
def kv(make_config, tmp_path):
    """A cluster whose coordinator checks auto-partitioned tables every 200 ms (SECOND partitions)."""
    fast = lambda overrides=None, /, **more: make_config(  # noqa: E731
        {"auto-partition.check-interval": "200ms", "kv.snapshot.lease.expiration-check-interval": "200ms",
         **(overrides or {})}, **more)
    cluster = LocalCluster(fast, tmp_path, 2)
    try:
        yield cluster
    finally:
        cluster.close()


def read(spark, kv, table: str = "shop.events", **options):
    reader = spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table)
    for key, value in options.items():
        reader = reader.option(key.replace("_", "."), value)
    return reader.load()


def rows(df) -> dict:
    return {(r["day"], r["id"]): r["v"] for r in df.select("day", "id", "v").collect()}


def events(kv) -> dict:
    """shop.events: three day partitions of 2 buckets; two snapshotted, then changed; the third changelog only."""
    kv.admin.create_table("shop.events", EVENTS, ["day", "id"], 2, partition_key=["day"])
    state = {(d, i): f"{d}-{i}" for d in DAYS for i in range(30)}
    with TableClient(kv.admin, "shop.events") as client:
        client.upsert([{"day": d, "id": i, "v": v} for (d, i), v in state.items()])
        for day in DAYS[:2]:
            with TableClient(kv.admin, "shop.events", partition=day) as partition:
                assert partition.trigger_snapshot()
        client.upsert([{"day": d, "id": i, "v": "late"} for d in DAYS for i in (1, 40)])
        client.delete([{"day": d, "id": 2} for d in DAYS])
    state.update({(d, i): "late" for d in DAYS for i in (1, 40)})
    for d in DAYS:
        del state[(d, 2)]
    return state


def planned(kv, df, lease_id: str) -> tuple[int, set[str]]:
    """``(splits, partitions leased)`` of ``df``'s plan: planned without being read (its lease is kept, then
    dropped here)."""
    splits = df.rdd.getNumPartitions()
    _table, partitions = kv.admin.list_partitions("shop.events")
    names = {p.partition_id: p.name for p in partitions}
    try:
        leased = {names[tb.partition_id] for tb in kv.admin.describe_lease(lease_id).buckets}
    except errors.LeaseNotFoundError:
        leased = set()
    kv.admin.drop_lease(lease_id)
    return splits, leased


def test_a_batch_read_leases_every_kept_partition_under_one_lease_and_filters_prune_before_leasing(spark, kv):
    state = events(kv)

    assert rows(read(spark, kv)) == state  # snapshots + changelog, and the changelog-only partition
    assert kv.admin.list_leases() == []  # every split gave its bucket back
    # the plan of a read without a filter: one lease over the snapshotted partitions' buckets, a split per bucket
    assert planned(kv, read(spark, kv, lease_id="all"), "all") == (6, set(DAYS[:2]))
    # a filter on the partition column: only the kept partitions are planned and leased
    assert planned(kv, read(spark, kv, lease_id="one").where(f"day = '{DAYS[1]}'"), "one") == (2, {DAYS[1]})
    assert planned(kv, read(spark, kv, lease_id="in").where(f"day IN ('{DAYS[0]}', '{DAYS[2]}') AND id > 3"),
                   "in") == (4, {DAYS[0]})
    assert planned(kv, read(spark, kv, lease_id="none").where("day = '20990101'"), "none")[1] == set()

    for where, keep in ((f"day IN ('{DAYS[0]}', '{DAYS[2]}')", lambda d, i: d != DAYS[1]),
                        (f"day < '{DAYS[2]}' AND id < 10", lambda d, i: d < DAYS[2] and i < 10),
                        (f"day LIKE '2026112%' AND NOT day = '{DAYS[0]}'", lambda d, i: d != DAYS[0]),
                        ("day = '20990101'", lambda d, i: False)):
        assert rows(read(spark, kv).where(where)) == {k: v for k, v in state.items() if keep(*k)}, where
    # a change feed is pruned too, and applied gives the partition; ending.offsets names an unpartitioned table's
    changes = read(spark, kv, startup_mode="earliest").where(f"day = '{DAYS[2]}'").collect()
    assert {r["day"] for r in changes} == {DAYS[2]}
    assert _applied([{**r.asDict(), "sec": r["day"]} for r in changes])[DAYS[2]] == {
        i: v for (d, i), v in state.items() if d == DAYS[2]}
    with pytest.raises(Exception, match="option 'ending.offsets' names buckets of an unpartitioned table"):
        read(spark, kv, startup_mode="earliest", ending_offsets='{"0": 1}').collect()
    assert kv.admin.list_leases() == []


def test_a_catalog_table_shows_its_partition_column_and_each_query_prunes_on_its_own(spark, kv):
    state = events(kv)
    name = f"events_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {name} USING kvlease OPTIONS (bootstrap '{kv.coordinator.address}', "
              "table 'shop.events')")
    try:
        described = {r["col_name"]: r for r in spark.sql(f"DESCRIBE TABLE {name}").collect()}
        assert described["day"]["data_type"] == "string"
        assert "partition key (day)" in described["day"]["comment"]
        assert described["id"]["comment"] is None
        one = spark.sql(f"SELECT day, id, v FROM {name} WHERE day = '{DAYS[2]}'")
        assert rows(one) == {k: v for k, v in state.items() if k[0] == DAYS[2]}
        # a later query of the table is planned on its own, not on the pruned plan of the one before
        assert spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0] == len(state)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
    assert kv.admin.list_leases() == []


def test_a_stream_copies_a_partitioned_table_into_one_whose_partitions_it_creates(spark, kv, tmp_path):
    state = events(kv)
    kv.admin.create_table("shop.copy", EVENTS, ["day", "id"], 2, partition_key=["day"])

    def copy() -> None:
        query = (spark.readStream.format("kvlease").option("bootstrap", kv.coordinator.address)
                 .option("table", "shop.events").load()
                 .writeStream.format("kvlease").option("bootstrap", kv.coordinator.address)
                 .option("table", "shop.copy").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(120)
        finally:
            query.stop()

    copy()
    assert sorted(p.name for p in kv.admin.list_partitions("shop.copy")[1]) == list(DAYS)
    assert rows(read(spark, kv, "shop.copy")) == state
    with TableClient(kv.admin, "shop.events") as client:  # a new partition, and changes to an old one
        client.upsert([{"day": d, "id": 7, "v": "again"} for d in ("20261128", DAYS[0])])
    state.update({(d, 7): "again" for d in ("20261128", DAYS[0])})
    copy()  # restarted from its checkpoint: the new partition from its beginning, the others from their offsets
    assert rows(read(spark, kv, "shop.copy")) == state
    assert _joins(tmp_path / "ck") == {p.partition_id: 1 for p in kv.admin.list_partitions("shop.events")[1]}

    bad = spark.createDataFrame([("20261128", 1, "x"), ("no way", 2, "y")], "day STRING, id BIGINT, v STRING") \
        .coalesce(1)
    with pytest.raises(Exception) as raised:
        bad.write.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.copy") \
            .mode("append").save()
    assert ("table shop.copy: row 1 of partition 0: partition column 'day': bad partition value 'no way'"
            in str(raised.value))
    assert sorted(p.name for p in kv.admin.list_partitions("shop.copy")[1]) == [*DAYS, "20261128"]  # none made
    wait_until(lambda: kv.admin.list_leases() == [], 30, "the stream's lease released")


# -- streaming over an auto-partitioned table: partitions made and dropped while it reads -----------------


class Ticks:
    """Writes rows into the partition of the current second of shop.ticks (SECOND partitions, retention 3),
    updating and deleting some, and keeps what each partition should hold (``model``). Each partition written
    is guarded from retention, once its second is over, by the test's own lease (``GUARD``) on a snapshot of
    it: retention drops it when :meth:`release` lets it go, after the stream read it, so that a stream slowed
    down by a loaded machine cannot fail the test by lagging behind retention."""

    GUARD = "ticks-guard"

    def __init__(self, kv) -> None:
        self.kv = kv
        self.table = kv.admin.get_table("shop.ticks")
        self.model: dict[str, dict[int, int]] = {}
        self.guarded: set[str] = set()
        self.n = 0

    def write_for(self, seconds: float) -> None:
        with TableClient(self.kv.admin, "shop.ticks") as client:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                sec = value_at(TimeUnit.SECOND, "UTC", int(time.time() * 1000))
                self._guard(set(self.model) - self.guarded - {sec})
                n, mine = self.n, self.model.setdefault(sec, {})
                client.upsert([{"sec": sec, "id": n + i, "v": n + i} for i in range(5)])
                client.upsert([{"sec": sec, "id": n, "v": -n}])  # an update
                client.delete([{"sec": sec, "id": n + 1}])
                mine.update({n + i: n + i for i in range(5)})
                mine[n] = -n
                del mine[n + 1]
                self.n += 5
                time.sleep(0.05)
        self._guard(set(self.model) - self.guarded)

    def _guard(self, partitions: set[str]) -> None:
        for name in sorted(partitions):
            with TableClient(self.kv.admin, "shop.ticks", partition=name) as partition:
                (snapshot,) = partition.trigger_snapshot()
                tb = partition.table.bucket(snapshot.bucket)
            self.kv.admin.acquire_lease(self.GUARD, {tb: snapshot.snapshot_id}, 300_000, owner="guard")
            self.guarded.add(name)

    def release(self) -> None:
        self.kv.admin.drop_lease(self.GUARD, owner="guard")

    def existing(self) -> set[str]:
        return {p.name for p in self.kv.admin.list_partitions("shop.ticks")[1]}


def test_a_stream_reads_new_partitions_from_their_beginning_once_and_outlives_dropped_ones(spark, kv, tmp_path):
    """The stream reads what the writer writes into each second's partition; then those partitions expire
    (retention) under the running query, and the writer goes on in new ones. The query's output, applied per
    partition, is what was written to each partition, those dropped included: what "equals the table" means
    when partitions expire (each was read to its end before it expired: :class:`Ticks` holds them until then)."""
    from tests.spark_source.test_spark_stream import Collector

    kv.admin.create_table("shop.ticks", [Column("sec", "STRING"), Column("id", "BIGINT"), Column("v", "BIGINT")],
                          ["sec", "id"], 1, partition_key=["sec"], auto_partition=AutoPartition(TimeUnit.SECOND, 2, 3))
    ticks = Ticks(kv)
    future = value_at(TimeUnit.SECOND, "UTC", int(time.time() * 1000) + 3_600_000)  # not dropped in this test
    sink = Collector()
    checkpoint = tmp_path / "ck"
    query = (spark.readStream.format("kvlease").option("bootstrap", kv.coordinator.address)
             .option("table", "shop.ticks").option("partition.discovery.interval", "300ms").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: len(sink.batches) >= 2, 120, "the stream's first micro-batches")
        with TableClient(kv.admin, "shop.ticks") as client:  # a partition found later, with a snapshot
            client.upsert([{"sec": future, "id": i, "v": i} for i in range(10)])
        with TableClient(kv.admin, "shop.ticks", partition=future) as partition:
            assert partition.trigger_snapshot()
            partition.upsert([{"sec": future, "id": 3, "v": 33}])
        ticks.model[future] = {**{i: i for i in range(10)}, 3: 33}
        ticks.write_for(2.5)
        first = set(ticks.model) - {future}
        try:
            wait_until(lambda: _applied(sink.rows()) == ticks.model, 60, "the stream read what was written")
        except NotReached:
            pytest.fail(f"the stream did not read what was written:\n{_progress(checkpoint, sink, ticks)}")
        ticks.release()  # retention drops them now, under the running query
        wait_until(lambda: not first & ticks.existing(), 30, "the partitions written first dropped past retention")
        ticks.write_for(1.5)  # into partitions made after those were dropped
        query.processAllAvailable()
        existing = ticks.existing()
        tables = {sec: _rows_of(kv, sec) for sec in existing}  # held by the guard until the end
    finally:
        query.stop()
        ticks.release()
    assert query.exception() is None
    streamed = _applied(sink.rows())
    assert {sec: streamed.get(sec, {}) for sec in tables} == tables  # the partitions there at the end
    assert streamed == {sec: rows for sec, rows in ticks.model.items() if rows}  # and those dropped before
    assert first and not first & existing and set(ticks.model) - first - {future}
    _assert_read_once(sink.rows(), checkpoint)
    wait_until(lambda: kv.admin.list_leases() == [], 30, "no lease left once the query stopped")


def _progress(checkpoint, sink, ticks) -> str:
    """What the stream had read when it did not catch up: per offset its partitions, then the rows per
    partition it read and the writer wrote."""
    lines = []
    for path in sorted((checkpoint / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if path.name.isdigit():
            doc = json.loads(path.read_text().splitlines()[-1])
            lines.append(f"offset {path.name}: {sorted(doc.get('partitions', {}).values())}")
    streamed = _applied(sink.rows())
    lines.append(f"rows read / written per partition: "
                 f"{ {p: (len(streamed.get(p, {})), len(rows)) for p, rows in sorted(ticks.model.items())} }")
    return "\n".join(lines)


def _rows_of(kv, sec: str) -> dict[int, int]:
    with TableClient(kv.admin, "shop.ticks", partition=sec) as partition:
        return {r["id"]: r["v"] for b in partition.scan().batches for r in b.to_pylist()}


def _applied(rows: list[dict]) -> dict[str, dict[int, int]]:
    """partition value -> the rows the change rows leave, applied per key in (_bucket, _log_offset) order."""
    state: dict[str, dict[int, int]] = {}
    for r in sorted(rows, key=lambda r: (r["sec"], r["_bucket"], r["_log_offset"])):
        mine = state.setdefault(r["sec"], {})
        if r["_change_type"] in ("insert", "update_postimage"):
            mine[r["id"]] = r["v"]
        elif r["_change_type"] == "delete":
            mine.pop(r["id"], None)
    return {sec: kept_rows for sec, kept_rows in state.items() if kept_rows}


def _assert_read_once(rows: list[dict], checkpoint) -> None:
    """No change row twice, and each partition joined the offsets once."""
    seen = [(r["sec"], r["_bucket"], r["_log_offset"], r["id"], r["_change_type"]) for r in rows]
    assert len(seen) == len(set(seen))
    assert set(_joins(checkpoint).values()) == {1}


def _joins(checkpoint) -> dict[int, int]:
    """partition id -> how many times it joined a query's offsets (read from its beginning); AssertionError if
    one came back after it left them."""
    joined: dict[int, int] = {}
    left: set[int] = set()
    before: set[int] = set()
    for path in sorted((checkpoint / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not path.name.isdigit():
            continue
        now = set(partition_names(json.loads(path.read_text().splitlines()[-1])))
        for p in now - before:
            assert p not in left, f"partition {p} came back after it left"
            joined[p] = joined.get(p, 0) + 1
        left |= before - now
        before = now
    return joined


# -- the pure parts, without Spark or a cluster --------------------------------------------------------------

PARTITIONED = TableInfo(7, "shop", "events", tuple(EVENTS), ("day", "id"), 2, partition_key=("day",))


@pytest.mark.unit
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


@pytest.mark.unit
def test_a_partitioned_tables_reader_keeps_the_filters_and_gives_every_one_back_to_spark():
    from kvlease.spark_source.batch import BatchReader, PartitionedBatchReader

    reader = PartitionedBatchReader(None, ReadContext((), PARTITIONED, None, ("id",)))
    filters = [EqualTo(("day",), "20261126"), EqualTo(("id",), 5)]
    assert reader.pushFilters(filters) is filters and reader.filters == tuple(filters)
    assert PartitionedBatchReader.pushFilters is not BatchReader.pushFilters


@pytest.mark.unit
def test_partition_values_are_typed_as_their_columns():
    table = TableInfo(8, "db", "t", (Column("region", "STRING"), Column("n", "INT"), Column("ok", "BOOLEAN"),
                                     Column("id", "BIGINT")), ("region", "n", "ok", "id"), 1,
                      partition_key=("region", "n", "ok"))
    parts = [(1, "region=eu/n=7/ok=true"), (2, "region=us/n=12/ok=false")]
    assert kept(table, parts, [GreaterThan(("n",), 9)]) == {2: "region=us/n=12/ok=false"}
    assert kept(table, parts, [EqualTo(("ok",), True), EqualTo(("region",), "eu")]) == {1: "region=eu/n=7/ok=true"}
    assert kept(table, parts, [EqualTo(("n",), True)]) == dict(parts)  # a bool is not an INT's value


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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
