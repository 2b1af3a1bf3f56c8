"""Which bucket-key prefixes a batch read is narrowed to (spark_source/prefix_pruning.py), without Spark or a
cluster: the filters that pin every bucket-key column, option ``prefix``, and the splits of a partitioned
table's prefixes."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import EqualNullSafe, EqualTo, GreaterThan, In, Not

from kvlease.common import errors
from kvlease.common.codec import RowCodec
from kvlease.common.prefix_codec import PrefixCodec
from kvlease.common.tables import Column, TableInfo
from kvlease.spark_source.prefix_pruning import MAX_PREFIXES, filter_prefixes, parse_prefix_option, prefix_splits

pytestmark = pytest.mark.unit

TWO = TableInfo(1, "db", "t", (Column("region", "STRING"), Column("user", "BIGINT"), Column("seq", "BIGINT"),
                               Column("score", "DOUBLE")), ("region", "user", "seq"), 8, bucket_key=("region", "user"))
FLOAT = TableInfo(2, "db", "f", (Column("x", "DOUBLE"), Column("y", "INT")), ("x", "y"), 4, bucket_key=("x",))
DAYS = TableInfo(3, "db", "d", (Column("day", "STRING"), Column("user", "INT"), Column("seq", "INT")),
                 ("day", "user", "seq"), 4, partition_key=("day",), bucket_key=("day", "user"))


@pytest.mark.parametrize("filters, prefixes", [
    ([EqualTo(("region",), "eu"), EqualTo(("user",), 7)], [("eu", 7)]),
    ([In(("region",), ("us", "eu", None)), EqualNullSafe(("user",), 7), GreaterThan(("seq",), 1)],
     [("eu", 7), ("us", 7)]),
    ([EqualTo(("region",), "eu"), In(("user",), (1, 2)), In(("user",), (2, 3))], [("eu", 2)]),
    ([EqualTo(("region",), "eu"), EqualTo(("user",), None)], []),  # user = NULL: no row
    ([EqualTo(("Region",), "eu"), EqualTo(("USER",), 7)], [("eu", 7)]),  # Spark's names are case-insensitive
])
def test_filters_pinning_every_bucket_key_column_give_every_combination(filters, prefixes):
    assert filter_prefixes(TWO, filters) == prefixes


@pytest.mark.parametrize("filters", [
    [EqualTo(("region",), "eu")],  # user not pinned
    [EqualTo(("region",), "eu"), GreaterThan(("user",), 7)],
    [EqualTo(("region",), "eu"), EqualTo(("user",), "7")],  # a str for a BIGINT: Spark's cast, not ours
    [EqualTo(("region",), "eu"), EqualTo(("user",), True)],  # a bool is not an int here
    [EqualTo(("region",), "eu"), Not(EqualTo(("user",), 7))],
    [In(("region",), tuple(f"r{i}" for i in range(MAX_PREFIXES + 1))), EqualTo(("user",), 1)],
])
def test_filters_that_do_not_pin_the_bucket_key_keep_the_plain_plan(filters):
    assert filter_prefixes(TWO, filters) is None


def test_a_float_bucket_key_and_a_table_without_one_never_prune():
    assert filter_prefixes(FLOAT, [EqualTo(("x",), 0.0)]) is None  # Spark finds -0.0 for 0.0
    plain = TableInfo(4, "db", "p", TWO.columns, TWO.primary_key, 8)
    assert filter_prefixes(plain, [EqualTo(("region",), "eu"), EqualTo(("user",), 7)]) is None


def test_option_prefix_text_and_json_forms_and_its_errors():
    assert parse_prefix_option(TWO, "region=eu,user=7") == [("eu", 7)]
    assert parse_prefix_option(TWO, '[{"region": "a,b", "user": -1}, {"user": 2, "region": "c"}]') == \
        [("a,b", -1), ("c", 2)]
    for text, message in (("region=eu", "bucket key column 'user' is missing"),
                          ("region=eu,user=x", "column 'user': expected BIGINT"),
                          ("region=eu,seq=1,user=1", "column 'seq' is not in the bucket key"),
                          ("eu", "expected COL=VALUE"),
                          ("[1]", "expected a JSON array of objects")):
        with pytest.raises(errors.KvLeaseError, match=message):
            parse_prefix_option(TWO, text)
    with pytest.raises(errors.KvLeaseError, match="column 'x' is DOUBLE: give its value in the JSON form"):
        parse_prefix_option(FLOAT, "x=1")


def test_prefix_splits_group_prefixes_by_bucket_and_a_partitioned_tables_by_partition():
    prefixes = [("eu", u) for u in range(40)]
    splits = prefix_splits(TWO, prefixes)
    codec = PrefixCodec(RowCodec(TWO))
    for split in splits:
        encoded = codec.encode(codec.to_batch(list(split.prefixes)))
        assert set(codec.buckets(encoded).tolist()) == {split.bucket}
    assert sorted(p for s in splits for p in s.prefixes) == prefixes and len({s.bucket for s in splits}) == len(splits)
    days = prefix_splits(DAYS, [("d1", 1), ("d2", 1), ("d9", 1)], {"d1": 11, "d2": 12})
    assert sorted((s.partition_id, s.partition_name, s.prefixes) for s in days) == [
        (11, "d1", (("d1", 1),)), (12, "d2", (("d2", 1),))]  # d9 does not exist: no rows, no split
