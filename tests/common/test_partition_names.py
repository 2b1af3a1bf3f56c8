"""Partition names (common/partition_names.py): which partition keys a table may have, the alphabet of a
partition value, a row's value as a partition value, and names for one and several columns both ways."""

from __future__ import annotations

import numpy as np
import pytest

from kvlease.common import errors
from kvlease.common.partition_names import (PARTITION_VALUE_RULE, check_partition_key,
                                            parse_partition_name, partition_name, partition_value_problem,
                                            value_text)
from kvlease.common.tables import Column

pytestmark = pytest.mark.unit

COLUMNS = (Column("region", "STRING"), Column("day", "STRING"), Column("shard", "INT"), Column("id", "BIGINT"),
           Column("live", "BOOLEAN"), Column("score", "DOUBLE"), Column("blob", "BYTES"), Column("at", "TIMESTAMP"),
           Column("note", "STRING"))
PRIMARY_KEY = ("region", "day", "shard", "id", "live", "score", "blob", "at")


# -- partition keys ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("partition_key", [(), ("day",), ("region", "day"), ("shard", "id", "live"), ("id", "day")])
def test_a_partition_key_of_nameable_primary_key_columns_is_accepted(partition_key):
    check_partition_key(COLUMNS, PRIMARY_KEY, partition_key)


@pytest.mark.parametrize("partition_key, message", [
    (("nope",), "partition key column 'nope' is not a column of the table"),
    (("note",), "partition key column 'note' is not part of the primary key"),
    (("day", "day"), "partition key names column 'day' twice"),
    (("score",), "'score' is of type DOUBLE: a partition column is one of STRING, INT, BIGINT, BOOLEAN"),
    (("blob",), "'blob' is of type BYTES"),
    (("at",), "'at' is of type TIMESTAMP"),
    ("day", "must be a list of column names, not a string"),
])
def test_each_bad_partition_key_is_refused_naming_the_problem(partition_key, message):
    with pytest.raises(errors.InvalidTableError, match=message) as raised:
        check_partition_key(COLUMNS, PRIMARY_KEY, partition_key)
    assert "\n" not in str(raised.value)


def test_the_whole_primary_key_as_partition_key_is_refused_in_any_order():
    columns = (Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "STRING"))
    for partition_key in (("day", "id"), ("id", "day")):
        with pytest.raises(errors.InvalidTableError, match="is the whole primary key.*needs another column"):
            check_partition_key(columns, ("day", "id"), partition_key)
    check_partition_key(columns, ("day", "id"), ("day",))  # one column fewer: fine


def test_a_lower_case_column_type_is_read_as_its_type():
    check_partition_key((Column("day", "string"), Column("id", "bigint")), ("day", "id"), ("day",))
    with pytest.raises(errors.InvalidTableError, match="of type DOUBLE"):
        check_partition_key((Column("x", "double"), Column("id", "bigint")), ("x", "id"), ("x",))


# -- the alphabet ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["a", "A-z_0.9", "20261127", "x" * 64, "...", ".a", "-", "_", "..a"])
def test_values_of_the_safe_alphabet_are_partition_values(value):
    assert partition_value_problem(value) is None


@pytest.mark.parametrize("value", ["", "x" * 65, ".", "..", "a/b", "a b", "a\n", "é", "日本", "a=b", "a$b",
                                   "a\\b", None, 5, b"abc"])
def test_other_values_are_refused_stating_the_rule(value):
    problem = partition_value_problem(value)
    assert problem is not None and problem.endswith(PARTITION_VALUE_RULE)
    assert problem.startswith("bad partition value ") and "\n" not in problem


def test_a_huge_value_is_quoted_short():
    problem = partition_value_problem("x" * 1_000_000)
    assert problem is not None and len(problem) < 400 and "1,000,000 characters" in problem


# -- a row's value as a partition value ----------------------------------------------------------------------

@pytest.mark.parametrize("column_type, value, text", [
    ("STRING", "eu-west_1", "eu-west_1"),
    ("string", "20261127", "20261127"),
    ("INT", 42, "42"),
    ("INT", -7, "-7"),
    ("INT", 2**31 - 1, "2147483647"),
    ("BIGINT", -(2**63), "-9223372036854775808"),
    ("BIGINT", np.int64(12), "12"),
    ("BOOLEAN", True, "true"),
    ("BOOLEAN", False, "false"),
])
def test_value_text_names_a_value_by_its_type(column_type, value, text):
    assert value_text(column_type, value) == text


@pytest.mark.parametrize("column_type, value, message", [
    ("STRING", None, "a row has no value for partition column 'c'"),
    ("INT", None, "a row has no value"),
    ("INT", True, r"is not of type INT \(a Python bool\)"),
    ("BIGINT", False, r"is not of type BIGINT \(a Python bool\)"),
    ("INT", 1.0, r"is not of type INT \(a Python float\)"),
    ("INT", "5", r"is not of type INT \(a Python str\)"),
    ("INT", 2**31, "out of range for INT"),
    ("BIGINT", 2**63, "out of range for BIGINT"),
    ("BOOLEAN", 1, r"is not of type BOOLEAN \(a Python int\)"),
    ("BOOLEAN", "true", r"is not of type BOOLEAN \(a Python str\)"),
    ("STRING", 5, r"is not of type STRING \(a Python int\)"),
    ("STRING", b"eu", r"is not of type STRING \(a Python bytes\)"),
    ("STRING", "a b", "bad partition value 'a b'"),
    ("STRING", "", "bad partition value ''"),
    ("STRING", "..", "bad partition value '..'"),
    ("STRING", "eu/west", "bad partition value 'eu/west'"),
])
def test_value_text_refuses_a_missing_mistyped_or_unsafe_value(column_type, value, message):
    with pytest.raises(errors.InvalidRequestError, match=message) as raised:
        value_text(column_type, value, column="c")
    assert "\n" not in str(raised.value)
    assert not isinstance(raised.value, errors.InvalidTableError)  # the row is wrong, not the table


def test_value_text_without_a_column_name_still_says_what_is_missing():
    with pytest.raises(errors.InvalidRequestError, match="a row has no value for a partition column"):
        value_text("STRING", None)


@pytest.mark.parametrize("column_type", ["DOUBLE", "BYTES", "TIMESTAMP", "WHATEVER"])
def test_value_text_of_a_type_that_names_no_partition_is_a_table_error(column_type):
    with pytest.raises(errors.InvalidTableError, match="a partition column is one of STRING, INT, BIGINT, BOOLEAN"):
        value_text(column_type, 1.5, column="c")


# -- names ---------------------------------------------------------------------------------------------------

def test_one_column_names_the_partition_by_its_value():
    assert partition_name(("day",), ("20261127",)) == "20261127"
    assert parse_partition_name(("day",), "20261127") == ("20261127",)


def test_several_columns_name_column_equals_value_in_key_order():
    name = partition_name(("region", "day"), ("eu", "20261127"))
    assert name == "region=eu/day=20261127"
    assert parse_partition_name(("region", "day"), name) == ("eu", "20261127")
    assert partition_name(("day", "region"), ("20261127", "eu")) == "day=20261127/region=eu"


@pytest.mark.parametrize("key, values", [
    (("a",), ("x" * 64,)),
    (("a", "b", "c"), ("1", "-2", "true")),
    (("region", "day"), ("...", "a.b_c-d")),
])
def test_names_round_trip(key, values):
    assert parse_partition_name(key, partition_name(key, values)) == values


def test_a_name_with_the_columns_in_another_order_is_read_in_key_order():
    assert parse_partition_name(("region", "day", "shard"), "shard=3/day=20261127/region=eu") == \
        ("eu", "20261127", "3")


@pytest.mark.parametrize("key, values, message", [
    (("day",), (), r"needs 1 partition value\(s\), got 0"),
    (("region", "day"), ("eu",), r"needs 2 partition value\(s\), got 1"),
    ((), (), r"needs 0 partition value\(s\)"),
    (("day",), ("a b",), "bad partition value 'a b'"),
    (("day",), "20261127", "must be a list of values, not a string"),
])
def test_partition_name_refuses_values_that_do_not_fit_the_key(key, values, message):
    with pytest.raises(errors.InvalidRequestError, match=message):
        partition_name(key, values)


@pytest.mark.parametrize("key, name, message", [
    (("day",), "day=20261127", "not a partition value.*expected the partition value itself"),
    (("day",), "", "not a partition value"),
    (("day",), "x" * 65, "not a partition value"),
    (("day",), "..", "not a partition value"),
    (("day",), "2026 11", "not a partition value"),
    (("region", "day"), "eu/20261127", "'eu' is not column=value; expected region=VALUE/day=VALUE"),
    (("region", "day"), "region=eu", "no value for day"),
    (("region", "day"), "region=eu/day=1/shard=2", "'shard' is not a partition column"),
    (("region", "day"), "region=eu/region=us/day=1", "column 'region' appears twice"),
    (("region", "day"), "region=eu/day=", "the value of day is not a partition value"),
    (("region", "day"), "region=eu/day=a b", "the value of day is not a partition value"),
    (("region", "day"), "region=eu/day=1=2", "the value of day is not a partition value"),
    (("region", "day"), "region=eu//day=1", "'' is not column=value"),
    (("region", "day"), "region=eu/day=1/", "'' is not column=value"),
    (("region", "day"), "region=eu,day=1", "the value of region is not a partition value"),
    (("region", "day"), 5, "expected a string"),
    ((), "20261127", "the table is not partitioned"),
])
def test_a_bad_name_is_refused_with_the_expected_form(key, name, message):
    with pytest.raises(errors.InvalidRequestError, match=message) as raised:
        parse_partition_name(key, name)
    assert "\n" not in str(raised.value)
