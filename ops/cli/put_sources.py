"""What ``kvlease put`` reads: JSON lines, CSV or Parquet, in batches, each row with where it came from.

The format is ``--format``, else the file's extension (``.csv``; ``.parquet`` or ``.pq``; anything
else, and stdin, is JSON lines). Every reader yields ``(rows, where)``: ``rows`` a list of dicts (JSON
lines, CSV) or an Arrow ``RecordBatch`` of the table's column types (Parquet), ``where[i]`` the line
(JSON lines, CSV: the line a record starts on) or the row number (Parquet, from 1) of ``rows[i]``. A
value that cannot be one of its column's type is an InvalidRowError naming the line (or row) and the
column. CSV: the first record names the columns; an empty field is null, except in a STRING column
(an empty string); values are read as ``kvlease put`` reads text (:func:`kvlease.ops.cli.values.convert_value`).
The standard library's csv reader is used, not pyarrow's, because it knows the line of every record.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Any, BinaryIO, Iterator

import pyarrow as pa

from kvlease.common import errors
from kvlease.common.codec_arrays import ARROW_TYPES
from kvlease.common.tables import TableInfo
from kvlease.ops.cli.values import convert_value, parse_json_row

FORMATS = ("jsonl", "csv", "parquet")
_EXTENSIONS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError, ValueError)

#: ``(rows, where)``: a list of dicts or an Arrow RecordBatch, and the line or row number of each row.
Batch = tuple[Any, list[int]]


def source_format(name: str, given: str | None) -> str:
    """``given`` (``--format``), else what the file name's extension says, else ``jsonl``."""
    if given:
        return given
    return _EXTENSIONS.get(os.path.splitext(name)[1].lower(), "jsonl")


class Reader:
    """The batches of one source (iterate it); :attr:`pending` is the first line (or row) of the batch
    being read, :attr:`unit` what numbers a row (``line`` or ``row``), :meth:`fraction` how far it got."""

    def __init__(self, source: BinaryIO, fmt: str, table: TableInfo, batch_size: int) -> None:
        self.source, self.format, self.table, self.batch_size = source, fmt, table, batch_size
        self.unit = "row" if fmt == "parquet" else "line"
        self.pending: int | None = None
        self._size = _size(source)
        self._rows_total: int | None = None
        self._rows_read = 0

    def __iter__(self) -> Iterator[Batch]:
        if self.format == "parquet":
            return self._parquet()
        return self._batched(self._json_rows() if self.format == "jsonl" else self._csv_rows())

    def fraction(self) -> float | None:
        """The part of the source read so far (None: not known, e.g. stdin)."""
        if self._rows_total:
            return self._rows_read / self._rows_total
        if self._size:
            try:
                return min(1.0, self.source.tell() / self._size)
            except (OSError, ValueError):
                return None
        return None

    def _batched(self, rows: Iterator[tuple[int, dict[str, Any]]]) -> Iterator[Batch]:
        batch: list[dict[str, Any]] = []
        where: list[int] = []
        for number, row in rows:  # the rows' reader keeps self.pending
            batch.append(row)
            where.append(number)
            if len(batch) >= self.batch_size:
                yield batch, where
                batch, where, self.pending = [], [], None
        if batch:
            yield batch, where

    def _json_rows(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for number, raw in enumerate(self.source, 1):
            if self.pending is None:
                self.pending = number
            line = decode_line(raw, number)
            if line.strip():
                yield number, parse_json_row(line, number, self.table)

    def _csv_rows(self) -> Iterator[tuple[int, dict[str, Any]]]:
        text = io.TextIOWrapper(self.source, encoding="utf-8", newline="")
        reader = csv.reader(text)
        line = 0
        try:
            header = next(reader, None)
            if header is None:
                return
            types = _csv_header(header, self.table)
            line = reader.line_num
            for record in reader:
                number, line = line + 1, reader.line_num
                if self.pending is None:
                    self.pending = number
                if record:  # a blank line is no record
                    yield number, _csv_row(record, header, types, number)
        except UnicodeDecodeError as exc:
            raise errors.InvalidRowError(f"line {line + 1}: not UTF-8 ({exc.reason})") from None
        except csv.Error as exc:
            raise errors.InvalidRowError(f"line {line + 1}: not CSV ({exc})") from None
        finally:
            text.detach()  # the caller closes the file

    def _parquet(self) -> Iterator[Batch]:
        import pyarrow.parquet as pq

        try:
            file = pq.ParquetFile(self.source)
        except (pa.ArrowException, OSError) as exc:
            raise errors.InvalidRowError(f"not a Parquet file ({exc})") from None
        self._rows_total = file.metadata.num_rows
        for batch in file.iter_batches(batch_size=self.batch_size):
            self.pending = self._rows_read + 1
            where = list(range(self.pending, self.pending + batch.num_rows))
            yield _conform(batch, self.table, self.pending), where
            self._rows_read += batch.num_rows


def _size(source: BinaryIO) -> int | None:
    try:
        return os.fstat(source.fileno()).st_size if source.seekable() else None
    except (OSError, ValueError, AttributeError):
        return None


def decode_line(raw: bytes, number: int) -> str:
    """One input line of ``put`` as text; InvalidRowError naming the line if it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.InvalidRowError(f"line {number}: not UTF-8 (byte {exc.start + 1} of the line: "
                                     f"{exc.reason})") from None


def _csv_header(header: list[str], table: TableInfo) -> list[str]:
    """The column types of a CSV header's names; InvalidRowError for an unknown or repeated name."""
    types = {c.name: c.type for c in table.columns}
    names = [c.name for c in table.columns]
    for i, name in enumerate(header):
        if name not in types:
            raise errors.InvalidRowError(f"line 1 (the header), column {errors.show(name)}: unknown column "
                                         f"(table {table.path} has {', '.join(names)})")
        if name in header[:i]:
            raise errors.InvalidRowError(f"line 1 (the header): column {errors.show(name)} appears twice")
    missing = [k for k in table.primary_key if k not in header]
    if missing:
        raise errors.InvalidRowError(f"line 1 (the header): primary key column(s) {', '.join(missing)} missing")
    return [types[name] for name in header]


def _csv_row(record: list[str], header: list[str], types: list[str], number: int) -> dict[str, Any]:
    if len(record) != len(header):
        raise errors.InvalidRowError(f"line {number}: {len(record)} value(s), but the header names "
                                     f"{len(header)} column(s)")
    row = {}
    for name, type_, text in zip(header, types, record):
        if text == "" and type_ != "STRING":
            row[name] = None
            continue
        try:
            row[name] = convert_value(text, type_)
        except ValueError as exc:
            raise errors.InvalidRowError(f"line {number}, column {name!r}: {exc}") from None
    return row


def _conform(batch: pa.RecordBatch, table: TableInfo, first_row: int) -> pa.RecordBatch:
    """A Parquet batch with its columns cast to the table's types (missing columns are left to the codec)."""
    types = {c.name: c.type for c in table.columns}
    arrays = []
    for name, array in zip(batch.schema.names, batch.columns):
        if name not in types:
            raise errors.InvalidRowError(f"column {errors.show(name)}: unknown column (table {table.path} has "
                                         f"{', '.join(c.name for c in table.columns)})")
        target = ARROW_TYPES[types[name]]
        if pa.types.is_decimal(target) and pa.types.is_floating(array.type):
            raise errors.InvalidRowError(f"column {name!r}: the file's {array.type} values cannot be read as "
                                         f"{types[name]}: a DECIMAL is read exactly, never through a float")
        if array.type != target:
            try:
                array = array.cast(target)
            except _CAST_ERRORS as exc:
                raise errors.InvalidRowError(_bad_value(array, name, types[name], first_row, exc)) from None
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _bad_value(array: pa.Array, name: str, type_: str, first_row: int, exc: Exception) -> str:
    """Which row of ``array`` cannot be cast to ``type_``, in a sentence."""
    target = ARROW_TYPES[type_]
    for i in range(len(array)):
        try:
            array.slice(i, 1).cast(target)
        except _CAST_ERRORS:
            return (f"row {first_row + i}, column {name!r}: {errors.show(array[i].as_py())} is not a "
                    f"{type_} value (the file's type: {array.type})")
    return f"column {name!r}: the file's {array.type} values cannot be read as {type_} ({exc})"
