"""Bucket-key prefixes through the Spark source (docs/spark.md, "Reading some bucket-key prefixes"): option
``prefix`` and pushed bucket-key filters plan one prefix split per bucket holding the prefixes and read the
same rows as a plain read filtered, on a real cluster (in-process on ZooKeeper) and, for option ``prefix``,
a real Spark session."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, In

from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.spark_source import batch
from kvlease.spark_source.reader import read_split
from kvlease.spark_source.source import KvLeaseDataSource
from kvlease.spark_source.splits import HybridSplit, LogSplit, PrefixSplit
from tests.support.spark_tables import kv  # noqa: F401 (fixture: 2 tablet servers)

COLUMNS = [Column("user", "STRING"), Column("seq", "BIGINT"), Column("v", "STRING")]
USERS = ("a", "ab", "b", "c", "d", "e")



def events(kv) -> dict:
    """shop.ev: bucket key user, 4 buckets; snapshotted, then updated and deleted in the changelog."""
    kv.admin.create_table("shop.ev", COLUMNS, ["user", "seq"], 4, bucket_key=["user"])
    state = {(u, s): f"{u}{s}" for u in USERS for s in range(20)}
    with TableClient(kv.admin, "shop.ev") as client:
        client.upsert([{"user": u, "seq": s, "v": v} for (u, s), v in state.items()])
        client.trigger_snapshot()
        client.upsert([{"user": u, "seq": 3, "v": "late"} for u in USERS])
        client.delete([(u, 4) for u in USERS])
    state.update({(u, 3): "late" for u in USERS})
    for u in USERS:
        del state[(u, 4)]
    return state


def source(kv, table: str = "shop.ev", **options) -> KvLeaseDataSource:
    return KvLeaseDataSource({"bootstrap": kv.coordinator.address, "table": table,
                              **{k.replace("_", "."): v for k, v in options.items()}})


def read_plan(reader, splits) -> dict:
    """The rows the splits read, as a reader's executors would: ``(user, seq) -> v``."""
    out = {}
    for split in splits:
        for b in read_split(reader.ctx, split):
            out.update({(r["user"], r["seq"]): r["v"] for r in b.select(["user", "seq", "v"]).to_pylist()})
    return out


def test_pushed_bucket_key_filters_read_only_the_buckets_and_rows_of_their_prefixes(kv):
    state = events(kv)
    data = source(kv)
    reader = batch.KeyPruningBatchReader(data.reader(data.schema()).options, data.reader(data.schema()).ctx)
    for filters, prefixes, users in (([EqualTo(("user",), "ab")], {"ab"}, {"ab"}),
                                     ([In(("user",), ("a", "c", "zz")), GreaterThan(("seq",), 2)], {"a", "c", "zz"},
                                      {"a", "c"}),
                                     ([EqualTo(("USER",), "b"), EqualTo(("user",), "b")], {"b"}, {"b"}),
                                     ([EqualTo(("user",), "a"), EqualTo(("user",), "b")], set(), set())):
        assert reader.pushFilters(filters) == filters  # every filter given back: Spark applies them too
        splits = reader.partitions()
        assert all(isinstance(s, PrefixSplit) for s in splits)
        assert len(splits) <= len(prefixes) and {u for s in splits for (u,) in s.prefixes} == prefixes
        assert read_plan(reader, splits) == {k: v for k, v in state.items() if k[0] in users}, filters
    # filters that do not pin the bucket key: the plain plan, every bucket
    for filters in ([GreaterThan(("user",), "a")], [EqualTo(("user",), 7)], [EqualTo(("seq",), 1)], []):
        reader.pushFilters(filters)
        splits = reader.partitions()
        assert len(splits) == 4 and all(isinstance(s, (HybridSplit, LogSplit)) for s in splits), filters
        assert read_plan(reader, splits) == state
    assert kv.admin.list_leases() == []


def test_option_prefix_reads_one_bucket_and_the_rows_a_plain_read_filters(spark, kv):
    state = events(kv)

    def load(**options):
        reader = spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", "shop.ev")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    def rows(df) -> dict:
        return {(r["user"], r["seq"]): r["v"] for r in df.select("user", "seq", "v").collect()}

    plain = load()
    assert rows(plain) == state
    one = load(prefix="user=ab")
    assert one.rdd.getNumPartitions() == 1  # one bucket planned
    assert rows(one) == rows(plain.where("user = 'ab'")) == {k: v for k, v in state.items() if k[0] == "ab"}
    two = load(prefix='[{"user": "a"}, {"user": "e"}]')
    assert rows(two.where("seq > 10")) == {k: v for k, v in state.items() if k[0] in "ae" and k[1] > 10}
    assert plain.count() == len(state)  # the plain DataFrame's plan is its own
    kv.admin.create_table("shop.plain", COLUMNS, ["user", "seq"], 2)
    for table, prefix, message in (("shop.plain", "user=a", "table shop.plain has no bucket key"),
                                   ("shop.ev", "seq=1", "column 'seq' is not in the bucket key"),
                                   ("shop.ev", "user", "expected COL=VALUE")):
        with pytest.raises(Exception, match=f"option 'prefix': .*{message}"):
            spark.read.format("kvlease").option("bootstrap", kv.coordinator.address).option("table", table) \
                .option("prefix", prefix).load().collect()
    assert kv.admin.list_leases() == []
