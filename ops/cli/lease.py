"""``kvlease lease acquire|renew|release|drop|list|describe``: KV snapshot leases."""

from __future__ import annotations

import click

from kvlease.common.model import TableBucket
import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.partition_option import chosen, label, names_of, partition_names, partition_option
from kvlease.ops.cli.values import LEASE_ID, LEASE_OWNER, POSITIVE_DURATION, BucketList, BucketSnapshot, table_path

#: ``--owner``: the reader a lease belongs to (see "Owners" in docs/architecture.md, "Leases")
owner_option = click.option(
    "--owner", type=LEASE_OWNER, default=None, metavar="TOKEN",
    help="This reader's owner token: a lease owned by another token is left alone (acquire and renew fail, "
         "release and drop find no lease); a new lease belongs to it. Default: none (an unowned lease).")


@kvlease.group("lease")
def lease_group() -> None:
    """KV snapshot leases: keep snapshots from being deleted while they are read."""


@lease_group.command("acquire")
@click.argument("lease_id", type=LEASE_ID)
@click.option("--table", "path", required=True, metavar="DB.NAME", callback=table_path)
@click.option("--snapshot", "snapshots", type=BucketSnapshot(), multiple=True,
              help="Bucket and snapshot to hold, B=ID; repeat for more buckets.")
@click.option("--latest", is_flag=True,
              help="Hold the latest snapshot of every bucket (of a partitioned table without --partition: of "
                   "every bucket of every partition).")
@click.option("--duration", type=POSITIVE_DURATION, required=True, help="Lease duration from now, e.g. 10m.")
@partition_option
@owner_option
@common_options
@pass_state
@catch_errors
def lease_acquire(state: State, lease_id: str, path: str, snapshots: tuple[tuple[int, int], ...], latest: bool,
                  duration: int, partition: str | None, owner: str | None) -> None:
    """Create or update a lease on snapshots of a table (of a partitioned table: of --partition NAME's
    buckets, or with --latest alone of every partition's)."""
    if bool(snapshots) == latest:
        raise click.UsageError("give either --snapshot B=ID (one or more) or --latest")
    buckets_seen = [b for b, _ in snapshots]
    if len(set(buckets_seen)) != len(buckets_seen):
        raise click.BadParameter("a bucket is named twice", param_hint="'--snapshot'")
    view = chosen(state, state.client.get_table(path), partition, required=not latest)
    partitions = partition_names(state, view)
    no_snapshot: list[TableBucket] = []
    if latest:  # chosen by the coordinator as it acquires them
        result = state.client.acquire_latest_lease(lease_id, view.table_id, duration,
                                                   partition_id=view.partition_id, owner=owner)
        no_snapshot = [tb for tb in _buckets(view, partitions) if tb not in result.acquired]
    else:
        result = state.client.acquire_lease(lease_id, {view.bucket(b): sid for b, sid in snapshots}, duration,
                                            owner=owner)
    state.output.acquired(out.acquire_doc(result.lease_id, result.expiration_time, result.acquired,
                                          result.unavailable, {view.table_id: view.path}, no_snapshot, partitions))


def _buckets(view, partitions: dict[int, str]) -> list[TableBucket]:
    """Every bucket of ``view``: an unpartitioned table's, a partition's, or, of a partitioned table, those of
    every one of its ``partitions`` (partition id -> name)."""
    if not view.partitioned or view.partition_id is not None:
        return [view.bucket(b) for b in range(view.buckets)]
    return [TableBucket(view.table_id, b, partition_id) for partition_id in partitions for b in range(view.buckets)]


@lease_group.command("renew")
@click.argument("lease_id", type=LEASE_ID)
@click.option("--duration", type=POSITIVE_DURATION, required=True, help="New duration from now, e.g. 10m.")
@owner_option
@common_options
@pass_state
@catch_errors
def lease_renew(state: State, lease_id: str, duration: int, owner: str | None) -> None:
    """Move a lease's expiration to now + duration (never creates a lease)."""
    expiration = state.client.renew_lease(lease_id, duration, owner=owner)
    state.output.message(f"lease {lease_id} expires {out.format_time_ms(expiration)}",
                         {"lease_id": lease_id, "expiration_time": expiration})


@lease_group.command("release")
@click.argument("lease_id", type=LEASE_ID)
@click.option("--table", "path", required=True, metavar="DB.NAME", callback=table_path)
@click.option("--bucket", "buckets", type=BucketList(), multiple=True, required=True,
              help="Bucket(s) to free: repeat, or B,B,….")
@partition_option
@owner_option
@common_options
@pass_state
@catch_errors
def lease_release(state: State, lease_id: str, path: str, buckets: tuple[list[int], ...], partition: str | None,
                  owner: str | None) -> None:
    """Free some buckets of a lease; a lease left empty disappears.

    Safe to repeat: buckets the lease does not hold, or no such lease, are not
    an error (nothing is released, and it says so).
    """
    info = chosen(state, state.client.get_table(path), partition)
    numbers = sorted({b for group in buckets for b in group})
    result = state.client.release_lease(lease_id, [info.bucket(b) for b in numbers], owner=owner)
    named = f"{label(info)} bucket(s) {', '.join(map(str, numbers))}"
    if result.released:
        text = f"released {named} from lease {lease_id}"
        text += "" if result.lease_remains else f"; lease {lease_id} holds nothing more and is gone"
    elif result.lease_remains:
        text = f"lease {lease_id} holds none of {named}: nothing released"
    else:
        text = f"no lease {lease_id}{' of owner ' + owner if owner else ''} (nothing to release)"
    partition_doc = {"partition": info.partition_name} if info.partition_name else {}
    state.output.message(text, {"lease_id": lease_id, "table": info.path, **partition_doc, "buckets": numbers,
                                "released": result.released, "lease_remains": result.lease_remains})


@lease_group.command("drop")
@click.argument("lease_id", type=LEASE_ID)
@owner_option
@common_options
@pass_state
@catch_errors
def lease_drop(state: State, lease_id: str, owner: str | None) -> None:
    """Free every bucket of a lease (release all), whoever owns it unless --owner is given."""
    dropped = state.client.drop_lease(lease_id, owner=owner)
    text = (f"dropped lease {lease_id}" if dropped
            else f"no lease {lease_id}{' of owner ' + owner if owner else ''} (nothing to drop)")
    state.output.message(text, {"lease_id": lease_id, "dropped": dropped})


@lease_group.command("list")
@common_options
@pass_state
@catch_errors
def lease_list(state: State) -> None:
    """Every lease, with its deadline and buckets."""
    leases = state.client.list_leases()
    names, partitions = names_of(state, [tb for lease in leases for tb in lease.buckets])
    state.output.leases(out.leases_doc(leases, names, partitions))


@lease_group.command("describe")
@click.argument("lease_id", type=LEASE_ID)
@common_options
@pass_state
@catch_errors
def lease_describe(state: State, lease_id: str) -> None:
    """One lease: its deadline and the snapshot it holds per bucket."""
    lease = state.client.describe_lease(lease_id)
    names, partitions = names_of(state, lease.buckets)
    state.output.lease(out.lease_doc(lease, names, partitions))
