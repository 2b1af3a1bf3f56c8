"""``kvlease bucket restore|elect``: bring back a bucket whose data is lost, or choose a bucket's leader.

``restore DB.T --bucket B --accept-data-loss [--tablet N] [--partition P]``: only for a bucket
offline because its data is lost (its disk was wiped, its files are corrupt,
and no in-sync replica has them) or because none of its replicas is live (their
servers gone for good): it restarts from its latest kept snapshot (none: empty
at offset 0), the changes after it are lost, and the loss is recorded (``table
describe`` shows it; streaming queries that read past it fail with DATA_LOST).
With no live replica (or ``--tablet`` naming a server outside them) it moves
onto ``--tablet`` (default: the least loaded live server with room that is not
decommissioned), the dead replicas replaced. Without the flag it says what
would be lost and changes nothing.
``elect DB.T --bucket B [--unclean] [--tablet N] [--partition P]``: a clean election of an
in-sync replica, or with ``--unclean`` (an offline replicated bucket) an
out-of-sync replica leads and what it missed is lost. Both are idempotent. A
partitioned table's bucket is its partition's: ``--partition`` names it.
"""

from __future__ import annotations

import click

from kvlease.ops.cli.app import State, catch_errors, common_options, pass_state
from kvlease.ops.cli.bucket import bucket_group
from kvlease.ops.cli.documents import loss_doc, where
from kvlease.ops.cli.partition_option import chosen, partition_option
from kvlease.ops.cli.values import bucket_number, table_path


def _lost_text(loss) -> str:
    lost = loss.lost_offsets()
    if lost is not None:
        return f"{lost} changelog offsets lost ({loss.from_offset}..{loss.last_known_end - 1})" if lost else \
            "no committed changelog offset lost"
    if not loss.resolved:
        return "changelog offsets lost: known once the new leader reports its log end (see table describe)"
    return ("changelog offsets lost: unknown (no log end of the bucket was reported since the active "
            "coordinator started)")


def _check_partition(state: State, path: str, partition: str | None) -> None:
    """A partitioned table's bucket needs ``--partition`` (a usage error naming its partitions)."""
    if partition is None:
        chosen(state, state.client.get_table(path), None)


def _head(result: dict) -> dict:
    """``{"table", "partition"?}`` of a restore's or an election's answer."""
    return {"table": result["table"], **({"partition": result["partition"]} if result.get("partition") else {})}


@bucket_group.command("restore")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--bucket", type=bucket_number(), required=True, help="The bucket to restore.")
@click.option("--accept-data-loss", is_flag=True,
              help="Accept losing every change after the latest kept snapshot (required).")
@click.option("--tablet", type=bucket_number(), default=None, metavar="N",
              help="The live tablet server to restore onto (default: a live replica, else the least loaded "
                   "live server).")
@partition_option
@common_options
@pass_state
@catch_errors
def bucket_restore(state: State, path: str, bucket: int, accept_data_loss: bool, tablet: int | None,
                   partition: str | None) -> None:
    """Restore a bucket whose data is lost, or whose replicas' servers are gone, from its latest kept snapshot."""
    _check_partition(state, path, partition)
    result = state.client.restore_bucket(path, bucket, accept_data_loss, tablet, partition)
    loss = result["loss"]
    source = f"snapshot {loss.snapshot_id} (log offset {loss.from_offset})" if loss.snapshot_id else \
        "nothing (no snapshot kept: it restarts empty at offset 0)"
    text = (f"bucket {bucket} of {where(result)} restored from {source}; led by tablet server {result['leader']} "
            f"at leader epoch {result['leader_epoch']} (replicas {', '.join(map(str, result['replicas']))}); "
            f"{_lost_text(loss)}")
    if len(result["replicas"]) < result["replication_factor"]:
        text += (f"; only {len(result['replicas'])} of its {result['replication_factor']} replicas: no other live "
                 "tablet server with room (`kvlease bucket reassign` adds them later)")
    state.output.message(text, {**_head(result), "bucket": bucket, "leader": result["leader"],
                                "leader_epoch": result["leader_epoch"], "replicas": result["replicas"],
                                "loss": loss_doc(loss)})


@bucket_group.command("elect")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--bucket", type=bucket_number(), required=True, help="The bucket whose leader to elect.")
@click.option("--unclean", is_flag=True,
              help="An offline bucket: let an out-of-sync replica lead, losing what it missed.")
@click.option("--tablet", type=bucket_number(), default=None, metavar="N",
              help="The tablet server to lead (default: the first live candidate).")
@partition_option
@common_options
@pass_state
@catch_errors
def bucket_elect(state: State, path: str, bucket: int, unclean: bool, tablet: int | None,
                 partition: str | None) -> None:
    """Elect a bucket's leader: an in-sync replica, or with --unclean any live replica of an offline bucket."""
    _check_partition(state, path, partition)
    result = state.client.elect_leader(path, bucket, unclean, tablet, partition)
    loss = result["loss"]
    text = (f"bucket {bucket} of {where(result)}: led by tablet server {result['leader']} at leader epoch "
            f"{result['leader_epoch']} (ISR {', '.join(map(str, result['isr']))})")
    if loss is not None:
        text += f"; unclean election: {_lost_text(loss)}"
    state.output.message(text, {**_head(result), "bucket": bucket, "leader": result["leader"],
                                "leader_epoch": result["leader_epoch"], "isr": result["isr"],
                                "loss": None if loss is None else loss_doc(loss)})
