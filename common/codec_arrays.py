"""Column-level primitives of the row codec (:mod:`kvlease.common.codec`): numpy and Arrow, no loop per row.

Each function works on a whole Arrow array or numpy buffer: fixed-width
values and order-preserving key bytes, variable-width pieces with their
offsets, and the checks that name the first bad row of a column.
"""

from __future__ import annotations

import datetime

import kvlease.common.pandas_first  # noqa: F401 (before pyarrow: a Ctrl-C during pandas' import is not lost)
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.errors import InvalidRowError, show  # noqa: F401 (show: used here and by common.codec)
from kvlease.common.columns import INT_RANGE, Column

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
VALUE_DTYPE = {"BOOLEAN": "u1", "INT": "<i4", "BIGINT": "<i8", "DOUBLE": "<f8", "TIMESTAMP": "<i8"}
#: numpy dtype of the unsigned big-endian integer a key column becomes.
KEY_DTYPE = {"BOOLEAN": "u1", "INT": ">u4", "BIGINT": ">u8", "DOUBLE": ">u8", "TIMESTAMP": ">u8"}
SIGN = {"INT": np.uint32(1 << 31), "BIGINT": np.uint64(1 << 63), "TIMESTAMP": np.uint64(1 << 63)}
TOP = np.uint64(1 << 63)
CANONICAL_NAN = np.uint64(0x7FF8000000000000)
ESCAPE, ESCAPED, TERMINATOR = b"\x00", b"\x00\xff", b"\x00\x01"
EMPTY_JOIN = pa.scalar(b"", pa.binary())


CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)
#: The values an INT or BIGINT column holds.
ALLOWED = {
    "BOOLEAN": (bool, np.bool_),
    "INT": (int, np.integer),
    "BIGINT": (int, np.integer),
    "DOUBLE": (float, int, np.floating, np.integer),
    "STRING": (str,),
    "BYTES": (bytes, bytearray, memoryview),
    "TIMESTAMP": (datetime.datetime, int, np.integer),
}


def first_bad_type(values: list, type_: str, nullable: bool) -> int | None:
    """Index of the first value whose Python type ``type_`` does not take (None if all fit)."""
    allowed = ALLOWED[type_]

    def ok(t: type) -> bool:
        if t is type(None):
            return nullable
        return issubclass(t, allowed) and (type_ == "BOOLEAN" or not issubclass(t, (bool, np.bool_)))

    if all(ok(t) for t in set(map(type, values))):  # one pass in C over the values
        return None
    return next(i for i, v in enumerate(values) if not ok(type(v)))


def first_unconvertible(values: list, name: str, type_: str) -> tuple[int, str] | None:
    """(row, message) of the first value Arrow cannot convert to ``type_`` (e.g. out of range)."""
    for i, value in enumerate(values):
        if type_ in INT_RANGE and isinstance(value, int) and not isinstance(value, bool):
            low, high = INT_RANGE[type_]
            if not low <= value <= high:
                return i, f"row {i}, column {name!r}: {show(value)} is out of range for {type_} ({low}..{high})"
        try:
            pa.array([value], type=ARROW_TYPES[type_])
        except CONVERSION_ERRORS as e:
            return i, f"row {i}, column {name!r}: expected {type_}, got {show(value)} ({e})"
    return None


# ---- helpers: encoding -----------------------------------------------------

def first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def fixed_values(array: pa.Array, dtype: str) -> np.ndarray:
    """The data of a fixed-width array as numpy (null slots hold anything)."""
    n, offset = len(array), array.offset
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(array.buffers()[1], np.uint8)
        return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:]
    return np.frombuffer(array.buffers()[1], dtype, count=offset + n)[offset:]  # Arrow data is little-endian


def key_bytes(array: pa.Array, type_: str) -> np.ndarray:
    """(rows, width) uint8: the order-preserving bytes of a fixed-width key column."""
    n = len(array)
    if type_ == "BOOLEAN":
        return fixed_values(array, "u1").reshape(n, 1)
    if type_ == "DOUBLE":
        bits = fixed_values(array, "<f8").view(np.uint64)
        bits = np.where(np.isnan(bits.view(np.float64)), CANONICAL_NAN, bits)
        flipped = np.where(bits & TOP != 0, ~bits, bits | TOP)
    else:
        unsigned = fixed_values(array, VALUE_DTYPE[type_]).view(KEY_DTYPE[type_].replace(">", "<"))
        flipped = unsigned ^ SIGN[type_]
    return flipped.astype(KEY_DTYPE[type_]).view(np.uint8).reshape(n, -1)


def fixed_binary(rows: np.ndarray, validity: pa.Buffer | None) -> pa.Array:
    """A binary array whose element i is ``rows[i]`` ((rows, width) uint8), zero-copy."""
    n, width = rows.shape
    rows = np.ascontiguousarray(rows)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(rows)])


def has_zero_byte(raw: pa.Array) -> bool:
    start, stop = value_offsets(raw)[[0, -1]]
    return bool(np.any(data_bytes(raw)[start:stop] == 0))


def to_list(array: pa.Array) -> list[bytes]:
    """A binary array's elements as Python bytes."""
    return array.to_pylist()


# ---- helpers: decoding -----------------------------------------------------

def binary_array(values, what: str) -> pa.Array:
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
            raise InvalidRowError(f"row {i}: {what} must be bytes, got {show(values[i])}") from None
        values = array
    elif not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise InvalidRowError(f"{what}s must be a binary Arrow array, got {values.type}")
    if values.null_count:
        raise InvalidRowError(f"row {first(np.asarray(values.is_null()))}: {what} is null")
    return values


def value_offsets(array: pa.Array) -> np.ndarray:
    dtype = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    return np.frombuffer(array.buffers()[1], dtype, count=array.offset + len(array) + 1)[array.offset:]


def layout(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, data): where each element lies in the array's data buffer."""
    offsets = value_offsets(array).astype(np.int64)
    return offsets[:-1], offsets[1:], data_bytes(array)


def data_bytes(array: pa.Array) -> np.ndarray:
    buffer = array.buffers()[2]
    return np.frombuffer(buffer, np.uint8) if buffer is not None else np.zeros(0, np.uint8)


def load(data: np.ndarray, positions: np.ndarray, valid: np.ndarray | None, dtype) -> np.ndarray:
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


def check_within(end: np.ndarray, ends: np.ndarray, base: int, what: str, column: str) -> None:
    if np.any(end > ends):
        corrupt(what, base + first(end > ends), f"ends inside column {column!r}")


def corrupt(what: str, row: int, why: str) -> None:
    raise InvalidRowError(f"row {row}: not a {what} of this table ({why})")


def take_pieces(array: pa.Array, starts, ends, bounds) -> pa.Array:
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


def fixed_array(values: np.ndarray, type_: str, valid: np.ndarray | None) -> pa.Array:
    """An Arrow array of a fixed-width type from its values (``valid`` None: no nulls)."""
    validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if type_ == "BOOLEAN":
        data = np.packbits(values != 0, bitorder="little")
    else:
        data = values.astype(values.dtype.newbyteorder("="), copy=False)
    return pa.Array.from_buffers(ARROW_TYPES[type_], len(values), [validity, pa.py_buffer(data)])


def var_array(pieces: pa.Array, k: int, j: int, column: Column, valid: np.ndarray | None, escaped: bool) -> pa.Array:
    """STRING/BYTES column from piece j of the k per row in ``pieces`` (see :func:`take_pieces`)."""
    n = (len(pieces)) // (2 * k + 1)
    index = np.arange(n, dtype=np.int64) * (2 * k + 1) + (2 * j + 1)
    taken = pc.take(pieces, pa.array(index, mask=None if valid is None else ~valid))
    if not pa.types.is_binary(taken.type):
        taken = taken.cast(pa.binary())
    if escaped and has_zero_byte(taken):
        taken = pc.replace_substring(taken, ESCAPED, ESCAPE)
    if column.type == "BYTES":
        return taken
    try:
        return taken.cast(pa.string())
    except pa.ArrowInvalid as e:
        raise InvalidRowError(f"column {column.name!r}: stored STRING is not valid UTF-8 ({e})") from None


def from_key(values: np.ndarray, type_: str) -> np.ndarray:
    """Order-preserving big-endian key values back to their type (native byte order)."""
    unsigned = values.astype(values.dtype.newbyteorder("="))
    if type_ == "BOOLEAN":
        return unsigned
    if type_ == "DOUBLE":
        return np.where(unsigned & TOP != 0, unsigned ^ TOP, ~unsigned).view(np.float64)
    return (unsigned ^ SIGN[type_]).view(VALUE_DTYPE[type_])
