"""``kvlease partition add|drop|list``: a partitioned table's partitions (docs/partitions.md).

A partition is named by its partition-key values: the value itself with one
partition column (``20261127``), ``column=value`` joined by ``/`` with several
(``region=eu/day=20261127``). Writes create the partitions they need; ``add``
makes one ahead, ``drop`` is the operator's word (it leaves every lease that
holds it, its data and snapshots are deleted), ``list`` shows each with its id,
when it was made, and the leases that keep it past its table's retention.
"""

from __future__ import annotations

import click

from kvlease.common import errors
import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.values import table_path


@kvlease.group("partition")
def partition_group() -> None:
    """A partitioned table's partitions: add, drop, list."""


@partition_group.command("add")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("name", metavar="NAME")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the partition exists already (and say so).")
@common_options
@pass_state
@catch_errors
def partition_add(state: State, path: str, name: str, if_not_exists: bool) -> None:
    """Create partition NAME of a partitioned table (e.g. 20261127, or region=eu/day=20261127 for several
    partition columns); its buckets are placed like a new table's."""
    existed = if_not_exists and _exists(state, path, name)
    table, partition = state.client.create_partition(path, name, ignore_if_exists=if_not_exists)
    if existed:
        text = (f"partition {partition.name} of {table.path} already exists (id {partition.partition_id}): "
                "nothing created")
    else:
        text = (f"created partition {partition.name} of {table.path} (id {partition.partition_id}, "
                f"{table.buckets} buckets)")
    state.output.message(text, {"table": table.path, **out.partition_doc(partition), "created": not existed})


def _exists(state: State, path: str, name: str) -> bool:
    """Whether ``path`` has partition ``name`` (as the coordinator normalises it)."""
    from kvlease.client.partitions_admin import find_partition

    try:
        find_partition(state.client, state.client.get_table(path), name)
        return True
    except errors.PartitionNotExistsError:
        return False


@partition_group.command("drop")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("name", metavar="NAME")
@click.option("--if-exists", is_flag=True, help="Succeed if there is no such partition (and say it did not exist).")
@common_options
@pass_state
@catch_errors
def partition_drop(state: State, path: str, name: str, if_exists: bool) -> None:
    """Drop partition NAME: it leaves every lease that holds it, then its snapshots, data and files are
    deleted. No other partition is touched."""
    dropped = state.client.drop_partition(path, name, ignore_if_not_exists=if_exists)
    text = f"dropped partition {name} of {path}" if dropped else f"no partition {name} of {path} (nothing to drop)"
    state.output.message(text, {"table": path, "partition": name, "dropped": dropped})


@partition_group.command("list")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@common_options
@pass_state
@catch_errors
def partition_list(state: State, path: str) -> None:
    """A partitioned table's partitions: name, id, when made, and the leases that keep one past its table's
    retention (it is dropped once they release it or expire)."""
    table, partitions = state.client.list_partitions(path)
    if not table.partitioned:
        raise errors.InvalidRequestError(f"table {table.path} is not partitioned: it has no partitions")
    state.output.partitions(out.partitions_doc(table.path, partitions))
