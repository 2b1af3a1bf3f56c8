"""Row codec: Arrow batches <-> RocksDB keys and values, vectorized.

A tablet server stores each row of a primary-key table in RocksDB as
``key = encode_keys(row)`` and ``value = encode_values(row)``; the changelog
keeps the same bytes. Rows travel between client and server as Arrow IPC
RecordBatches (:func:`batch_to_ipc`, :func:`ipc_to_batch`).

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
Python 3): stable across processes, versions and platforms.

Malformed input (client rows, batches) raises :class:`InvalidRowError` naming
the row and column; so do bytes that are not a value or key of this table.
"""

from __future__ import annotations

import datetime
import zlib
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import InvalidRowError
from common.tables import Column, TableInfo

FORMAT_VERSION = 1
#: Rows encoded or decoded in one vectorized pass; keeps temporaries in cache-sized pieces.
CHUNK_ROWS = 1 << 16

ARROW_TYPES: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "INT": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "BYTES": pa.binary(),
    "TIMESTAMP": pa.timestamp("us"),
}
#: numpy dtype of each fixed-width type as stored in a value (little-endian).
_VALUE_DTYPE = {"BOOLEAN": "u1", "INT": "<i4", "BIGINT": "<i8", "DOUBLE": "<f8", "TIMESTAMP": "<i8"}
#: numpy dtype of the unsigned big-endian integer a key column becomes.
_KEY_DTYPE = {"BOOLEAN": "u1", "INT": ">u4", "BIGINT": ">u8", "DOUBLE": ">u8", "TIMESTAMP": ">u8"}
_SIGN = {"INT": np.uint32(1 << 31), "BIGINT": np.uint64(1 << 63), "TIMESTAMP": np.uint64(1 << 63)}
_TOP = np.uint64(1 << 63)
_CANONICAL_NAN = np.uint64(0x7FF8000000000000)
_ESCAPE, _ESCAPED, _TERMINATOR = b"\x00", b"\x00\xff", b"\x00\x01"
_EMPTY_JOIN = pa.scalar(b"", pa.binary())


def arrow_schema(table: TableInfo) -> pa.Schema:
    """The Arrow schema of a full row of ``table`` (every field nullable)."""
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in table.columns])


def key_schema(table: TableInfo) -> pa.Schema:
    """The Arrow schema of ``table``'s primary key, in primary-key order."""
    types = {c.name: c.type for c in table.columns}
    return pa.schema([pa.field(k, ARROW_TYPES[types[k]]) for k in table.primary_key])


def bucket_of(key: bytes, num_buckets: int) -> int:
    """The bucket of an encoded key: ``zlib.crc32(key) % num_buckets``.

    Stable forever (changing it would move rows between buckets): crc32 is the
    IEEE 802.3 CRC, unsigned in Python 3, and the same on every platform.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be at least 1, got {num_buckets}")
    return zlib.crc32(key) % num_buckets


def bucket_of_keys(keys: Iterable[bytes], num_buckets: int) -> list[int]:
    """:func:`bucket_of` of every key."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be at least 1, got {num_buckets}")
    crcs = np.fromiter(map(zlib.crc32, keys), dtype=np.uint64)
    return (crcs % np.uint64(num_buckets)).tolist()


def batch_to_ipc(batch: pa.RecordBatch) -> bytes:
    """``batch`` as the bytes of an Arrow IPC stream (schema + one batch)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def ipc_to_batch(data: bytes | pa.Buffer) -> pa.RecordBatch:
    """The batch in an Arrow IPC stream (several are concatenated; none gives an empty batch).

    Raises InvalidRowError when ``data`` is not an Arrow IPC stream.
    """
    try:
        reader = pa.ipc.open_stream(data)
        batches = list(reader)
    except (pa.ArrowException, OSError) as e:
        raise InvalidRowError(f"not an Arrow IPC stream: {e}") from None
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=reader.schema)
    return pa.concat_batches(batches)


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
            raise InvalidRowError(f"row {i}: expected a dict of column -> value, got {_show(rows[i])}")
        unknown = set().union(*rows) - self._name_set
        if unknown:
            i, name = next((i, k) for i, r in enumerate(rows) for k in r if k not in self._name_set)
            raise InvalidRowError(f"row {i}, column {name!r}: unknown column (table {self.table.path} has "
                                  f"{', '.join(self._names)})")
        arrays, errors = [], []  # errors: (row, message) of each column's first bad value
        for name in self._names:
            values = [row.get(name) for row in rows]
            type_ = self._types[name]
            bad = _first_bad_type(values, type_, nullable=name not in self._key_set)
            if bad is None:
                try:
                    arrays.append(pa.array(values, type=ARROW_TYPES[type_]))
                    continue
                except _CONVERSION_ERRORS:
                    bad = len(values)
            # the error path: an earlier value may be of the right type but out of range
            error = _first_unconvertible(values[:bad], name, type_)
            if error is None and bad == len(values):
                error = (0, f"column {name!r}: cannot convert the values to {type_}")
            elif error is None and values[bad] is None:
                why = "is null" if name in rows[bad] else "is missing"
                error = (bad, f"row {bad}, column {name!r}: primary key {why}")
            elif error is None:
                error = (bad, f"row {bad}, column {name!r}: expected {type_}, got {_show(values[bad])}")
            errors.append(error)
        if errors:
            raise InvalidRowError(min(errors)[1])
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

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

    def encode_keys(self, batch: pa.RecordBatch) -> list[bytes]:
        """The order-preserving keys of a full-row or key-only batch."""
        return _chunked(self._encode_keys, self._key_batch(batch))

    def encode_values(self, batch: pa.RecordBatch) -> list[bytes]:
        """The stored values (full rows) of a batch; validated like :meth:`validate`."""
        return _chunked(self._encode_values, self.validate(batch))

    def decode_values(self, values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.RecordBatch:
        """Full rows (table schema) from stored values; InvalidRowError if one is malformed."""
        return _decode_chunked(self._decode_values, _binary_array(values, "value"), self.schema)

    def decode_keys(self, keys: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.RecordBatch:
        """Primary-key columns (key schema) from encoded keys; InvalidRowError if one is malformed."""
        return _decode_chunked(self._decode_keys, _binary_array(keys, "key"), self.key_schema)

    # ---- internals ---------------------------------------------------------

    def _decode_values(self, array: pa.Array, base: int) -> pa.RecordBatch:
        """Rows from a binary array of values; ``base`` is the index of its first row (for errors)."""
        n, columns = len(array), self.table.columns
        nbitmap = (len(columns) + 7) // 8
        starts, ends, data = _layout(array)
        short = ends - starts < 1 + nbitmap
        if short.any():
            _corrupt("value", base + _first(short), "shorter than its header")
        version = data[starts]
        if np.any(version != FORMAT_VERSION):
            i = _first(version != FORMAT_VERSION)
            _corrupt("value", base + i, f"format version {version[i]}, expected {FORMAT_VERSION}")
        bitmap = np.stack([data[starts + 1 + b] for b in range(nbitmap)], axis=1)
        nulls = np.unpackbits(bitmap, axis=1, count=len(columns), bitorder="little").view(bool)
        valids = [None if not nulls[:, j].any() else ~nulls[:, j] for j in range(len(columns))]
        # loaded: per column, its values (fixed width) or its index in var_bounds (STRING/BYTES)
        pos, loaded, var_bounds = starts + 1 + nbitmap, [], []
        for column, valid in zip(columns, valids):
            dtype = np.dtype(_VALUE_DTYPE.get(column.type, "<u4"))  # var-width: the length
            end = pos + (dtype.itemsize if valid is None else dtype.itemsize * valid)
            _check_within(end, ends, base, "value", column.name)
            value = _load(data, pos, valid, dtype)
            if column.type in _VALUE_DTYPE:
                loaded.append(value)
            else:
                begin, end = end, end + value
                _check_within(end, ends, base, "value", column.name)
                loaded.append(len(var_bounds))
                var_bounds.append((begin, end))
            pos = end
        if np.any(pos != ends):
            _corrupt("value", base + _first(pos != ends), "has trailing bytes")
        pieces = _pieces(array, starts, ends, var_bounds) if var_bounds else None
        arrays = [_fixed_array(value, column.type, valid) if column.type in _VALUE_DTYPE
                  else _var_array(pieces, len(var_bounds), value, column, valid, escaped=False)
                  for column, value, valid in zip(columns, loaded, valids)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _decode_keys(self, array: pa.Array, base: int) -> pa.RecordBatch:
        """Key columns from a binary array of keys; ``base`` is the index of its first row."""
        starts, ends, data = _layout(array)
        # loaded: per column, its values (fixed width) or its index in var_bounds (STRING/BYTES)
        pos, loaded, var_bounds, terminators = starts, [], [], None
        for name in self.table.primary_key:
            type_ = self._types[name]
            if type_ in _KEY_DTYPE:
                end = pos + np.dtype(_KEY_DTYPE[type_]).itemsize
                _check_within(end, ends, base, "key", name)
                loaded.append(_from_key(_load(data, pos, None, _KEY_DTYPE[type_]), type_))
            else:
                if terminators is None:  # every 0x00 0x01 (an escaped 0x00 is followed by 0xFF), then a sentinel
                    terminators = np.append(np.flatnonzero((data[:-1] == 0) & (data[1:] == 1)), len(data))
                stop = terminators[np.searchsorted(terminators, pos)]  # the first one at or after pos
                end = stop + 2
                _check_within(end, ends, base, "key", name)
                loaded.append(len(var_bounds))
                var_bounds.append((pos, stop))
            pos = end
        if np.any(pos != ends):
            _corrupt("key", base + _first(pos != ends), "has trailing bytes")
        pieces = _pieces(array, starts, ends, var_bounds) if var_bounds else None
        arrays = []
        for name, value in zip(self.table.primary_key, loaded):
            type_ = self._types[name]
            arrays.append(_fixed_array(value, type_, None) if type_ in _KEY_DTYPE
                          else _var_array(pieces, len(var_bounds), value, Column(name, type_), None, escaped=True))
        return pa.RecordBatch.from_arrays(arrays, schema=self.key_schema)

    def _columns(self, batch: pa.RecordBatch, names: list[str], required: frozenset[str]) -> list[pa.Array]:
        """``batch``'s columns named ``names`` (null if absent and not required), checked."""
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidRowError(f"expected an Arrow RecordBatch, got {type(batch).__name__}")
        given = batch.schema.names
        for name in given:
            if given.count(name) > 1:
                raise InvalidRowError(f"column {name!r} appears more than once")
            if name not in self._name_set:
                raise InvalidRowError(f"column {name!r}: unknown column (table {self.table.path} has "
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
                i = _first(np.asarray(array.is_null()))
                raise InvalidRowError(f"row {i}, column {name!r}: primary key is null")
            arrays.append(array)
        return arrays

    def _key_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The primary-key columns of a full-row or key-only batch, checked."""
        keys = list(self.table.primary_key)
        return pa.RecordBatch.from_arrays(self._columns(batch, keys, self._key_set), schema=self.key_schema)

    def _encode_keys(self, keys: pa.RecordBatch) -> list[bytes]:
        fixed, pieces = [], []  # runs of fixed-width columns become one (rows, width) array
        for name, array in zip(keys.schema.names, keys.columns):
            type_ = self._types[name]
            if type_ in _KEY_DTYPE:
                fixed.append(_key_bytes(array, type_))
                continue
            if fixed:
                pieces.append(_fixed_binary(np.hstack(fixed), None))
                fixed = []
            raw = array.view(pa.binary())
            if _has_zero_byte(raw):
                raw = pc.replace_substring(raw, _ESCAPE, _ESCAPED)
            pieces += [raw, pa.scalar(_TERMINATOR, pa.binary())]
        if not pieces:  # only fixed-width columns: every key has the same length
            rows = np.ascontiguousarray(np.hstack(fixed)) if len(fixed) > 1 else fixed[0]
            return rows.view(f"V{rows.shape[1]}").ravel().tolist()
        if fixed:
            pieces.append(_fixed_binary(np.hstack(fixed), None))
        return _to_list(pc.binary_join_element_wise(*pieces, _EMPTY_JOIN))

    def _encode_values(self, batch: pa.RecordBatch) -> list[bytes]:
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
        pieces = [_fixed_binary(header, None)]
        for column, array, valid in zip(columns, batch.columns, valids):
            validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
            if column.type in _VALUE_DTYPE:
                values = _fixed_values(array, _VALUE_DTYPE[column.type])
                pieces.append(_fixed_binary(values.view(np.uint8).reshape(n, -1), validity))
            else:
                raw = array.view(pa.binary())
                lengths = pc.binary_length(raw).fill_null(0).to_numpy().astype("<u4")
                pieces += [_fixed_binary(lengths.view(np.uint8).reshape(n, 4), validity), raw]
        # a null piece is skipped: a null column contributes no bytes
        return _to_list(pc.binary_join_element_wise(*pieces, _EMPTY_JOIN, null_handling="skip"))


# ---- helpers: Python values ------------------------------------------------

_CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)
_ALLOWED = {
    "BOOLEAN": (bool, np.bool_),
    "INT": (int, np.integer),
    "BIGINT": (int, np.integer),
    "DOUBLE": (float, int, np.floating, np.integer),
    "STRING": (str,),
    "BYTES": (bytes, bytearray, memoryview),
    "TIMESTAMP": (datetime.datetime, int, np.integer),
}


def _first_bad_type(values: list, type_: str, nullable: bool) -> int | None:
    """Index of the first value whose Python type ``type_`` does not take (None if all fit)."""
    allowed = _ALLOWED[type_]

    def ok(t: type) -> bool:
        if t is type(None):
            return nullable
        return issubclass(t, allowed) and (type_ == "BOOLEAN" or not issubclass(t, (bool, np.bool_)))

    if all(ok(t) for t in set(map(type, values))):  # one pass in C over the values
        return None
    return next(i for i, v in enumerate(values) if not ok(type(v)))


def _first_unconvertible(values: list, name: str, type_: str) -> tuple[int, str] | None:
    """(row, message) of the first value Arrow cannot convert to ``type_`` (e.g. out of range)."""
    for i, value in enumerate(values):
        try:
            pa.array([value], type=ARROW_TYPES[type_])
        except _CONVERSION_ERRORS as e:
            return i, f"row {i}, column {name!r}: expected {type_}, got {_show(value)} ({e})"
    return None


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- helpers: encoding -----------------------------------------------------

def _chunked(encode: Callable[[pa.RecordBatch], list[bytes]], batch: pa.RecordBatch) -> list[bytes]:
    """``encode`` applied to slices of ``CHUNK_ROWS`` rows (bounded temporaries, no 2 GiB offsets)."""
    if batch.num_rows <= CHUNK_ROWS:
        return encode(batch) if batch.num_rows else []
    out: list[bytes] = []
    for start in range(0, batch.num_rows, CHUNK_ROWS):
        out += encode(batch.slice(start, CHUNK_ROWS))
    return out


def _decode_chunked(decode: Callable[[pa.Array, int], pa.RecordBatch], array: pa.Array,
                    schema: pa.Schema) -> pa.RecordBatch:
    if not len(array):
        return pa.RecordBatch.from_pylist([], schema=schema)
    if len(array) <= CHUNK_ROWS:
        return decode(array, 0)
    return pa.concat_batches([decode(array.slice(start, CHUNK_ROWS), start)
                              for start in range(0, len(array), CHUNK_ROWS)])


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _fixed_values(array: pa.Array, dtype: str) -> np.ndarray:
    """The data of a fixed-width array as numpy (null slots hold anything)."""
    n, offset = len(array), array.offset
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(array.buffers()[1], np.uint8)
        return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:]
    return np.frombuffer(array.buffers()[1], dtype, count=offset + n)[offset:]  # Arrow data is little-endian


def _key_bytes(array: pa.Array, type_: str) -> np.ndarray:
    """(rows, width) uint8: the order-preserving bytes of a fixed-width key column."""
    n = len(array)
    if type_ == "BOOLEAN":
        return _fixed_values(array, "u1").reshape(n, 1)
    if type_ == "DOUBLE":
        bits = _fixed_values(array, "<f8").view(np.uint64)
        bits = np.where(np.isnan(bits.view(np.float64)), _CANONICAL_NAN, bits)
        flipped = np.where(bits & _TOP != 0, ~bits, bits | _TOP)
    else:
        unsigned = _fixed_values(array, _VALUE_DTYPE[type_]).view(_KEY_DTYPE[type_].replace(">", "<"))
        flipped = unsigned ^ _SIGN[type_]
    return flipped.astype(_KEY_DTYPE[type_]).view(np.uint8).reshape(n, -1)


def _fixed_binary(rows: np.ndarray, validity: pa.Buffer | None) -> pa.Array:
    """A binary array whose element i is ``rows[i]`` ((rows, width) uint8), zero-copy."""
    n, width = rows.shape
    rows = np.ascontiguousarray(rows)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(rows)])


def _has_zero_byte(raw: pa.Array) -> bool:
    start, stop = _offsets(raw)[[0, -1]]
    return bool(np.any(_data(raw)[start:stop] == 0))


def _to_list(array: pa.Array) -> list[bytes]:
    """A binary array's elements as Python bytes."""
    return array.to_pylist()


# ---- helpers: decoding -----------------------------------------------------

def _binary_array(values, what: str) -> pa.Array:
    """``values`` (bytes, or a binary Arrow array) as one binary array without nulls."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = values if isinstance(values, list) else list(values)
        try:
            array = pa.array(values, pa.binary())
            if isinstance(array, pa.ChunkedArray):  # past 2 GiB
                array = pa.array(values, pa.large_binary())
        except (pa.ArrowException, TypeError):
            i = next((i for i, v in enumerate(values) if not isinstance(v, (bytes, bytearray, memoryview))), 0)
            raise InvalidRowError(f"row {i}: {what} must be bytes, got {_show(values[i])}") from None
        values = array
    elif not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise InvalidRowError(f"{what}s must be a binary Arrow array, got {values.type}")
    if values.null_count:
        raise InvalidRowError(f"row {_first(np.asarray(values.is_null()))}: {what} is null")
    return values


def _offsets(array: pa.Array) -> np.ndarray:
    dtype = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    return np.frombuffer(array.buffers()[1], dtype, count=array.offset + len(array) + 1)[array.offset:]


def _layout(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, data): where each element lies in the array's data buffer."""
    offsets = _offsets(array).astype(np.int64)
    return offsets[:-1], offsets[1:], _data(array)


def _data(array: pa.Array) -> np.ndarray:
    buffer = array.buffers()[2]
    return np.frombuffer(buffer, np.uint8) if buffer is not None else np.zeros(0, np.uint8)


def _load(data: np.ndarray, positions: np.ndarray, valid: np.ndarray | None, dtype) -> np.ndarray:
    """The ``dtype`` value starting at each byte position of ``data`` (0 where not valid).

    One gather through a view with a stride of one byte (unaligned loads); the
    caller has checked that every valid position is in bounds.
    """
    dtype = np.dtype(dtype)
    view = np.ndarray((max(len(data) - dtype.itemsize + 1, 0),), dtype, buffer=data, strides=(1,))
    if valid is None:
        return view[positions]
    out = np.zeros(len(positions), dtype)
    out[valid] = view[positions[valid]]
    return out


def _check_within(end: np.ndarray, ends: np.ndarray, base: int, what: str, column: str) -> None:
    if np.any(end > ends):
        _corrupt(what, base + _first(end > ends), f"ends inside column {column!r}")


def _corrupt(what: str, row: int, why: str) -> None:
    raise InvalidRowError(f"row {row}: not a {what} of this table ({why})")


def _pieces(array: pa.Array, starts, ends, bounds) -> pa.Array:
    """One binary array over ``array``'s data whose element ``row * (2k + 1) + 2j + 1`` is column j of row.

    ``bounds`` holds (begin, end) per column; every boundary was checked to be
    monotonic within its row, so the offsets are valid Arrow offsets.
    """
    n, k = len(starts), len(bounds)
    large = pa.types.is_large_binary(array.type)
    flat = np.empty(n * (2 * k + 1) + 1, np.int64 if large else np.int32)
    offsets = flat[:-1].reshape(n, 2 * k + 1)
    offsets[:, 0] = starts
    for j, (begin, end) in enumerate(bounds):
        offsets[:, 2 * j + 1] = begin
        offsets[:, 2 * j + 2] = end
    flat[-1] = ends[-1]
    return pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), len(flat) - 1,
                                 [None, pa.py_buffer(flat), array.buffers()[2]])


def _fixed_array(values: np.ndarray, type_: str, valid: np.ndarray | None) -> pa.Array:
    """An Arrow array of a fixed-width type from its values (``valid`` None: no nulls)."""
    validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if type_ == "BOOLEAN":
        data = np.packbits(values != 0, bitorder="little")
    else:
        data = values.astype(values.dtype.newbyteorder("="), copy=False)
    return pa.Array.from_buffers(ARROW_TYPES[type_], len(values), [validity, pa.py_buffer(data)])


def _var_array(pieces: pa.Array, k: int, j: int, column: Column, valid: np.ndarray | None, escaped: bool) -> pa.Array:
    """STRING/BYTES column from piece j of the k per row in ``pieces`` (see :func:`_pieces`)."""
    n = (len(pieces)) // (2 * k + 1)
    index = np.arange(n, dtype=np.int64) * (2 * k + 1) + (2 * j + 1)
    taken = pc.take(pieces, pa.array(index, mask=None if valid is None else ~valid))
    if not pa.types.is_binary(taken.type):
        taken = taken.cast(pa.binary())
    if escaped and _has_zero_byte(taken):
        taken = pc.replace_substring(taken, _ESCAPED, _ESCAPE)
    if column.type == "BYTES":
        return taken
    try:
        return taken.cast(pa.string())
    except pa.ArrowInvalid as e:
        raise InvalidRowError(f"column {column.name!r}: stored STRING is not valid UTF-8 ({e})") from None


def _from_key(values: np.ndarray, type_: str) -> np.ndarray:
    """Order-preserving big-endian key values back to their type (native byte order)."""
    unsigned = values.astype(values.dtype.newbyteorder("="))
    if type_ == "BOOLEAN":
        return unsigned
    if type_ == "DOUBLE":
        return np.where(unsigned & _TOP != 0, unsigned ^ _TOP, ~unsigned).view(np.float64)
    return (unsigned ^ _SIGN[type_]).view(_VALUE_DTYPE[type_])
