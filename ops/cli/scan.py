"""``kvlease scan``: the live rows of a table."""

from __future__ import annotations

import sys

import click

from kvlease.common import errors
import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.partition_option import bucket_client, partition_option
from kvlease.ops.cli.values import BucketList, int64, table_path


@kvlease.command("scan")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--bucket", "bucket_groups", type=BucketList(), multiple=True, metavar="B[,B…]",
              help="Scan only these buckets: repeat, or B,B,….")
@click.option("--limit", type=int64(1), metavar="N", help="At most N rows in all.")
@partition_option
@common_options
@pass_state
@catch_errors
def scan_command(state: State, path: str, bucket_groups: tuple[list[int], ...], limit: int | None,
                 partition: str | None) -> None:
    """Read the live rows of a table (every bucket, or --bucket B …) from its leaders; of a partitioned
    table, those of one partition (--partition NAME).

    Each bucket is read from one consistent snapshot, taken when its scan
    opens; the output names per bucket the first changelog offset that is not
    in the rows (`kvlease log --from N` continues from there). Buckets are
    read in parallel; with --limit one after another until N rows.
    """
    client = bucket_client(state, path, partition)
    table = client.table
    buckets = sorted({b for group in bucket_groups for b in group}) or None
    beyond = [b for b in buckets or () if b >= table.buckets]
    if beyond:
        raise errors.BucketOutOfRangeError(f"{table.where} has buckets 0..{table.buckets - 1}, "
                                           f"not {', '.join(map(str, beyond))}")
    progress = out.ScanProgress(len(buckets or range(table.buckets))) if sys.stderr.isatty() else None
    try:
        result = client.scan(limit=limit, buckets=buckets, on_batch=progress)
    finally:
        if progress is not None:
            progress.close()
    state.output.scan(out.scan_doc(table.path, result.rows, result.log_offsets, table.partition_name))
