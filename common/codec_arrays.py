"""Column-level primitives of the row codec (:mod:`kvlease.common.codec`): numpy and Arrow, no loop per row.

Each function works on a whole Arrow array or numpy buffer: fixed-width
values and order-preserving key bytes, variable-width pieces with their
offsets, and the checks that name the first bad row of a column.
"""

from __future__ import annotations

from kvlease.common import arrow_pandas

arrow_pandas.prepare()  # before pyarrow's first use (common/arrow_pandas.py)
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.errors import InvalidRowError, show  # noqa: F401 (show: used here and by common.codec)
from kvlease.common.columns import Column
from kvlease.common.codec_types import ARROW_TYPES, Layout  # noqa: F401 (ARROW_TYPES: re-exported)

#: The sign bit of an unsigned integer of each width (bytes), and the one NaN a FLOAT / DOUBLE key stores.
SIGN = {1: np.uint8(1 << 7), 2: np.uint16(1 << 15), 4: np.uint32(1 << 31), 8: np.uint64(1 << 63)}
TOP = SIGN[8]
CANONICAL_NAN = {4: np.uint32(0x7FC00000), 8: np.uint64(0x7FF8000000000000)}
ESCAPE, ESCAPED, TERMINATOR = b"\x00", b"\x00\xff", b"\x00\x01"
EMPTY_JOIN = pa.scalar(b"", pa.binary())


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


def decimal_words(array: pa.Array) -> np.ndarray:
    """(rows, 2) little-endian int64 of a decimal128 array: the low and the high word of each unscaled value."""
    n, offset = len(array), array.offset
    return np.frombuffer(array.buffers()[1], "<i8", count=2 * (offset + n))[2 * offset:].reshape(n, 2)


def value_bytes(array: pa.Array, layout: Layout) -> np.ndarray:
    """(rows, width) uint8: the stored bytes of a fixed-width column (null slots hold anything)."""
    n = len(array)
    if layout.name == "DECIMAL":
        words = decimal_words(array)
        chosen = words if layout.value_dtype == "V16" else np.ascontiguousarray(words[:, 0])
        return chosen.view(np.uint8).reshape(n, layout.width)
    return fixed_values(array, layout.value_dtype).view(np.uint8).reshape(n, layout.width)


def value_array(array: pa.Array, layout: Layout) -> np.ndarray:
    """The stored values of a fixed-width column as a 1-D array of ``layout.value_dtype`` (null slots hold
    anything): BOOLEAN as 0/1 bytes, a DECIMAL as its unscaled int64 (precision up to 18) or 16 bytes."""
    if layout.name == "DECIMAL":
        words = decimal_words(array)
        return words[:, 0] if layout.value_dtype != "V16" else np.ascontiguousarray(words).view("V16").ravel()
    return fixed_values(array, layout.value_dtype)


def valid_mask(array: pa.Array) -> np.ndarray | None:
    """Where ``array`` is not null (a bool per slot), from its validity bitmap; None when it has no nulls."""
    if not array.null_count:
        return None
    bitmap = array.buffers()[0]
    if bitmap is None:  # a type without a validity bitmap (all null)
        return np.asarray(array.is_valid())
    bits = np.frombuffer(bitmap, np.uint8)
    return np.unpackbits(bits, count=array.offset + len(array), bitorder="little")[array.offset:].view(bool)


def key_bytes(array: pa.Array, layout: Layout) -> np.ndarray:
    """(rows, width) uint8: the order-preserving bytes of a fixed-width key column."""
    n, width = len(array), layout.key_width
    if layout.name == "BOOLEAN":
        return fixed_values(array, "u1").reshape(n, 1)
    if layout.key_dtype == "V16":  # a 16-byte DECIMAL: the high word sign-flipped, then the low one
        words = decimal_words(array).view("<u8")
        out = np.empty((n, 2), ">u8")
        out[:, 0], out[:, 1] = words[:, 1] ^ TOP, words[:, 0]
        return out.view(np.uint8).reshape(n, 16)
    unsigned = f"<u{width}"
    if layout.name in ("FLOAT", "DOUBLE"):
        floats = fixed_values(array, layout.value_dtype)
        bits = np.where(np.isnan(floats), CANONICAL_NAN[width], floats.view(unsigned))
        flipped = np.where(bits & SIGN[width] != 0, ~bits, bits | SIGN[width])
    else:
        source = decimal_words(array)[:, 0] if layout.name == "DECIMAL" else fixed_values(array, layout.value_dtype)
        flipped = source.view(unsigned) ^ SIGN[width]
    return flipped.astype(layout.key_dtype).view(np.uint8).reshape(n, -1)


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


def fixed_array(values: np.ndarray, layout: Layout, valid: np.ndarray | None) -> pa.Array:
    """An Arrow array of a fixed-width type from its stored values (``valid`` None: no nulls): numbers in
    native order, a DECIMAL as its int64 unscaled values (precision up to 18) or 16 bytes each."""
    validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if layout.name == "BOOLEAN":
        data = np.packbits(values != 0, bitorder="little")
    elif layout.name == "DECIMAL" and layout.value_dtype != "V16":
        data = np.empty((len(values), 2), "<i8")
        data[:, 0] = values
        data[:, 1] = values >> 63  # sign-extended to 128 bits
    elif layout.name == "DECIMAL":
        data = np.ascontiguousarray(values)
    else:
        data = values.astype(values.dtype.newbyteorder("="), copy=False)
    return pa.Array.from_buffers(layout.arrow, len(values), [validity, pa.py_buffer(data)])


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


def from_key(values: np.ndarray, layout: Layout) -> np.ndarray:
    """Order-preserving key values (as loaded with ``layout.key_dtype``) back to what :func:`fixed_array` takes."""
    if layout.key_dtype == "V16":
        raw = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), 16)
        words = np.empty((len(values), 2), "<u8")
        words[:, 1] = np.ascontiguousarray(raw[:, :8]).view(">u8").ravel() ^ TOP
        words[:, 0] = np.ascontiguousarray(raw[:, 8:]).view(">u8").ravel()
        return words
    unsigned = values.astype(values.dtype.newbyteorder("="))
    if layout.name == "BOOLEAN":
        return unsigned
    width = layout.key_width
    native = "<i8" if layout.name == "DECIMAL" else layout.value_dtype
    if layout.name in ("FLOAT", "DOUBLE"):
        return np.where(unsigned & SIGN[width] != 0, unsigned ^ SIGN[width], ~unsigned).view(native)
    return (unsigned ^ SIGN[width]).view(native)
