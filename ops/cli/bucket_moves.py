"""``kvlease bucket reassign``: move one bucket's replicas to other tablet servers."""

from __future__ import annotations

import click

from kvlease.ops.cli.app import State, catch_errors, common_options, pass_state
from kvlease.ops.cli.bucket import bucket_group
from kvlease.ops.cli.cluster_moves import move_key, move_text, wait_for_moves
from kvlease.ops.cli.documents import where
from kvlease.ops.cli.partition_option import chosen
from kvlease.ops.cli.values import POSITIVE_DURATION, bucket_number, table_path


def replica_list(_ctx, _param, value: str) -> list[int]:
    """``--replicas 1,2,4``: tablet ids."""
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of tablet ids, e.g. 1,2,4") from None


@bucket_group.command("reassign")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--partition", metavar="NAME",
              help="The partition whose bucket moves (a partitioned table's; `kvlease partition list DB.NAME`).")
@click.option("--bucket", type=bucket_number(), required=True, metavar="B")
@click.option("--replicas", required=True, metavar="ID,ID,…", callback=replica_list,
              help="The tablet servers to hold the bucket, the preferred leader first; as many as the table's "
                   "replication factor.")
@click.option("--wait", is_flag=True, help="Wait until the move is complete.")
@click.option("--timeout", "timeout_ms", type=POSITIVE_DURATION, default="30m", show_default=True,
              help="How long --wait waits.")
@common_options
@pass_state
@catch_errors
def bucket_reassign(state: State, path: str, partition: str | None, bucket: int, replicas: list[int], wait: bool,
                    timeout_ms: int) -> None:
    """Move a bucket's replicas: the new ones copy the bucket (from the leader, or the remote snapshot) and join
    the ISR; then the leader moves if it is not among them, and the old ones leave and delete their copy.
    Safe to run again with the same replicas (it answers the move in progress)."""
    if partition is None:
        chosen(state, state.client.get_table(path), None)  # a partitioned table's bucket needs --partition
    move = state.client.reassign_bucket(path, bucket, replicas, partition=partition)
    if wait and move["state"] == "moving":
        wait_for_moves(state, [move_key(move)], timeout_ms)
        move = {**move, "state": "done", "replicas": move["target"], "waiting": [], "removing": []}
    if move["state"] == "done":
        text = f"bucket {bucket} of {where(move)} is on tablet servers {move['target']}"
    else:
        text = f"moving bucket {bucket} of {where(move)}: {move_text(move)}"
    state.output.message(text, move)
