"""``kvlease table create|alter|list|describe|drop``.

A partitioned table (docs/partitions.md) is made with ``--partition-by`` (and,
auto-partitioned by time, ``--auto-partition UNIT``); its definition is checked
by the coordinator's own rules before anything is sent, so a bad one is a
usage error. ``alter`` changes its schema, one change at a time (docs/schemas.md,
"Schema evolution"), or its auto-partitioning and partition limit; ``describe``
shows its schema and the schema's history, its partitions and each one's buckets.
"""

from __future__ import annotations

import click

from kvlease.common import errors
from kvlease.common.auto_partition import (DEFAULT_PRECREATE, DEFAULT_RETENTION, DEFAULT_TIME_ZONE, AutoPartition,
                                           TimeUnit, zone)
from kvlease.common.tables import (DEFAULT_MAX_PARTITIONS, MAX_BUCKETS, MAX_PARTITIONS, TableInfo, TableSpec,
                                   parse_schema, parse_table_path, validate_spec)
from kvlease.common.row_ttl import CHANGELOG_MODES, row_ttl
from kvlease.common.merge_engine import parse_aggregates, parse_engine
from kvlease.common.schema_changes import parse_definition
import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.values import bucket_number, table_path


@kvlease.group("table")
def table_group() -> None:
    """Create, list, describe, alter and drop tables."""


@table_group.command("create")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--schema", required=True,
              help='Columns, e.g. "id BIGINT, amount DECIMAL(12,2), day DATE, tags ARRAY<STRING>". Types: BOOLEAN, '
                   "TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, DECIMAL(p,s), STRING, BYTES, DATE, TIME, TIMESTAMP, "
                   "TIMESTAMP_NTZ, ARRAY<T>, MAP<K,V>, STRUCT<name T, ...> (not in the primary key: the last three); "
                   "docs/schemas.md.")
@click.option("--primary-key", required=True, metavar="COL[,COL…]", help="Primary key column(s).")
@click.option("--buckets", type=bucket_number(1), required=True, help=f"Number of buckets (at most {MAX_BUCKETS}).")
@click.option("--replication-factor", type=click.IntRange(min=1), metavar="N",
              help="Replicas per bucket, on distinct tablet servers (default: the coordinator's "
                   "default.replication-factor, 1); at most the live tablet servers.")
@click.option("--min-insync-replicas", type=click.IntRange(min=1), metavar="M",
              help="In-sync replicas a write needs (default: min.insync-replicas, 1; at most N).")
@click.option("--if-not-exists", is_flag=True,
              help="Succeed if the table exists already with this definition (an error if it differs).")
@click.option("--partition-by", metavar="COL[,COL…]",
              help="Partition key: primary-key columns (STRING, INT, BIGINT or BOOLEAN) whose values name a "
                   "partition; each partition has --buckets buckets of its own.")
@click.option("--auto-partition", "unit", metavar="UNIT",
              help=f"Partitions by time, made ahead and dropped past retention by the coordinator: "
                   f"{', '.join(TimeUnit.__members__)} (one STRING partition column).")
@click.option("--precreate", type=click.IntRange(min=0), metavar="N",
              help=f"Auto-partitioning: the current partition and the next N-1 exist (default {DEFAULT_PRECREATE}).")
@click.option("--retention", type=int, metavar="N",
              help=f"Auto-partitioning: keep the N partitions before the current one, drop older ones "
                   f"(default {DEFAULT_RETENTION}; negative: drop none).")
@click.option("--time-zone", metavar="ZONE",
              help=f"Auto-partitioning: the IANA time zone of partition values (default {DEFAULT_TIME_ZONE}).")
@click.option("--max-partitions", type=int, metavar="N",
              help=f"table.partition.max: the most partitions at once (default {DEFAULT_MAX_PARTITIONS}, "
                   f"at most {MAX_PARTITIONS}).")
@click.option("--ttl", metavar="DURATION",
              help="Row TTL, e.g. 7d, 12h, 30m, 90s: a row expires this long after its --ttl-column value (else "
                   "its write time); lookups and scans skip it, the leader deletes it (docs/changelog.md, 'Row TTL').")
@click.option("--ttl-column", metavar="COL",
              help="The TIMESTAMP (TIMESTAMP_LTZ) or BIGINT epoch-ms column the TTL counts from (default: the "
                   "write time, kept in an added column _write_time).")
@click.option("--ttl-changelog", type=click.Choice(CHANGELOG_MODES), metavar="|".join(CHANGELOG_MODES),
              help="delete (default): expiry deletes are -D records of the change feed; none: the feed skips them.")
@click.option("--bucket-key", metavar="COL[,COL…]",
              help="The first primary-key column(s) whose values pick a row's bucket (default: the whole key): rows "
                   "with the same values share a bucket, and `kvlease get --prefix` reads them in one range scan.")
@click.option("--merge-engine", type=click.Choice(["first_row", "versioned", "aggregation"]),
              help="What a write to an existing key does (default: the last write wins): keep the first row, keep "
                   "the highest --version-column, or aggregate per column (--agg); docs/merge-engines.md.")
@click.option("--version-column", metavar="COL", help="versioned: the INT, BIGINT or TIMESTAMP column that decides.")
@click.option("--agg", "aggregates", metavar="COL=FUNCTION", multiple=True,
              help="aggregation: a column's function (repeatable): sum, product, max, min, last_value, "
                   "last_value_ignore_nulls (the default), first_value, first_value_ignore_nulls, listagg, "
                   "bool_and, bool_or.")
@click.option("--delete-behavior", type=click.Choice(["allow", "ignore", "disable"]),
              help="versioned and aggregation: what a delete by key does (default allow).")
@common_options
@pass_state
@catch_errors
def table_create(state: State, path: str, schema: str, primary_key: str, buckets: int, if_not_exists: bool,
                 replication_factor: int | None, min_insync_replicas: int | None, **definition) -> None:
    """Create a primary-key table (partitioned with --partition-by, a merge engine with --merge-engine, a row TTL
    with --ttl, a bucket key with --bucket-key)."""
    if replication_factor and min_insync_replicas and min_insync_replicas > replication_factor:
        raise click.UsageError(f"--min-insync-replicas {min_insync_replicas} is more than --replication-factor "
                               f"{replication_factor}")
    try:
        columns = parse_schema(schema)
    except errors.KvLeaseError as exc:
        raise click.BadParameter(exc.message, param_hint="'--schema'") from None
    keys = [k.strip() for k in primary_key.split(",") if k.strip()]
    spec = _spec(path, columns, keys, buckets, **definition)
    existed = if_not_exists and _exists(state, path)
    options = {k: v for k, v in (("replication_factor", replication_factor),
                                 ("min_insync_replicas", min_insync_replicas), ("row_ttl", spec.row_ttl),
                                 ("merge_engine", spec.merge_engine)) if v is not None}
    if spec.partition_key:
        options.update(partition_key=spec.partition_key, auto_partition=spec.auto_partition,
                       max_partitions=spec.max_partitions)
    if spec.bucket_key:
        options["bucket_key"] = spec.bucket_key
    info = state.client.create_table(path, columns, keys, buckets, ignore_if_exists=if_not_exists, **options)
    doc = {**out.table_doc(info), "created": not existed}
    if info.partitioned:  # an auto-partitioned table's first ones are made with it
        doc["partitions"] = [out.partition_doc(p) for p in state.client.list_partitions(table_id=info.table_id)[1]]
    no_leader = _without_leader(state, info)
    state.output.message(_created_text(info, existed, doc.get("partitions")), {**doc, "no_leader": no_leader})
    if no_leader:
        click.echo(f"warning: {_no_leader_warning(state, info.path, no_leader)}", err=True)


def _agg_options(given: tuple[str, ...]) -> dict[str, str]:
    """``--agg COL=FUNCTION`` options as ``{column: function}``; a usage error naming the option."""
    try:
        return parse_aggregates(given)
    except errors.InvalidTableError as exc:
        raise click.BadParameter(exc.message, param_hint="'--agg'") from None

def _spec(path: str, columns, keys: list[str], buckets: int, ttl: str | None, ttl_column: str | None,
          ttl_changelog: str | None, bucket_key: str | None, merge_engine: str | None, version_column: str | None,
          aggregates: tuple[str, ...], delete_behavior: str | None, **partitioning) -> TableSpec:
    """The table ``table create``'s options define, checked by the coordinator's own rules before anything is
    sent: a definition it would refuse is a usage error."""
    db, name = parse_table_path(path)
    if ttl is None and (ttl_column or ttl_changelog):
        raise click.UsageError("--ttl-column and --ttl-changelog need --ttl DURATION")
    try:
        expiry = None if ttl is None else row_ttl(ttl, ttl_column, ttl_changelog)
        engine = parse_engine(merge_engine, version_column, _agg_options(aggregates), delete_behavior)
        return validate_spec(TableSpec(db, name, columns, tuple(keys), buckets, **_partitioning(**partitioning),
                                       row_ttl=expiry, merge_engine=engine,
                                       bucket_key=tuple(k.strip() for k in (bucket_key or "").split(",") if k.strip())))
    except errors.InvalidTableError as exc:
        raise click.UsageError(exc.message) from None


def _partitioning(partition_by: str | None, unit: str | None, precreate: int | None, retention: int | None,
                  time_zone: str | None, max_partitions: int | None) -> dict:
    """The partitioning fields of a TableSpec from ``table create``'s options: a usage error for an option that
    needs another one and for a bad unit or zone (named on its option); InvalidTableError from the coordinator's
    own rules for the rest (AutoPartition's checks)."""
    auto_options = [flag for flag, value in (("--precreate", precreate), ("--retention", retention),
                                             ("--time-zone", time_zone)) if value is not None]
    if partition_by is None:
        needing = [flag for flag, value in (("--auto-partition", unit), ("--max-partitions", max_partitions))
                   if value is not None] + auto_options
        if needing:
            raise click.UsageError(f"{', '.join(needing)} need{'s' if len(needing) == 1 else ''} --partition-by COL "
                                   "(they are settings of a partitioned table)")
        return {}
    if unit is None and auto_options:
        raise click.UsageError(f"{', '.join(auto_options)} need{'s' if len(auto_options) == 1 else ''} "
                               "--auto-partition UNIT (they are settings of auto-partitioning)")
    auto = None
    if unit is not None:
        for flag, check, value in (("--auto-partition", TimeUnit.parse, unit), ("--time-zone", zone, time_zone)):
            try:
                if value is not None:
                    check(value)
            except errors.InvalidTableError as exc:
                raise click.BadParameter(exc.message, param_hint=f"'{flag}'") from None
        auto = AutoPartition(TimeUnit.parse(unit), DEFAULT_PRECREATE if precreate is None else precreate,
                             DEFAULT_RETENTION if retention is None else retention, time_zone or DEFAULT_TIME_ZONE)
    key = tuple(k.strip() for k in partition_by.split(",") if k.strip())
    return {"partition_key": key, "auto_partition": auto,
            "max_partitions": DEFAULT_MAX_PARTITIONS if max_partitions is None else max_partitions}


def _created_text(info: TableInfo, existed: bool, partitions: list[dict] | None) -> str:
    if existed:  # the coordinator checked that its definition is the one asked for
        return f"table {info.path} already exists with this definition (id {info.table_id}): nothing created"
    per = " per partition" if info.partitioned else ""
    text = f"created table {info.path} (id {info.table_id}, {info.buckets} buckets{per}"
    if info.replication_factor > 1:
        text += f", replication factor {info.replication_factor}, min in-sync replicas {info.min_insync_replicas}"
    text += ")"
    if info.row_ttl is not None:
        text += f", row TTL {info.row_ttl.describe()}"
    if info.partitioned:
        text += (f", partitioned by {out.partitioning_text(out.table_doc(info))}, at most {info.max_partitions} "
                 "partitions")
    if info.merge_engine is not None:
        text += f", merge engine {info.merge_engine.describe()}"
    if info.auto_partition is not None:
        names = [p["partition"] for p in partitions or ()]
        text += f"; partitions now: {', '.join(names) if names else 'none'}"
    return text


def _without_leader(state: State, info: TableInfo) -> list[int]:
    """The buckets of a table that no tablet server leads (the coordinator found none live with room); none
    for a partitioned table, which has no buckets of its own (its partitions have)."""
    if info.partitioned:
        return []
    _, leaders = state.client.get_table_assignment(info.table_id)
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
    """Show a table's schema (types, field ids, comments), schema id and the history of its schema, its primary
    key, replication, and per bucket its replicas, leader, ISR and leader epoch; a partitioned table's
    partitioning, and per partition its id, when it was made and its buckets."""
    info, versions = state.client.schema_history(path)
    doc = {**out.table_doc(info), "history": [v.to_json() for v in versions]}
    if not info.partitioned:
        _table, leaders = state.client.get_table_assignment(info.table_id)
        state.output.table({**doc, "assignment": out.assignment_docs(leaders)})
        return
    _table, assignments = state.client.partition_assignments(info.table_id)
    partitions = [{**out.partition_doc(p), "assignment": out.assignment_docs(assignments.get(p.partition_id, {}))}
                  for p in state.client.list_partitions(table_id=info.table_id)[1]]
    state.output.table({**doc, "assignment": [], "partitions": partitions})


@table_group.command("alter")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--add-column", metavar="\"NAME TYPE [COMMENT '…']\"",
              help="Add a nullable column at the end (docs/schemas.md, \"Schema evolution\").")
@click.option("--rename-column", nargs=2, metavar="OLD NEW", help="Rename a column (not a key column).")
@click.option("--widen-column", metavar="\"NAME TYPE\"",
              help="Give a column a wider type: TINYINT -> SMALLINT -> INT -> BIGINT, FLOAT -> DOUBLE, a DECIMAL's "
                   "precision up (same scale).")
@click.option("--drop-column", metavar="NAME", help="Drop a column (not a key column); its data is no longer read.")
@click.option("--comment", metavar="TEXT", help="Set the table's comment (\"\": none).")
@click.option("--precreate", type=click.IntRange(min=0), metavar="N",
              help="Auto-partitioning: the current partition and the next N-1 exist.")
@click.option("--retention", type=int, metavar="N",
              help="Auto-partitioning: keep the N partitions before the current one (negative: drop none).")
@click.option("--max-partitions", type=click.IntRange(1, MAX_PARTITIONS), metavar="N",
              help="table.partition.max: the most partitions the table has at once.")
@common_options
@pass_state
@catch_errors
def table_alter(state: State, path: str, precreate: int | None, retention: int | None,
                max_partitions: int | None, **schema) -> None:
    """Change a table's schema, one change at a time (--add-column, --rename-column, --widen-column,
    --drop-column, --comment: each makes its schema id one more), or a partitioned table's
    auto-partitioning (--precreate, --retention) or partition limit (--max-partitions); the coordinator checks
    the table's partitions with these at once."""
    changes = {k: v for k, v in schema.items() if v is not None}
    partitioning = {k: v for k, v in (("precreate", precreate), ("retention", retention),
                                      ("max_partitions", max_partitions)) if v is not None}
    if not changes and not partitioning:
        raise click.UsageError("nothing to change: give --add-column, --rename-column, --widen-column, "
                               "--drop-column, --comment, --precreate, --retention or --max-partitions")
    if changes:
        _check_one_change(changes, partitioning)
        info = state.client.alter_table(path, **changes)
        asked = ", ".join(f"{_flag(k)} {' '.join(v) if isinstance(v, tuple) else repr(v)}" for k, v in changes.items())
        state.output.message(f"altered table {info.path}: {asked} (schema id {info.schema_id})", out.table_doc(info))
        return
    info = state.client.alter_table(path, **partitioning)
    text = (f"altered table {info.path}: partitioned by {out.partitioning_text(out.table_doc(info))}, at most "
            f"{info.max_partitions} partitions (the coordinator checks its partitions with these at once)")
    state.output.message(text, out.table_doc(info))


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _check_one_change(changes: dict, partitioning: dict) -> None:
    """A usage error unless ``changes`` is one schema change, without partitioning settings, whose column
    definition (``--add-column``, ``--widen-column``) reads (the coordinator's own parser)."""
    flags = [_flag(k) for k in [*changes, *partitioning]]
    if len(flags) > 1:
        raise click.UsageError(f"one schema change at a time, and no other setting with it: got {', '.join(flags)}")
    for option in ("add_column", "widen_column"):
        if option in changes:
            try:
                parse_definition(changes[option])
            except errors.InvalidTableError as exc:
                raise click.BadParameter(exc.message, param_hint=f"'{_flag(option)}'") from None


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

