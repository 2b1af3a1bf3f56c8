"""Partitioned tables through the Spark source (docs/spark.md, "Partitioned tables"): the partitions option
``partitions`` names read and leased alone, filters on the partition column right after any other query of
the DataFrame, one lease over every kept partition, a stream that finds new partitions and outlives dropped
ones, and writes that create partitions. (Pruning, offset keys, discovery and the one acquire without Spark:
tests/spark_source/test_spark_partitions_unit.py.)"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.auto_partition import AutoPartition, TimeUnit, value_at
from kvlease.common.tables import Column
from kvlease.ops.wait import NotReached, wait_until
from kvlease.spark_source.stream_offsets import partition_names
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


def test_a_batch_read_leases_every_kept_partition_under_one_lease_and_reads_the_partitions_it_names(spark, kv):
    state = events(kv)

    assert rows(read(spark, kv)) == state  # snapshots + changelog, and the changelog-only partition
    assert kv.admin.list_leases() == []  # every split gave its bucket back
    # the plan of a read without a filter: one lease over the snapshotted partitions' buckets, a split per bucket
    assert planned(kv, read(spark, kv, lease_id="all"), "all") == (6, set(DAYS[:2]))
    # option partitions: only the partitions it names are planned and leased
    assert planned(kv, read(spark, kv, lease_id="one", partitions=DAYS[1]), "one") == (2, {DAYS[1]})
    assert planned(kv, read(spark, kv, lease_id="two", partitions=f"{DAYS[2]}, {DAYS[0]},{DAYS[0]}"),
                   "two") == (4, {DAYS[0]})
    two = read(spark, kv, partitions=f"{DAYS[0]},{DAYS[2]}")
    assert rows(two) == {k: v for k, v in state.items() if k[0] != DAYS[1]}
    assert rows(two.where("id < 10")) == {k: v for k, v in state.items() if k[0] != DAYS[1] and k[1] < 10}
    for bad, message in (({"partitions": "20990101"}, "table shop.events has no partition 20990101"),
                         ({"partitions": "2026/11"}, "option 'partitions': bad partition name"),
                         ({"partitions": "a,,b"}, "option 'partitions': expected partition names")):
        with pytest.raises(Exception, match=message):
            read(spark, kv, **bad).collect()
    with pytest.raises(Exception, match="table shop.flat is not partitioned"):
        kv.admin.create_table("shop.flat", EVENTS, ["day", "id"], 1)
        read(spark, kv, "shop.flat", partitions=DAYS[0]).collect()

    # a filter on the partition column is Spark's to apply: right whatever ran on the DataFrame before
    df = read(spark, kv)
    for where, keep in ((f"day IN ('{DAYS[0]}', '{DAYS[2]}')", lambda d, i: d != DAYS[1]),
                        (f"day < '{DAYS[2]}' AND id < 10", lambda d, i: d < DAYS[2] and i < 10),
                        (f"day LIKE '2026112%' AND NOT day = '{DAYS[0]}'", lambda d, i: d != DAYS[0]),
                        ("day = '20990101'", lambda d, i: False)):
        assert rows(df.where(where)) == {k: v for k, v in state.items() if keep(*k)}, where
        assert df.count() == len(state), where  # not the plan of the filtered query before it
    # a change feed of named partitions, applied, gives the partition; ending.offsets names an unpartitioned
    # table's buckets
    changes = read(spark, kv, startup_mode="earliest", partitions=DAYS[2]).collect()
    assert {r["day"] for r in changes} == {DAYS[2]}
    assert _applied([{**r.asDict(), "sec": r["day"]} for r in changes])[DAYS[2]] == {
        i: v for (d, i), v in state.items() if d == DAYS[2]}
    with pytest.raises(Exception, match="option 'ending.offsets' names buckets of an unpartitioned table"):
        read(spark, kv, startup_mode="earliest", ending_offsets='{"0": 1}').collect()
    assert kv.admin.list_leases() == []


def test_a_catalog_table_shows_its_partition_column_and_each_query_reads_the_table(spark, kv):
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
        tables = {sec: _rows_of(kv, sec) for sec in set(ticks.model) & existing}  # the guard holds them
    finally:
        query.stop()
        ticks.release()
    assert query.exception() is None
    streamed = _applied(sink.rows())
    assert {sec: streamed.get(sec, {}) for sec in tables} == tables  # the partitions there at the end
    assert streamed == {sec: rows for sec, rows in ticks.model.items() if rows}  # and those dropped before
    assert first and not first & existing and set(ticks.model) - first - {future}
    last = max((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert not first & set(partition_names(json.loads(last.read_text().splitlines()[-1])).values())  # they left
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
