"""``kvlease log``: a table's change records, of one bucket (``--bucket``) or of every bucket."""

from __future__ import annotations

import json
import sys
import time

import click

from kvlease.client.log_position import LogPosition
from kvlease.common import errors
import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.partition_option import bucket_client, partition_option
from kvlease.ops.cli.values import EPOCH_MS, POSITIVE_DURATION, bucket_number, int64, table_path


#: An empty long poll answered sooner than half of this (or of its wait) was not a wait: the server does not
#: long-poll (older than FetchLog's max_wait_ms), and the reader sleeps instead.
NOT_WAITED_S = 0.4


@kvlease.command("log")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--bucket", type=bucket_number(), help="Only this bucket's changelog (default: every bucket).")
@click.option("--from", "from_offset", type=int64(), metavar="N",
              help="First offset (default: the earliest kept); needs --bucket.")
@click.option("--from-timestamp", "from_timestamp", type=EPOCH_MS, metavar="TIME",
              help="Start at the first record appended at or after TIME (ms since the epoch or ISO-8601, "
                   "UTC unless it names a zone), in every bucket read.")
@click.option("--follow", is_flag=True, help="Keep polling for new records until Ctrl-C.")
@click.option("--poll-interval", type=POSITIVE_DURATION, default="500ms", show_default=True, metavar="DURATION",
              help="How long --follow waits for new records per round of the buckets read (a long poll: a "
                   "record committed in the bucket waited on is printed at once).")
@partition_option
@common_options
@pass_state
@catch_errors
def log_command(state: State, path: str, bucket: int | None, from_offset: int | None, from_timestamp: int | None,
                follow: bool, poll_interval: int, partition: str | None) -> None:
    """Print change records as JSON lines {offset, change_type, timestamp, row}.

    Without --bucket: every bucket, each in offset order, bucket 0 first, and
    each line has a "bucket" too. change_type is +I (insert), -U / +U
    (update: before / after image) or -D (delete: the deleted row).
    timestamp is when the record was appended: ISO-8601 UTC with
    milliseconds (ms since the epoch with --json), null for records written
    before the changelog kept times. A partitioned table's changelogs are its
    partitions': name one with --partition NAME. Without --follow it stops at the end of
    each bucket's log as it was when the command started; --follow then keeps
    polling every bucket read. With --json it prints one document instead
    (not with --follow). Ctrl-C ends it with exit code 130, as any command:
    what it printed may not reach the end. Every fetch is fenced by leader
    epoch (a --from or --from-timestamp start by the epoch below it): if a
    bucket restore or unclean election gave offsets below where it reads to
    other changes, it stops with a DATA_LOST error naming them.
    """
    if follow and state.json_mode:
        raise click.UsageError("--json prints one document; it cannot be combined with --follow")
    if from_offset is not None and from_timestamp is not None:
        raise click.UsageError("give --from or --from-timestamp, not both")
    if from_offset is not None and bucket is None:
        raise click.UsageError("--from N is an offset of one bucket: give --bucket B too "
                               "(or --from-timestamp TIME, which every bucket has)")
    client = bucket_client(state, path, partition)
    table = client.table
    if bucket is not None and bucket >= table.buckets:
        raise errors.BucketOutOfRangeError(f"{table.where} has buckets 0..{table.buckets - 1}, not {bucket}")
    buckets = [bucket] if bucket is not None else list(range(table.buckets))
    reader = LogReader(client, buckets, _start_positions(client, buckets, from_offset, from_timestamp),
                       with_bucket=bucket is None)
    try:
        reader.read_to_end(None if state.json_mode else _print_line)
        if follow:
            reader.follow(_print_line, poll_interval / 1000.0)
    except BrokenPipeError:  # e.g. piped into head
        sys.stderr.close()
        return
    if state.json_mode:
        docs = [{"bucket": b, "from_offset": reader.start[b], "log_end_offset": reader.end[b],
                 "records": reader.collected[b]} for b in buckets]
        head = {"table": table.path, **({"partition": table.partition_name} if table.partition_name else {})}
        state.output.document({**head, **docs[0]} if bucket is not None else {**head, "buckets": docs})


def _start_positions(client, buckets: list[int], from_offset: int | None,
                     from_timestamp: int | None) -> dict[int, LogPosition]:
    """Where each bucket is read from. A start inside the log (``--from``, ``--from-timestamp``) comes with
    the leader epoch of the entry below it (ListOffsets' epochs_at), which fences the first fetch as the
    last entry read fences the others: a restore or unclean election that reuses offsets below it before
    then (or while ``--follow`` waits for a first record) fails with DATA_LOST naming them. Nothing is
    below the earliest kept offset."""
    if from_offset is None and from_timestamp is None:
        return {b: LogPosition(earliest) for b, (earliest, _latest) in client.list_offsets(buckets).items()}
    offsets = ({b: from_offset for b in buckets} if from_offset is not None
               else dict(client.list_offsets(buckets, timestamp=from_timestamp)))
    return client.positions(offsets)


def _print_line(doc: dict) -> None:
    click.echo(json.dumps(out.log_record_line(doc)))


class LogReader:
    """Reads the changelog of ``buckets`` from ``start``: each bucket in offset order, one after another
    up to the end it had when first asked (:meth:`read_to_end`), then all of them in turns (:meth:`follow`).
    Each fetch is fenced by the leader epoch of the entry below where it reads (the start position's, then
    the last entry read's): DATA_LOST (an error, no more records) if a restore or unclean election gave
    offsets below it to other changes."""

    def __init__(self, client, buckets: list[int], start: dict[int, LogPosition], *, with_bucket: bool) -> None:
        self.client = client
        self.buckets = buckets
        self.start = {b: p.offset for b, p in start.items()}
        #: where each bucket is read next, with the leader epoch of the entry below (None: not checked)
        self.position = dict(start)
        self.end: dict[int, int] = {}
        self.collected: dict[int, list[dict]] = {b: [] for b in buckets}
        self.with_bucket = with_bucket

    def _fetch(self, bucket: int, emit, wait_ms: int = 0) -> int:
        """One fetch of ``bucket`` from its next offset; each record to ``emit`` (None: collected). ``wait_ms``:
        a long poll (answered as soon as a record is committed; an empty answer after the wait). An empty answer
        much sooner (a server that does not wait) is followed
        by a sleep for the rest of the wait, so a reader never spins."""
        t0 = time.monotonic()
        records, end, position = self.client.fetch_log_from(bucket, self.position[bucket], max_wait_ms=wait_ms)
        took = time.monotonic() - t0
        if not records and wait_ms and took < min(wait_ms / 1000.0, NOT_WAITED_S) / 2:
            time.sleep(wait_ms / 1000.0 - took)
        self.end.setdefault(bucket, end)
        for record in records:
            doc = out.log_record_doc(record)
            if self.with_bucket:
                doc = {"bucket": bucket, **doc}
            if emit is None:
                self.collected[bucket].append(doc)
            else:
                emit(doc)
        if records:
            self.position[bucket] = position
            sys.stdout.flush()
        return len(records)

    def read_to_end(self, emit) -> None:
        for bucket in self.buckets:
            while self._fetch(bucket, emit) and self.position[bucket].offset < self.end[bucket]:
                pass

    def follow(self, emit, poll_interval_s: float) -> None:
        """Until interrupted: every bucket in turn, each fetch a long poll of the poll interval shared among the
        buckets: a record committed in the bucket waited on is printed at once, in another at most one poll
        interval later (as when it slept the interval between rounds)."""
        wait_ms = max(1, int(poll_interval_s * 1000 / len(self.buckets)))
        while True:
            for bucket in self.buckets:
                self._fetch(bucket, emit, wait_ms)
