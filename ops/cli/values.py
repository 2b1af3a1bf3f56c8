"""Values of the ``kvlease`` command line, from text: click parameter types
(durations, ``B=ID`` snapshots, bucket lists), the ``DB.NAME`` check, and
column values, keys and JSON rows for ``put``, ``get`` and ``delete``.

A bad value on the command line is a usage error (exit 2); a bad JSON line of
``put`` is :class:`kvlease.common.errors.InvalidRowError` naming the line.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable

import click

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.model import lease_id_problem, lease_owner_problem
from kvlease.ops.cli.column_values import DOUBLE_TEXTS, convert_value, loads  # noqa: F401 (convert_value: re-exported)
from kvlease.common.tables import TableInfo, parse_table_path


# -- parameter types (client-side syntax checks: usage errors, exit 2) -------------------------

#: The largest values of the wire types: buckets are int32, offsets, ids, limits and times int64.
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def in_range(value: int, low: int, high: int, what: str) -> int:
    """``value`` if ``low <= value <= high``; else ValueError naming the value and the range."""
    if not low <= value <= high:
        raise ValueError(f"{what} {value} is out of range ({low}..{high})")
    return value


def bucket_number(low: int = 0) -> click.IntRange:
    """A bucket number option (int32 on the wire)."""
    return click.IntRange(min=low, max=INT32_MAX)


def int64(low: int = 0) -> click.IntRange:
    """An offset, limit or id option (int64 on the wire)."""
    return click.IntRange(min=low, max=INT64_MAX)


class Duration(click.ParamType):
    """``10m``, ``30s``, ``500ms`` -> milliseconds; ``positive``: 0 is refused too."""

    name = "duration"

    def __init__(self, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, int):
            return value
        try:
            ms = cfg.parse_duration_ms(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if self.positive and ms <= 0:
            self.fail(f"{errors.show(value)}: must be more than 0", param, ctx)
        return ms


class InputFile(click.File):
    """A file to read (``click.File("rb")``, ``-`` for stdin); a path the OS cannot take (a NUL byte in it) is
    a usage error naming it, not the ValueError ``open`` raises."""

    def __init__(self) -> None:
        super().__init__("rb")

    def convert(self, value: Any, param, ctx) -> Any:
        if isinstance(value, str) and "\x00" in value:
            self.fail(f"{errors.show(value)}: a file name cannot hold a NUL byte", param, ctx)
        return super().convert(value, param, ctx)


class Checked(click.ParamType):
    """A string checked by one of the coordinator's own rules (``problem(value)``: why it is refused, or
    None), so a bad value is a usage error before anything is sent."""

    def __init__(self, name: str, problem: Callable[[Any], str | None]) -> None:
        self.name = name
        self._problem = problem

    def convert(self, value: Any, param, ctx) -> str:
        problem = self._problem(value)
        if problem is not None:
            self.fail(problem, param, ctx)
        return value


class BucketSnapshot(click.ParamType):
    """``B=ID`` (bucket number = snapshot id) -> ``(B, ID)``."""

    name = "B=ID"

    def convert(self, value: Any, param, ctx) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        m = re.fullmatch(r"\s*([0-9]+)\s*=\s*([0-9]+)\s*", str(value))
        if not m:
            self.fail(f"{errors.show(value)} is not BUCKET=SNAPSHOT_ID (e.g. 0=12)", param, ctx)
        try:
            return (in_range(int(m.group(1)), 0, INT32_MAX, "bucket"),
                    in_range(int(m.group(2)), 0, INT64_MAX, "snapshot id"))
        except ValueError as exc:
            self.fail(f"{errors.show(value)}: {exc}", param, ctx)


class BucketList(click.ParamType):
    """``3`` or ``0,1,2`` -> a list of bucket numbers."""

    name = "B[,B…]"

    def convert(self, value: Any, param, ctx) -> list[int]:
        if isinstance(value, list):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        if not parts or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
            self.fail(f"{errors.show(value)} is not a bucket number or a comma-separated list of them", param, ctx)
        try:
            return [in_range(int(p), 0, INT32_MAX, "bucket") for p in parts]
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class EpochMs(click.ParamType):
    """A point in time: ms since the epoch (``1714564800000``) or ISO-8601 (``2024-05-01T12:00:00.5Z``,
    UTC when it names no zone) -> ms since the epoch."""

    name = "time"

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if re.fullmatch(r"[0-9]+", text):
            if int(text) > INT64_MAX:
                self.fail(f"{errors.show(value)} is out of range (0..{INT64_MAX} ms since the epoch)", param, ctx)
            return int(text)
        try:
            stamp = datetime.fromisoformat(text)
        except (ValueError, OverflowError):
            self.fail(f"{errors.show(value)} is neither ms since the epoch nor an ISO-8601 time", param, ctx)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=timezone.utc)
        # rounded up: the records stamped at or after a time between two ms are those of the later one
        ms = -((datetime(1970, 1, 1, tzinfo=timezone.utc) - stamp) // timedelta(milliseconds=1))
        if ms < 0:
            self.fail(f"{errors.show(value)} is before 1970-01-01", param, ctx)
        return ms


DURATION = Duration()
POSITIVE_DURATION = Duration(positive=True)
LEASE_ID = Checked("lease_id", lease_id_problem)
LEASE_OWNER = Checked("owner", lease_owner_problem)
EPOCH_MS = EpochMs()


# -- column values from text and JSON (put, get, delete) -------------------------------------------

#: Column types whose JSON value ``put`` passes to the codec as it is (the codec checks it).
_AS_IS = ("BOOLEAN", "TINYINT", "SMALLINT", "INT", "BIGINT", "STRING")


def parse_key(text: str, table: TableInfo) -> dict[str, Any]:
    """A ``KEY`` argument -> ``{primary-key column: value}``, typed by the columns.

    A one-column key is the text itself. A composite key is comma-separated
    values in primary-key order (``7,abc``) or a JSON array (``'[7, "a,b"]'``,
    for values that hold commas). Raises ValueError naming the column.
    """
    types = {c.name: c.type for c in table.columns}
    pk = table.primary_key
    if len(pk) == 1:
        parts: list[Any] = [text]
    elif text.lstrip().startswith("["):
        try:
            parts = loads(text)
        except ValueError as exc:
            raise ValueError(f"not a JSON array: {exc}") from None
        if not isinstance(parts, list):
            raise ValueError("not a JSON array")
    else:
        parts = text.split(",")
    if len(parts) != len(pk):
        raise ValueError(f"the primary key has {len(pk)} column(s) ({', '.join(pk)}), got {len(parts)} value(s) "
                         "(give them comma-separated or as a JSON array)")
    key = {}
    for name, part in zip(pk, parts):
        if part is None:
            raise ValueError(f"column {name!r}: a primary key value cannot be null")
        try:
            key[name] = convert_value(part, types[name])
        except ValueError as exc:
            raise ValueError(f"column {name!r}: {exc}") from None
    return key


def parse_keys(texts: Iterable[str], table: TableInfo) -> list[dict[str, Any]]:
    """Every KEY argument; a bad one is a usage error naming the key and the column."""
    keys = []
    for text in texts:
        try:
            keys.append(parse_key(text, table))
        except ValueError as exc:
            raise click.BadParameter(f"{errors.show(text)}: {exc}", param_hint="'KEY'") from None
    return keys


def parse_prefix(texts: Iterable[str], table: TableInfo) -> dict[str, Any]:
    """``--prefix COL=VALUE`` options -> ``{bucket-key column: value}``, typed by the columns; a usage error naming
    the option for a bad one (the client says which bucket-key column is missing or not one)."""
    types = {c.name: c.type for c in table.columns}
    values: dict[str, Any] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        name = name.strip()
        try:
            if not sep or not name:
                raise ValueError("expected COL=VALUE")
            if name not in types:
                raise ValueError(f"table {table.path} has no column {name!r}")
            if name in values:
                raise ValueError(f"column {name!r} is given twice")
            values[name] = convert_value(value, types[name])
        except ValueError as exc:
            raise click.BadParameter(f"{errors.show(text)}: {exc}", param_hint="'--prefix'") from None
    return values


def parse_json_row(line: str, number: int, table: TableInfo) -> dict[str, Any]:
    """One JSON line of ``put`` -> a row for ``RowCodec.to_batch``; InvalidRowError names the line."""
    try:
        row = loads(line) if any("DECIMAL" in c.type for c in table.columns) else json.loads(line)
    except ValueError as exc:
        raise errors.InvalidRowError(f"line {number}: not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise errors.InvalidRowError(f"line {number}: expected a JSON object (column -> value), "
                                     f"got {type(row).__name__}")
    for column in table.columns:
        value = row.get(column.name)
        if value is None or column.type in _AS_IS:
            continue
        if column.type in ("FLOAT", "DOUBLE") and (type(value) is float or (type(value) is str
                                                                           and value not in DOUBLE_TEXTS)):
            continue  # a number, or text the codec refuses: JSON takes only the texts --json prints
        try:
            row[column.name] = convert_value(value, column.type)
        except ValueError as exc:
            raise errors.InvalidRowError(f"line {number}, column {column.name!r}: {exc}") from None
    return row


# -- table paths ---------------------------------------------------------------------------------------


def table_path(ctx, param, value: str | None) -> str | None:
    """``DB.NAME`` syntax check (usage error, exit 2)."""
    if value is None:
        return None
    try:
        parse_table_path(value)
    except errors.KvLeaseError as exc:
        raise click.BadParameter(exc.message, ctx, param) from None
    return value
