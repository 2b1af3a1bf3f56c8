"""``--partition NAME``: which partition's buckets a per-bucket command means (docs/partitions.md).

A partitioned table has no buckets of its own: each partition has its own
(its changelogs, snapshots, leases). The commands that read or act on buckets
(``scan``, ``log``, ``snapshot``, ``lease``, ``bucket``) take ``--partition
NAME``; on a partitioned table without it they are a usage error naming the
table's partitions (at most :data:`SHOWN`), except where a command says what it
does with every partition (``snapshot list``, ``lease acquire --latest``).
``--partition`` on an unpartitioned table, or a partition that does not exist,
is a one-line error (exit 1). The CLI prints a partition's bucket with the
partition's name, from its table's partition listing (:func:`names_of`).
"""

from __future__ import annotations

from typing import Iterable

import click

from kvlease.client.partitions_admin import find_partition
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo
from kvlease.ops.cli.app import State

#: How many of a table's partitions a usage error names.
SHOWN = 10

partition_option = click.option(
    "--partition", metavar="NAME", default=None,
    help="The partition whose buckets are meant (a partitioned table's; `kvlease partition list DB.NAME` "
         "lists them).")


def label(table: TableInfo) -> str:
    """``db.t``, or on a partition's view ``db.t partition 20261127``: what a line of output is about."""
    return table.path if table.partition_name is None else f"{table.path} partition {table.partition_name}"


def missing_partition(state: State, table: TableInfo) -> click.UsageError:
    """The usage error of a per-bucket command on partitioned ``table`` without ``--partition``."""
    _table, partitions = state.client.list_partitions(table_id=table.table_id)
    names = [p.name for p in partitions]
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    there = f"its partitions: {', '.join(names[:SHOWN])}{more}" if names else "it has no partitions yet"
    return click.UsageError(f"table {table.path} is partitioned: give --partition NAME ({there})")


def chosen(state: State, table: TableInfo, name: str | None, *, required: bool = True) -> TableInfo:
    """``table``, or its view of partition ``name``. Without a name, a partitioned table is a usage error
    (:func:`missing_partition`) if ``required``, else ``table`` itself (every partition's buckets)."""
    if name is not None:
        return find_partition(state.client, table, name)
    if table.partitioned and required:
        raise missing_partition(state, table)
    return table


def bucket_client(state: State, path: str, name: str | None):
    """A :class:`kvlease.client.table.TableClient` of the buckets of table ``path`` (of its partition ``name``);
    a partitioned table without ``name`` is a usage error (:func:`missing_partition`)."""
    if name is not None:
        return state.table_client(path, find_partition(state.client, state.client.get_table(path), name))
    client = state.table_client(path)
    if client.table.partitioned:
        raise missing_partition(state, client.table)
    return client


def partition_names(state: State, table: TableInfo) -> dict[int, str]:
    """``partition id -> name`` of a partitioned ``table``'s partitions (a partition's view: its own); none of
    an unpartitioned table."""
    if table.partition_id is not None:
        return {table.partition_id: table.partition_name}
    if not table.partitioned:
        return {}
    return {p.partition_id: p.name for p in state.client.list_partitions(table_id=table.table_id)[1]}


def names_of(state: State, buckets: Iterable[TableBucket]) -> tuple[dict[int, str], dict[int, str]]:
    """``(table id -> DB.NAME, partition id -> partition name)`` for printing ``buckets``: every table, and the
    partitions of the tables some of whose partitions' buckets are among them (one listing each)."""
    buckets = list(buckets)
    if not buckets:
        return {}, {}
    tables = {info.table_id: info for info in state.client.list_tables()}
    partitioned = {tb.table_id for tb in buckets if tb.partition_id is not None and tb.table_id in tables}
    partitions: dict[int, str] = {}
    for table_id in sorted(partitioned):
        _table, listed = state.client.list_partitions(table_id=table_id)
        partitions.update((p.partition_id, p.name) for p in listed)
    return {table_id: info.path for table_id, info in tables.items()}, partitions
