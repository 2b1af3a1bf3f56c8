"""``kvlease snapshot list|trigger``: completed KV snapshots."""

from __future__ import annotations

import click

from ops import output as out
from ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from ops.cli.values import table_path


@kvlease.group("snapshot")
def snapshot_group() -> None:
    """Completed KV snapshots."""


@snapshot_group.command("list")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@common_options
@pass_state
@catch_errors
def snapshot_list(state: State, path: str) -> None:
    """Every kept snapshot of every bucket, with the leases that hold it."""
    info = state.client.get_table(path)
    state.output.snapshots(out.snapshots_doc(info.path, state.client.list_kv_snapshots(info.table_id)))


@snapshot_group.command("trigger")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--wait", is_flag=True, help="Wait until the snapshots are committed, and list them.")
@common_options
@pass_state
@catch_errors
def snapshot_trigger(state: State, path: str, wait: bool) -> None:
    """Snapshot every bucket that changed since its last snapshot, now."""
    client = state.table_client(path)
    committed = client.trigger_snapshot(wait=wait)
    state.output.committed(out.committed_doc(client.table.path, committed, wait))
