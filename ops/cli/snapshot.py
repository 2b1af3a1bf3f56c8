"""``kvlease snapshot list|trigger``: completed KV snapshots."""

from __future__ import annotations

import click

import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.partition_option import bucket_client, chosen, label, partition_names, partition_option
from kvlease.ops.cli.values import table_path


@kvlease.group("snapshot")
def snapshot_group() -> None:
    """Completed KV snapshots."""


@snapshot_group.command("list")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@partition_option
@common_options
@pass_state
@catch_errors
def snapshot_list(state: State, path: str, partition: str | None) -> None:
    """Every kept snapshot of every bucket, with the leases that hold it; of a partitioned table, of every
    partition (each named), or of --partition NAME's buckets."""
    view = chosen(state, state.client.get_table(path), partition, required=False)
    snapshots = state.client.list_kv_snapshots(view.table_id, view.partition_id)
    state.output.snapshots(out.snapshots_doc(view.path, snapshots, partition_names(state, view), view.partition_name))


@snapshot_group.command("trigger")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--wait", is_flag=True, help="Wait until the snapshots are committed, and list them.")
@partition_option
@common_options
@pass_state
@catch_errors
def snapshot_trigger(state: State, path: str, wait: bool, partition: str | None) -> None:
    """Snapshot every bucket that changed since its last snapshot, now (a partitioned table's: of
    --partition NAME).

    With --wait: each bucket's snapshot as of now (committed now, or unchanged since an earlier one),
    progress on stderr as buckets finish; exit code 1 naming the buckets not committed, if any.
    """
    from kvlease.client.snapshot_trigger import FAILED, raise_failed, trigger_snapshots

    client = bucket_client(state, path, partition)
    table = client.table
    outcomes = trigger_snapshots(client, wait=wait, on_outcome=show_progress(label(table)) if wait else None)
    if all(o.state == FAILED for o in outcomes):
        raise_failed(outcomes, label(table))  # nothing to list: just the error
    state.output.committed(out.committed_doc(table.path, outcomes, wait, table.partition_name))
    raise_failed(outcomes, label(table))


def show_progress(table: str):
    """An ``on_outcome`` for :func:`kvlease.client.snapshot_trigger.trigger_snapshots`: a line on stderr per bucket
    done (failures are listed at the end)."""
    from kvlease.client.snapshot_trigger import EMPTY, FAILED, UNCHANGED

    def show(outcome, done: int, total: int) -> None:
        if outcome.state == FAILED:
            return
        if outcome.state == EMPTY:
            what = "empty, nothing to snapshot"
        elif outcome.state == UNCHANGED:
            what = f"unchanged since snapshot {outcome.snapshot.snapshot_id}"
        else:
            what = f"committed as snapshot {outcome.snapshot.snapshot_id}"
        click.echo(f"{table}: bucket {outcome.bucket} {what} ({done}/{total} buckets done)", err=True)
    return show
