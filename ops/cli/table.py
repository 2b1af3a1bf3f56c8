"""``kvlease table create|list|describe|drop``."""

from __future__ import annotations

import click

from common import errors
from common.tables import MAX_BUCKETS, TableSpec, parse_schema, parse_table_path, validate_spec
from ops import output as out
from ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from ops.cli.values import bucket_number, table_path


@kvlease.group("table")
def table_group() -> None:
    """Create, list, describe and drop tables."""


@table_group.command("create")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--schema", required=True, help='Columns, e.g. "id BIGINT, name STRING".')
@click.option("--primary-key", required=True, metavar="COL[,COL…]", help="Primary key column(s).")
@click.option("--buckets", type=bucket_number(1), required=True, help=f"Number of buckets (at most {MAX_BUCKETS}).")
@click.option("--if-not-exists", is_flag=True,
              help="Succeed if the table exists already with this definition (an error if it differs).")
@common_options
@pass_state
@catch_errors
def table_create(state: State, path: str, schema: str, primary_key: str, buckets: int, if_not_exists: bool) -> None:
    """Create a primary-key table."""
    try:
        columns = parse_schema(schema)
    except errors.KvLeaseError as exc:
        raise click.BadParameter(exc.message, param_hint="'--schema'") from None
    keys = [k.strip() for k in primary_key.split(",") if k.strip()]
    db, name = parse_table_path(path)
    try:  # the coordinator's own rules, before anything is sent: a definition it would refuse is a usage error
        validate_spec(TableSpec(db, name, columns, tuple(keys), buckets))
    except errors.InvalidTableError as exc:
        raise click.UsageError(exc.message) from None
    existed = if_not_exists and _exists(state, path)
    info = state.client.create_table(path, columns, keys, buckets, ignore_if_exists=if_not_exists)
    if existed:  # the coordinator checked that its definition is the one asked for
        text = f"table {info.path} already exists with this definition (id {info.table_id}): nothing created"
    else:
        text = f"created table {info.path} (id {info.table_id}, {info.buckets} buckets)"
    state.output.message(text, {**out.table_doc(info), "created": not existed})


def _exists(state: State, path: str) -> bool:
    try:
        state.client.get_table(path)
        return True
    except errors.TableNotExistError:
        return False


@table_group.command("list")
@click.option("--database", default="", metavar="DB", help="Only this database.")
@common_options
@pass_state
@catch_errors
def table_list(state: State, database: str) -> None:
    """List tables."""
    state.output.tables(out.tables_doc(state.client.list_tables(database)))


@table_group.command("describe")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@common_options
@pass_state
@catch_errors
def table_describe(state: State, path: str) -> None:
    """Show a table's schema, primary key and buckets."""
    state.output.table(out.table_doc(state.client.get_table(path)))


@table_group.command("drop")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--if-exists", is_flag=True, help="Succeed if there is no such table (and say it did not exist).")
@common_options
@pass_state
@catch_errors
def table_drop(state: State, path: str, if_exists: bool) -> None:
    """Drop a table, its snapshots, and its buckets in every lease."""
    dropped = state.client.drop_table(path, ignore_if_not_exists=if_exists)
    text = f"dropped table {path}" if dropped else f"no table {path} (nothing to drop)"
    state.output.message(text, {"table": path, "dropped": dropped})
