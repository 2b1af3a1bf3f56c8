"""Names and ids are checked with full matches: ``$`` also matches before a final
newline, so ``re.match(r"^...$")`` let ``db.nl\\n`` through to ZooKeeper."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.common.model import LEASE_ID
from kvlease.common.tables import Column, TableSpec, parse_table_path, validate_spec
from kvlease.ops.cli.plugins import load_drill
from kvlease.spark_source import options as opts
from tests.support.cli_runner import run

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path", ["db.nl\n", "db\n.t", "db.t\r"])
def test_a_table_path_with_a_newline_is_rejected(path):
    with pytest.raises(errors.InvalidRequestError, match="bad table name"):
        parse_table_path(path)


@pytest.mark.parametrize("spec, bad", [
    (TableSpec("db\n", "t", (Column("id", "BIGINT"),), ("id",)), "database name"),
    (TableSpec("db", "t\n", (Column("id", "BIGINT"),), ("id",)), "table name"),
    (TableSpec("db", "t", (Column("id\n", "BIGINT"),), ("id\n",)), "column name"),
])
def test_a_name_with_a_trailing_newline_is_not_valid(spec, bad):
    with pytest.raises(errors.InvalidTableError, match=bad):
        validate_spec(spec)


def test_lease_ids_fullmatch():
    assert LEASE_ID.fullmatch("L-1.a_b") and not LEASE_ID.fullmatch("L1\n")


def test_spark_lease_id_with_a_newline_is_an_option_error():
    with pytest.raises(opts.OptionError, match="'lease.id'"):
        opts.parse({"bootstrap": "127.0.0.1:1", "table": "a.b", "lease.id": "L1\n"})


def test_a_drill_name_with_a_newline_is_a_usage_error():
    import click

    with pytest.raises(click.BadParameter, match="not a drill name"):
        load_drill("coordinator-failover\n")


def test_cli_table_path_with_a_newline_is_a_usage_error():
    result = run("--bootstrap", "127.0.0.1:1", "table", "describe", "db.nl\n")
    assert result.exit_code == 2 and "bad table name" in result.stderr


@pytest.mark.parametrize("schema, bad", [("1d BIGINT", "'1d'"), ("id BIGINT, my-col STRING", "'my-col'"),
                                         ("id BIGINT, " + "c" * 129 + " STRING", "'" + "c" * 129 + "'")])
def test_a_bad_column_name_is_a_usage_error_stating_the_rule(schema, bad):
    from tests.support.cli_runner import assert_one_line_error

    result = run("--bootstrap", "127.0.0.1:1", "table", "create", "db.t", "--schema", schema,
                 "--primary-key", "id", "--buckets", "1")
    message = assert_one_line_error(result, code=2)
    assert f"bad column name {bad}: 1-128 letters, digits and _, not starting with a digit" in message


def test_every_name_error_states_the_rule():
    with pytest.raises(errors.InvalidRequestError, match=r"expected DB.NAME, each 1-128 letters, digits and _"):
        parse_table_path("db.9t")
    with pytest.raises(errors.InvalidTableError, match=r"bad column name 'x y': 1-128 letters"):
        validate_spec(TableSpec("db", "t", (Column("x y", "BIGINT"),), ("x y",)))
