"""Row codec: Arrow batches <-> RocksDB keys and values, vectorized.

A tablet server stores each row of a primary-key table in RocksDB as
``key = encode_keys(row)`` and ``value = encode_values(row)``; the changelog
keeps the same bytes. Rows travel between client and server as Arrow IPC
RecordBatches (:func:`batch_to_ipc`, :func:`ipc_to_batch`, in :mod:`kvlease.common.arrow_ipc`).

Every encode and decode works on whole columns with numpy and
``pyarrow.compute``: no Python code runs per row except the one conversion
between an Arrow binary array and a ``list[bytes]`` (and ``zlib.crc32`` per key
in :func:`bucket_of_keys`). Layouts (also in ``docs/row-encoding.md``):

key (order-preserving: ``bytes`` order == tuple order of the key values),
primary-key columns concatenated in primary-key order:

- BOOLEAN: 1 byte, 0x00 or 0x01;
- INT / BIGINT / TIMESTAMP (int64 microseconds): 4 / 8 bytes big-endian, sign
  bit flipped;
- DOUBLE: 8 bytes big-endian of the IEEE bits, all bits flipped when negative,
  else only the sign bit. Order is Java's ``Double.compare``: -inf < ... <
  -0.0 < 0.0 < ... < inf < NaN; every NaN is stored as the one canonical NaN;
- STRING (UTF-8) / BYTES: each 0x00 escaped as 0x00 0xFF, then the
  terminator 0x00 0x01 (so ``"a" < "a\\x00" < "ab"`` also inside multi-column keys).

value: ``FORMAT_VERSION`` (1 byte), a null bitmap of ``ceil(columns / 8)``
bytes (bit ``i % 8`` of byte ``i // 8`` set = column ``i`` is null), then each
non-null column in table order: fixed-width types little-endian (BOOLEAN 1
byte, INT 4, BIGINT/DOUBLE/TIMESTAMP 8; DOUBLE keeps its exact bits), STRING
and BYTES as a uint32 little-endian length then the bytes.

Buckets: ``zlib.crc32(encoded key) % num_buckets`` (crc32 is unsigned in
Python 3): stable across processes, versions and platforms (:mod:`kvlease.common.bucketing`).

Malformed input (client rows, batches) raises :class:`InvalidRowError` naming
the row and column; so do bytes that are not a value or key of this table.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.errors import InvalidRowError, show
from kvlease.common import codec_arrays as ca
from kvlease.common.codec_arrays import ARROW_TYPES
from kvlease.common.tables import Column, TableInfo
# re-exported: callers import the bucket function and the IPC helpers from here
from kvlease.common.arrow_ipc import batch_to_ipc, ipc_to_batch  # noqa: F401
from kvlease.common.bucketing import bucket_array, bucket_of, bucket_of_keys  # noqa: F401

FORMAT_VERSION = 1
#: Rows encoded or decoded in one vectorized pass; keeps temporaries in cache-sized pieces.
CHUNK_ROWS = 1 << 16



def arrow_schema(table: TableInfo) -> pa.Schema:
    """The Arrow schema of a full row of ``table`` (every field nullable)."""
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in table.columns])


def key_schema(table: TableInfo) -> pa.Schema:
    """The Arrow schema of ``table``'s primary key, in primary-key order."""
    types = {c.name: c.type for c in table.columns}
    return pa.schema([pa.field(k, ARROW_TYPES[types[k]]) for k in table.primary_key])


class RowCodec:
    """Encodes and decodes the rows of one table; see the module docstring for the layouts."""

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self.schema = arrow_schema(table)
        self.key_schema = key_schema(table)
        self._types = {c.name: c.type for c in table.columns}
        self._names = [c.name for c in table.columns]
        self._name_set = frozenset(self._names)
        self._key_set = frozenset(table.primary_key)
        #: The length of every encoded key when all primary-key columns are fixed-width, else None.
        self.key_width = (sum(np.dtype(ca.KEY_DTYPE[self._types[k]]).itemsize for k in table.primary_key)
                          if all(self._types[k] in ca.KEY_DTYPE for k in table.primary_key) else None)

    # ---- client side -------------------------------------------------------

    def to_batch(self, rows: Sequence[dict]) -> pa.RecordBatch:
        """Python rows -> a batch of the table's schema; missing non-key columns are null.

        TIMESTAMP takes a ``datetime`` (naive = UTC, aware is converted to UTC)
        or int microseconds since the epoch; DOUBLE also takes an int. Raises
        InvalidRowError naming the first bad row and column: unknown column,
        missing or null primary key, value of the wrong type or out of range.
        """
        rows = list(rows)
        if not all(issubclass(t, dict) for t in set(map(type, rows))):
            i = next(i for i, row in enumerate(rows) if not isinstance(row, dict))
            raise InvalidRowError(f"row {i}: expected a dict of column -> value, got {show(rows[i])}")
        unknown = set().union(*rows) - self._name_set
        if unknown:
            i, name = next((i, k) for i, r in enumerate(rows) for k in r if k not in self._name_set)
            raise InvalidRowError(f"row {i}, column {show(name)}: unknown column (table {self.table.path} has "
                                  f"{', '.join(self._names)})")
        columns = ([row.get(name) for row in rows] for name in self._names)  # one column's list at a time
        arrays = self._arrays(self._names, columns, lambda i, name: name not in rows[i])
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def keys_to_batch(self, columns: Sequence[list]) -> pa.RecordBatch:
        """Primary-key values, one list per key column in primary-key order -> a batch of the key schema;
        checked as :meth:`to_batch` checks the key columns of rows (a None is ``primary key is null``)."""
        arrays = self._arrays(list(self.table.primary_key), columns, lambda i, name: False)
        return pa.RecordBatch.from_arrays(arrays, schema=self.key_schema)

    def _arrays(self, names: list[str], columns: Iterable[list],
                missing: Callable[[int, str], bool]) -> list[pa.Array]:
        """Each column of Python values as an Arrow array of its type; InvalidRowError naming the earliest bad
        row of any column. ``missing(i, name)``: row ``i`` lacks column ``name`` (else its None was given)."""
        arrays, errors = [], []  # errors: (row, message) of each column's first bad value
        for name, values in zip(names, columns):
            type_ = self._types[name]
            bad = ca.first_bad_type(values, type_, nullable=name not in self._key_set)
            if bad is None:
                try:
                    arrays.append(pa.array(values, type=ARROW_TYPES[type_]))
                    continue
                except ca.CONVERSION_ERRORS:
                    bad = len(values)
            errors.append(self._first_error(name, values, bad, missing))
        if errors:
            raise InvalidRowError(min(errors)[1])
        return arrays

    def _first_error(self, name: str, values: list, bad: int,
                     missing: Callable[[int, str], bool]) -> tuple[int, str]:
        """``(row, message)`` of a column's first bad value: ``bad`` is the first of a type the column does not
        take (``len(values)`` if Arrow refused them all), but an earlier one may be out of range."""
        type_ = self._types[name]
        error = ca.first_unconvertible(values[:bad], name, type_)
        if error is None and bad == len(values):
            error = (0, f"column {name!r}: cannot convert the values to {type_}")
        elif error is None and values[bad] is None:
            why = "is missing" if missing(bad, name) else "is null"
            error = (bad, f"row {bad}, column {name!r}: primary key {why}")
        elif error is None:
            error = (bad, f"row {bad}, column {name!r}: expected {type_}, got {show(values[bad])}")
        return error

    # ---- server side -------------------------------------------------------

    def validate(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A client's batch, checked and reordered to the table's schema.

        Columns may come in any order; missing non-key columns become null.
        Types must match exactly (no implicit casts). Raises InvalidRowError for
        a duplicate, unknown or missing primary-key column, a wrong type, or a
        null primary key (naming the first such row).
        """
        arrays = self._columns(batch, self._names, required=self._key_set)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def encode(self, batch: pa.RecordBatch) -> tuple[list[bytes], list[bytes]]:
        """(keys, values) of a client's batch, after :meth:`validate`."""
        batch = self.validate(batch)
        keys = batch.select(list(self.table.primary_key))
        return _chunked(self._encode_keys, keys), _chunked(self._encode_values, batch)

    def encode_arrays(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        """Like :meth:`encode` but as two Arrow binary arrays: no Python object per row."""
        batch = self.validate(batch)
        keys = batch.select(list(self.table.primary_key))
        return _chunked_array(self._encode_key_array, keys), _chunked_array(self._encode_value_array, batch)

    def encode_key_array(self, batch: pa.RecordBatch) -> pa.Array:
        """Like :meth:`encode_keys` but as an Arrow binary array."""
        return _chunked_array(self._encode_key_array, self._key_batch(batch))

    def encode_keys(self, batch: pa.RecordBatch) -> list[bytes]:
        """The order-preserving keys of a full-row or key-only batch."""
        return _chunked(self._encode_keys, self._key_batch(batch))

    def encode_checked_keys(self, batch: pa.RecordBatch) -> list[bytes]:
        """:meth:`encode_keys` of a batch this codec made or checked (:meth:`to_batch`, :meth:`keys_to_batch`,
        :meth:`validate`), not checked again: the table client's one pass (:mod:`kvlease.client.table_input`)."""
        return _chunked(self._encode_keys, batch.select(list(self.table.primary_key)))

    def encode_values(self, batch: pa.RecordBatch) -> list[bytes]:
        """The stored values (full rows) of a batch; validated like :meth:`validate`."""
        return _chunked(self._encode_values, self.validate(batch))

    def decode_values(self, values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.RecordBatch:
        """Full rows (table schema) from stored values; InvalidRowError if one is malformed."""
        return _decode_chunked(self._decode_values, ca.binary_array(values, "value"), self.schema)

    def decode_keys(self, keys: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.RecordBatch:
        """Primary-key columns (key schema) from encoded keys; InvalidRowError if one is malformed."""
        return _decode_chunked(self._decode_keys, ca.binary_array(keys, "key"), self.key_schema)

    # ---- internals ---------------------------------------------------------

    def _decode_values(self, array: pa.Array, base: int) -> pa.RecordBatch:
        """Rows from a binary array of values; ``base`` is the index of its first row (for errors)."""
        n, columns = len(array), self.table.columns
        nbitmap = (len(columns) + 7) // 8
        starts, ends, data = ca.layout(array)
        short = ends - starts < 1 + nbitmap
        if short.any():
            ca.corrupt("value", base + ca.first(short), "shorter than its header")
        version = data[starts]
        if np.any(version != FORMAT_VERSION):
            i = ca.first(version != FORMAT_VERSION)
            ca.corrupt("value", base + i, f"format version {version[i]}, expected {FORMAT_VERSION}")
        bitmap = np.stack([data[starts + 1 + b] for b in range(nbitmap)], axis=1)
        nulls = np.unpackbits(bitmap, axis=1, count=len(columns), bitorder="little").view(bool)
        valids = [None if not nulls[:, j].any() else ~nulls[:, j] for j in range(len(columns))]
        # loaded: per column, its values (fixed width) or its index in var_bounds (STRING/BYTES)
        pos, loaded, var_bounds = starts + 1 + nbitmap, [], []
        for column, valid in zip(columns, valids):
            dtype = np.dtype(ca.VALUE_DTYPE.get(column.type, "<u4"))  # var-width: the length
            end = pos + (dtype.itemsize if valid is None else dtype.itemsize * valid)
            ca.check_within(end, ends, base, "value", column.name)
            value = ca.load(data, pos, valid, dtype)
            if column.type in ca.VALUE_DTYPE:
                loaded.append(value)
            else:
                begin, end = end, end + value
                ca.check_within(end, ends, base, "value", column.name)
                loaded.append(len(var_bounds))
                var_bounds.append((begin, end))
            pos = end
        if np.any(pos != ends):
            ca.corrupt("value", base + ca.first(pos != ends), "has trailing bytes")
        pieces = ca.take_pieces(array, starts, ends, var_bounds) if var_bounds else None
        arrays = [ca.fixed_array(value, column.type, valid) if column.type in ca.VALUE_DTYPE
                  else ca.var_array(pieces, len(var_bounds), value, column, valid, escaped=False)
                  for column, value, valid in zip(columns, loaded, valids)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _decode_keys(self, array: pa.Array, base: int) -> pa.RecordBatch:
        """Key columns from a binary array of keys; ``base`` is the index of its first row."""
        starts, ends, data = ca.layout(array)
        # loaded: per column, its values (fixed width) or its index in var_bounds (STRING/BYTES)
        pos, loaded, var_bounds, terminators = starts, [], [], None
        for name in self.table.primary_key:
            type_ = self._types[name]
            if type_ in ca.KEY_DTYPE:
                end = pos + np.dtype(ca.KEY_DTYPE[type_]).itemsize
                ca.check_within(end, ends, base, "key", name)
                loaded.append(ca.from_key(ca.load(data, pos, None, ca.KEY_DTYPE[type_]), type_))
            else:
                if terminators is None:  # every 0x00 0x01 (an escaped 0x00 is followed by 0xFF), then a sentinel
                    terminators = np.append(np.flatnonzero((data[:-1] == 0) & (data[1:] == 1)), len(data))
                stop = terminators[np.searchsorted(terminators, pos)]  # the first one at or after pos
                end = stop + 2
                ca.check_within(end, ends, base, "key", name)
                loaded.append(len(var_bounds))
                var_bounds.append((pos, stop))
            pos = end
        if np.any(pos != ends):
            ca.corrupt("key", base + ca.first(pos != ends), "has trailing bytes")
        pieces = ca.take_pieces(array, starts, ends, var_bounds) if var_bounds else None
        arrays = []
        for name, value in zip(self.table.primary_key, loaded):
            type_ = self._types[name]
            arrays.append(ca.fixed_array(value, type_, None) if type_ in ca.KEY_DTYPE
                          else ca.var_array(pieces, len(var_bounds), value, Column(name, type_), None, escaped=True))
        return pa.RecordBatch.from_arrays(arrays, schema=self.key_schema)

    def _columns(self, batch: pa.RecordBatch, names: list[str], required: frozenset[str]) -> list[pa.Array]:
        """``batch``'s columns named ``names`` (null if absent and not required), checked."""
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidRowError(f"expected an Arrow RecordBatch, got {type(batch).__name__}")
        given = batch.schema.names
        for name in given:
            if given.count(name) > 1:
                raise InvalidRowError(f"column {show(name)} appears more than once")
            if name not in self._name_set:
                raise InvalidRowError(f"column {show(name)}: unknown column (table {self.table.path} has "
                                      f"{', '.join(self._names)})")
        arrays = []
        for name in names:
            expected = ARROW_TYPES[self._types[name]]
            if name not in given:
                if name in required:
                    raise InvalidRowError(f"column {name!r}: primary key column is missing")
                arrays.append(pa.nulls(batch.num_rows, expected))
                continue
            array = batch.column(name)
            if array.type != expected:
                raise InvalidRowError(f"column {name!r}: expected {self._types[name]} ({expected}), got {array.type}")
            if name in self._key_set and array.null_count:
                i = ca.first(np.asarray(array.is_null()))
                raise InvalidRowError(f"row {i}, column {name!r}: primary key is null")
            if self._types[name] == "TIMESTAMP":
                _check_timestamps(array, name)
            arrays.append(array)
        return arrays

    def _key_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The primary-key columns of a full-row or key-only batch, checked."""
        keys = list(self.table.primary_key)
        return pa.RecordBatch.from_arrays(self._columns(batch, keys, self._key_set), schema=self.key_schema)

    def _encode_keys(self, keys: pa.RecordBatch) -> list[bytes]:
        fixed, pieces = self._key_pieces(keys)
        if fixed is not None:  # only fixed-width columns: every key has the same length
            return fixed.view(f"V{fixed.shape[1]}").ravel().tolist()
        return ca.to_list(pc.binary_join_element_wise(*pieces, ca.EMPTY_JOIN))

    def _encode_key_array(self, keys: pa.RecordBatch) -> pa.Array:
        fixed, pieces = self._key_pieces(keys)
        if fixed is not None:
            return ca.fixed_binary(fixed, None)
        return pc.binary_join_element_wise(*pieces, ca.EMPTY_JOIN)

    def _key_pieces(self, keys: pa.RecordBatch) -> tuple[np.ndarray | None, list]:
        """``(rows, [])``: a (rows, width) uint8 array when every key column is fixed-width;
        else ``(None, pieces)`` whose element-wise join is the keys."""
        fixed, pieces = [], []  # runs of fixed-width columns become one (rows, width) array
        for name, array in zip(keys.schema.names, keys.columns):
            type_ = self._types[name]
            if type_ in ca.KEY_DTYPE:
                fixed.append(ca.key_bytes(array, type_))
                continue
            if fixed:
                pieces.append(ca.fixed_binary(np.hstack(fixed), None))
                fixed = []
            raw = array.view(pa.binary())
            if ca.has_zero_byte(raw):
                raw = pc.replace_substring(raw, ca.ESCAPE, ca.ESCAPED)
            pieces += [raw, pa.scalar(ca.TERMINATOR, pa.binary())]
        if not pieces:
            return (np.ascontiguousarray(np.hstack(fixed)) if len(fixed) > 1 else fixed[0]), []
        if fixed:
            pieces.append(ca.fixed_binary(np.hstack(fixed), None))
        return None, pieces

    def _encode_values(self, batch: pa.RecordBatch) -> list[bytes]:
        return ca.to_list(self._encode_value_array(batch))

    def _encode_value_array(self, batch: pa.RecordBatch) -> pa.Array:
        n, columns = batch.num_rows, self.table.columns
        valids = [np.asarray(a.is_valid()) if a.null_count else None for a in batch.columns]
        header = np.zeros((n, 1 + (len(columns) + 7) // 8), np.uint8)
        header[:, 0] = FORMAT_VERSION
        if any(v is not None for v in valids):
            nulls = np.zeros((n, len(columns)), bool)
            for j, valid in enumerate(valids):
                if valid is not None:
                    nulls[:, j] = ~valid
            header[:, 1:] = np.packbits(nulls, axis=1, bitorder="little")
        # Pieces joined row by row. Fixed-width bytes of columns without nulls (the header, numbers,
        # string lengths) that follow each other become one (rows, width) block: the join's cost grows
        # with its pieces. A piece of a column with nulls keeps its own validity (a null piece adds no bytes).
        pieces: list[pa.Array] = []
        block: list[np.ndarray] = [header]

        def add(piece: pa.Array | None) -> None:
            if block:
                pieces.append(ca.fixed_binary(np.hstack(block) if len(block) > 1 else block[0], None))
                block.clear()
            if piece is not None:
                pieces.append(piece)

        for column, array, valid in zip(columns, batch.columns, valids):
            validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
            raw = None
            if column.type in ca.VALUE_DTYPE:
                fixed = ca.fixed_values(array, ca.VALUE_DTYPE[column.type]).view(np.uint8).reshape(n, -1)
            else:  # a uint32 length, then the bytes (a null slot's length is never stored: its piece is null)
                raw = array.view(pa.binary())
                fixed = np.diff(ca.value_offsets(raw)).astype("<u4").view(np.uint8).reshape(n, 4)
            if validity is None:
                block.append(fixed)
            else:
                add(ca.fixed_binary(fixed, validity))
            if raw is not None:
                add(raw)
        add(None)
        if len(pieces) == 1:
            return pieces[0]
        return pc.binary_join_element_wise(*pieces, ca.EMPTY_JOIN, null_handling="skip")


# ---- helpers: Python values ------------------------------------------------

#: The TIMESTAMP values a reader can turn into a ``datetime`` (years 1 to 9999), in µs since the epoch.
TIMESTAMP_MIN_US = -62_135_596_800_000_000
TIMESTAMP_MAX_US = 253_402_300_799_999_999


def _check_timestamps(array: pa.Array, name: str) -> None:
    """InvalidRowError naming the first value outside years 1-9999: stored, it could never be read back as a
    ``datetime`` (every dict read of its bucket would fail)."""
    micros = array.cast(pa.int64())
    bounds = pc.min_max(micros)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or (low >= TIMESTAMP_MIN_US and high <= TIMESTAMP_MAX_US):
        return
    values = micros.fill_null(0).to_numpy()  # 0 is in range: nulls never count
    i = ca.first((values < TIMESTAMP_MIN_US) | (values > TIMESTAMP_MAX_US))
    raise InvalidRowError(f"row {i}, column {name!r}: {int(values[i])} µs since the epoch is outside the TIMESTAMP "
                          f"range (years 1 to 9999)")


def _chunked(encode: Callable[[pa.RecordBatch], list[bytes]], batch: pa.RecordBatch) -> list[bytes]:
    """``encode`` applied to slices of ``CHUNK_ROWS`` rows (bounded temporaries, no 2 GiB offsets)."""
    if batch.num_rows <= CHUNK_ROWS:
        return encode(batch) if batch.num_rows else []
    out: list[bytes] = []
    for start in range(0, batch.num_rows, CHUNK_ROWS):
        out += encode(batch.slice(start, CHUNK_ROWS))
    return out


def _chunked_array(encode: Callable[[pa.RecordBatch], pa.Array], batch: pa.RecordBatch) -> pa.Array:
    """Like :func:`_chunked` for encoders that return a binary array (the pieces concatenated)."""
    if batch.num_rows <= CHUNK_ROWS:
        return encode(batch) if batch.num_rows else pa.array([], pa.binary())
    return pa.concat_arrays([encode(batch.slice(start, CHUNK_ROWS))
                             for start in range(0, batch.num_rows, CHUNK_ROWS)])


def _decode_chunked(decode: Callable[[pa.Array, int], pa.RecordBatch], array: pa.Array,
                    schema: pa.Schema) -> pa.RecordBatch:
    if not len(array):
        return pa.RecordBatch.from_pylist([], schema=schema)
    if len(array) <= CHUNK_ROWS:
        return decode(array, 0)
    return pa.concat_batches([decode(array.slice(start, CHUNK_ROWS), start)
                              for start in range(0, len(array), CHUNK_ROWS)])
