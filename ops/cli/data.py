"""The row commands: ``kvlease put``, ``get`` and ``delete`` (``log`` is in :mod:`kvlease.ops.cli.changelog`)."""

from __future__ import annotations

import re
import sys
from typing import BinaryIO

import click
import pyarrow as pa

from kvlease.common import errors
import kvlease.ops.cli.output as out
from kvlease.ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from kvlease.ops.cli.put_sources import FORMATS, Reader, source_format
from kvlease.ops.cli.values import InputFile, parse_keys, parse_prefix, table_path

PUT_BATCH_ROWS = 10_000


@kvlease.command("put")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("source", metavar="[FILE|-]", type=InputFile(), default="-")
@click.option("--format", "format_", type=click.Choice(FORMATS),
              help="What FILE holds (default: by its extension: .csv, .parquet or .pq; else JSON lines).")
@click.option("--batch-size", type=click.IntRange(min=1), default=PUT_BATCH_ROWS, show_default=True,
              help="Rows per write (each write is one request per bucket).")
@click.option("--partial", is_flag=True,
              help="A partial update: only the columns a row names are written, the others keep their values "
                   "(JSON lines: a missing key is not written, null is a null; CSV and Parquet: the file's columns).")
@click.option("--retract", is_flag=True,
              help="Retract the rows from an aggregation table (sum: subtracted, product: divided, last_value: "
                   "cleared) instead of upserting them.")
@common_options
@pass_state
@catch_errors
def put(state: State, path: str, source: BinaryIO, format_: str | None, batch_size: int, partial: bool,
        retract: bool) -> None:
    """Upsert rows from FILE or stdin: JSON lines (one object per line: column -> value), CSV (a header
    line naming the columns) or Parquet.

    BYTES values are base64 text, TIMESTAMP values ISO-8601 text (UTC) or
    integer microseconds (in CSV and JSON lines). A bad line (or Parquet row)
    stops the command: nothing of its batch is written (earlier batches are).
    A write that fails (say, a bucket without a live leader) stops it too,
    saying how many rows of that batch were written and how many in all: the
    buckets of a batch are written independently.
    On a terminal, stderr shows how far it got after every batch.
    --partial and --retract: see docs/merge-engines.md.
    """
    if partial and retract:
        raise click.UsageError("--partial and --retract exclude each other: a retract names the values to take back")
    mode = "retract" if retract else "partial" if partial else "upsert"
    fmt = source_format(getattr(source, "name", "-"), format_)
    if fmt == "parquet" and not source.seekable():
        raise click.UsageError("Parquet is read from a file, not from stdin or a pipe: give its path")
    client = state.table_client(path)
    table = client.table
    reader = Reader(source, fmt, table, batch_size)
    show_progress = not state.json_mode and sys.stderr.isatty()
    written, batches = 0, iter(reader)
    while True:
        try:
            rows, where = next(batches)
        except StopIteration:
            break
        except errors.InvalidRowError as exc:  # a value that is not of its column's type, read
            first = f"{reader.unit} {reader.pending}"
            exc.message += f" (the {written} row(s) before {first} were written, nothing from {first} on)"
            raise
        written += _write(client, rows, where, reader.unit, written, mode)
        if show_progress:
            click.echo(_progress(table.path, written, reader.fraction()), err=True)
    verb = "retracted" if retract else "wrote"
    state.output.message(f"{verb} {written} row(s) {'from' if retract else 'to'} {table.path}",
                         {"table": table.path, "rows": written, **({"mode": mode} if mode != "upsert" else {})})


def _write(client, rows, where: list[int], unit: str, written: int, mode: str = "upsert") -> int:
    """One batch upserted (``mode`` "partial": a partial update, "retract": retracted); an error names its lines
    (or rows), how many of its rows were written and how many in all."""
    span = f"{unit}s {where[0]}-{where[-1]}"
    try:
        if mode == "partial":  # dict rows as they are: a missing key is a column not written
            client.upsert(rows, partial=True)
            return len(where)
        batch = rows if isinstance(rows, pa.RecordBatch) else client.codec.to_batch(rows)
        client.retract(batch) if mode == "retract" else client.upsert(batch)
    except errors.InvalidRowError as exc:
        raise errors.InvalidRowError(f"{_at_lines(exc.message, where, unit)} (nothing of {span} was written; "
                                     f"{written} row(s) before them were)") from None
    except errors.KvLeaseError as exc:
        exc.message = f"{exc.message} ({_partly_written(exc, span, len(where), written)})"
        raise
    return len(where)


def _partly_written(exc: errors.KvLeaseError, span: str, count: int, before: int) -> str:
    """What a batch of ``count`` rows (``span``) that failed left written: the rows its buckets acknowledged
    (``details["written_rows"]``: the table client's count per bucket, a failed bucket's first requests
    too; writes are not atomic across buckets), then the ``before`` rows of the batches before it."""
    done = sum(exc.details.get("written_rows", {}).values())
    rest = "may or may not have been" if isinstance(exc, errors.OutcomeUnknownError) else "were not"
    return (f"writing {span}: {done} of their {count} row(s) were written, the other {count - done} {rest}; "
            f"{before + done} row(s) written in all")


def _progress(path: str, written: int, fraction: float | None) -> str:
    done = f" ({fraction:.0%} of the input)" if fraction is not None else ""
    return f"{path}: {written:,} rows written{done} …"


def _at_lines(message: str, where: list[int], unit: str = "line") -> str:
    """A codec message about ``row i`` of a batch, told as the input line (or row) of that row."""
    m = re.match(r"^row (\d+)(.*)$", message, re.S)
    if m and int(m.group(1)) < len(where):
        return f"{unit} {where[int(m.group(1))]}{m.group(2)}"
    return f"{unit}s {where[0]}-{where[-1]}: {message}"


def _key_command(func):
    """A ``DB.NAME KEY…`` command taking ``(state, path, keys)``; keys may start with '-' (negative numbers)."""
    for decorate in (catch_errors, pass_state, common_options,
                     click.argument("keys", metavar="KEY…", nargs=-1, required=True),
                     click.argument("path", metavar="DB.NAME", callback=table_path),
                     kvlease.command(context_settings={"ignore_unknown_options": True})):
        func = decorate(func)
    return func


@kvlease.command(context_settings={"ignore_unknown_options": True})
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("keys", metavar="[KEY…]", nargs=-1)
@click.option("--prefix", "prefix", metavar="COL=VALUE", multiple=True,
              help="Instead of keys: every row whose bucket-key columns have these values (one --prefix per "
                   "bucket-key column; the table needs a bucket key: table create --bucket-key).")
@common_options
@pass_state
@catch_errors
def get(state: State, path: str, keys: tuple[str, ...], prefix: tuple[str, ...]) -> None:
    """Look up rows by primary key, or by a bucket-key prefix (--prefix).

    KEY is the primary-key value; for a composite key, the values in
    primary-key order comma-separated (7,abc) or as a JSON array ('[7,"a,b"]').
    With --prefix COL=VALUE (per bucket-key column), every row whose key starts
    with those values, in key order.
    """
    if keys and prefix:
        raise click.UsageError("give KEY… or --prefix COL=VALUE, not both")
    if not keys and not prefix:
        raise click.UsageError("Missing argument 'KEY…' (or --prefix COL=VALUE: a bucket-key prefix)")
    client = state.table_client(path)
    if prefix:
        values = parse_prefix(prefix, client.table)
        rows = client.lookup_prefix([values])
        state.output.rows(out.prefix_rows_doc(client.table.path, values, rows))
        return
    rows = client.lookup(parse_keys(keys, client.table))
    state.output.rows(out.rows_doc(client.table.path, keys, rows))


@_key_command
def delete(state: State, path: str, keys: tuple[str, ...]) -> None:
    """Delete rows by primary key (KEY as for `get`); missing keys are ignored."""
    client = state.table_client(path)
    offsets = client.delete(parse_keys(keys, client.table))
    deleted = sum(end - base for base, end in offsets.values())  # one -D record per deleted row
    text = f"deleted {deleted} row(s) from {client.table.path}"
    if deleted < len(keys):
        text += f" ({len(keys) - deleted} key(s) had no row)"
    state.output.message(text, {"table": client.table.path, "keys": len(keys), "deleted": deleted})
