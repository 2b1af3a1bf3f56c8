"""The row commands: ``kvlease put``, ``get`` and ``delete`` (``log`` is in :mod:`ops.cli.changelog`)."""

from __future__ import annotations

import re
import sys
from typing import BinaryIO

import click

from common import errors
from ops import output as out
from ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from ops.cli.values import parse_json_row, parse_keys, table_path

PUT_BATCH_ROWS = 10_000


@kvlease.command("put")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("source", metavar="[FILE|-]", type=click.File("rb"), default="-")
@click.option("--batch-size", type=click.IntRange(min=1), default=PUT_BATCH_ROWS, show_default=True,
              help="Rows per write (each write is one request per bucket).")
@common_options
@pass_state
@catch_errors
def put(state: State, path: str, source: BinaryIO, batch_size: int) -> None:
    """Upsert rows from JSON lines (one object per line: column -> value) in FILE or stdin.

    BYTES values are base64 text, TIMESTAMP values ISO-8601 text (UTC) or
    integer microseconds. A bad line stops the command: nothing of its batch
    is written (earlier batches are).
    """
    client = state.table_client(path)
    table = client.table
    written, rows, lines = 0, [], []
    show_progress = not state.json_mode and sys.stderr.isatty()

    def flush() -> int:
        try:
            batch = client.codec.to_batch(rows)
        except errors.InvalidRowError as exc:
            raise errors.InvalidRowError(f"{_at_lines(exc.message, lines)} (nothing of lines {lines[0]}-{lines[-1]} "
                                         f"was written; {written} row(s) before them were)") from None
        try:
            client.upsert(batch)
        except errors.KvLeaseError as exc:
            exc.message = f"{exc.message} (writing lines {lines[0]}-{lines[-1]}; {written} row(s) before them " \
                          "were written)"
            raise
        return len(rows)

    for number, raw in enumerate(source, 1):
        try:
            line = decode_line(raw, number)
            if not line.strip():
                continue
            rows.append(parse_json_row(line, number, table))
        except errors.InvalidRowError as exc:
            first = lines[0] if lines else number  # the rows of lines[] are read but not written yet
            exc.message += f" (the {written} row(s) before line {first} were written, nothing from line {first} on)"
            raise
        lines.append(number)
        if len(rows) >= batch_size:
            written += flush()
            rows, lines = [], []
            if show_progress:
                click.echo(f"{written} rows written …", err=True)
    if rows:
        written += flush()
    state.output.message(f"wrote {written} row(s) to {table.path}", {"table": table.path, "rows": written})


def decode_line(raw: bytes, number: int) -> str:
    """One input line of ``put`` as text; InvalidRowError naming the line if it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.InvalidRowError(f"line {number}: not UTF-8 (byte {exc.start + 1} of the line: "
                                     f"{exc.reason})") from None


def _at_lines(message: str, lines: list[int]) -> str:
    """A codec message about ``row i`` of a batch, told as the input line of that row."""
    m = re.match(r"^row (\d+)(.*)$", message, re.S)
    if m and int(m.group(1)) < len(lines):
        return f"line {lines[int(m.group(1))]}{m.group(2)}"
    return f"lines {lines[0]}-{lines[-1]}: {message}"


def _key_command(func):
    """A ``DB.NAME KEY…`` command taking ``(state, path, keys)``; keys may start with '-' (negative numbers)."""
    for decorate in (catch_errors, pass_state, common_options,
                     click.argument("keys", metavar="KEY…", nargs=-1, required=True),
                     click.argument("path", metavar="DB.NAME", callback=table_path),
                     kvlease.command(context_settings={"ignore_unknown_options": True})):
        func = decorate(func)
    return func


@_key_command
def get(state: State, path: str, keys: tuple[str, ...]) -> None:
    """Look up rows by primary key.

    KEY is the primary-key value; for a composite key, the values in
    primary-key order comma-separated (7,abc) or as a JSON array ('[7,"a,b"]').
    """
    client = state.table_client(path)
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
