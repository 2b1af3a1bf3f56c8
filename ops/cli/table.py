"""``kvlease table create|list|describe|drop``."""

from __future__ import annotations

import click

from kvlease.common import errors
from kvlease.common.tables import MAX_BUCKETS, TableSpec, parse_schema, parse_table_path, validate_spec
import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.values import bucket_number, table_path


@kvlease.group("table")
def table_group() -> None:
    """Create, list, describe and drop tables."""


@table_group.command("create")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--schema", required=True, help='Columns, e.g. "id BIGINT, name STRING".')
@click.option("--primary-key", required=True, metavar="COL[,COL…]", help="Primary key column(s).")
@click.option("--buckets", type=bucket_number(1), required=True, help=f"Number of buckets (at most {MAX_BUCKETS}).")
@click.option("--replication-factor", type=click.IntRange(min=1), metavar="N",
              help="Replicas per bucket, on distinct tablet servers (default: the coordinator's "
                   "default.replication-factor, 1); at most the live tablet servers.")
@click.option("--min-insync-replicas", type=click.IntRange(min=1), metavar="M",
              help="In-sync replicas a write needs (default: min.insync-replicas, 1; at most N).")
@click.option("--if-not-exists", is_flag=True,
              help="Succeed if the table exists already with this definition (an error if it differs).")
@common_options
@pass_state
@catch_errors
def table_create(state: State, path: str, schema: str, primary_key: str, buckets: int, if_not_exists: bool,
                 replication_factor: int | None, min_insync_replicas: int | None) -> None:
    """Create a primary-key table."""
    if replication_factor and min_insync_replicas and min_insync_replicas > replication_factor:
        raise click.UsageError(f"--min-insync-replicas {min_insync_replicas} is more than --replication-factor "
                               f"{replication_factor}")
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
    replication = {k: v for k, v in (("replication_factor", replication_factor),
                                     ("min_insync_replicas", min_insync_replicas)) if v is not None}
    info = state.client.create_table(path, columns, keys, buckets, ignore_if_exists=if_not_exists, **replication)
    if existed:  # the coordinator checked that its definition is the one asked for
        text = f"table {info.path} already exists with this definition (id {info.table_id}): nothing created"
    else:
        text = f"created table {info.path} (id {info.table_id}, {info.buckets} buckets)"
        if info.replication_factor > 1:
            text = (f"{text[:-1]}, replication factor {info.replication_factor}, min in-sync replicas "
                    f"{info.min_insync_replicas})")
    no_leader = _without_leader(state, info.table_id)
    state.output.message(text, {**out.table_doc(info), "created": not existed, "no_leader": no_leader})
    if no_leader:
        click.echo(f"warning: {_no_leader_warning(state, info.path, no_leader)}", err=True)


def _without_leader(state: State, table_id: int) -> list[int]:
    """The buckets of a table that no tablet server leads (the coordinator found none live with room)."""
    _, leaders = state.client.get_table_assignment(table_id)
    return [b for b, leader in sorted(leaders.items()) if leader.leader_id < 0]


def _no_leader_warning(state: State, path: str, buckets: list[int]) -> str:
    """Why a new table's buckets have no leader, and what to do, in a sentence."""
    shown = ", ".join(map(str, buckets[:10])) + (f" and {len(buckets) - 10} more" if len(buckets) > 10 else "")
    if state.client.list_tablet_servers():
        why = ("every live tablet server leads as many buckets as it may (tablet.buckets.max): start another "
               "tablet server or raise tablet.buckets.max")
    else:
        directory = state.cluster if state.cluster and not state.bootstrap else "D"
        why = (f"no tablet server is running in the cluster: start one (a local cluster: kvlease cluster stop "
               f"--dir {directory}, then kvlease cluster start --dir {directory} --tablets 1)")
    return (f"bucket(s) {shown} of {path} have no leader, so put, get, scan and log fail ('no leader assigned') "
            f"until a tablet server takes them; {why}")


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
    """Show a table's schema, primary key, replication, and per bucket its replicas, leader, ISR and leader
    epoch."""
    info = state.client.get_table(path)
    _table, leaders = state.client.get_table_assignment(info.table_id)
    state.output.table({**out.table_doc(info), "assignment": out.assignment_docs(leaders)})


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

