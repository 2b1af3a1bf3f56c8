"""ARRAY, MAP and STRUCT values <-> the bytes a value stores for them, vectorized (no loop per row or element).

In a value, a nested column is stored like a STRING: a uint32 length, then its *payload*
(docs/row-encoding.md). The payload of a non-null value of each type (its length is known from where it
is stored):

- a fixed-width type: its bytes as in a value (INT: 4 bytes little-endian, …);
- STRING / BYTES: the bytes;
- ``ARRAY<T>``: ``[uint32 n][a sequence of n T]``;
- ``MAP<K,V>``: ``[uint32 n][a sequence of the n keys][a sequence of the n values]``;
- ``STRUCT<f1 T1, …, fm Tm>``: ``[m × int32 size, -1 = null][the payloads of the non-null fields]``.

A *sequence* of n items of type T:

- T fixed-width (w bytes): ``[n × uint8 null flag, 1 = null][n × w bytes, zeros where null]``;
- any other T: ``[n × int32 size, -1 = null][the payloads of the non-null items]``.

Every size and count comes before what it measures, so the position of every element of a batch follows
from a few cumulative sums: encoding joins column pieces with ``binary_join_element_wise`` and decoding
gathers with numpy, one pass per level of nesting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common import codec_arrays as ca
from kvlease.common.codec_types import layout_of
from kvlease.common.errors import InvalidRowError
from kvlease.common.types import DataType

NULL_SIZE = -1
_EMPTY = pa.scalar(b"", pa.binary())


# ---- encoding ------------------------------------------------------------------

def payloads(array: pa.Array, type_: DataType) -> pa.Array:
    """A binary array: the payload of each value of ``array`` (of ``type_``), null where it is null."""
    lay = layout_of(type_)
    if lay.fixed:
        return ca.fixed_binary(np.ascontiguousarray(ca.value_bytes(array, lay)), _validity(array))
    if type_.name in ("STRING", "BYTES"):
        return array.view(pa.binary())
    if type_.name == "STRUCT":
        return _struct_payloads(array, type_)
    offsets = np.asarray(array.offsets, np.int64)
    counts = np.diff(offsets).astype("<u4").view(np.uint8).reshape(-1, 4)
    pieces = [ca.fixed_binary(counts, None)]
    if type_.name == "ARRAY":
        pieces += _sequence(array.values, offsets, type_.element)
    else:
        pieces += _sequence(array.keys, offsets, type_.key) + _sequence(array.items, offsets, type_.value)
    return _with_validity(pc.binary_join_element_wise(*pieces, _EMPTY), array)


def _struct_payloads(array: pa.StructArray, type_: DataType) -> pa.Array:
    n, fields = len(array), array.flatten()
    sizes = np.empty((n, len(fields)), "<i4")
    pieces = []
    for j, (field, (_, field_type)) in enumerate(zip(fields, type_.fields)):
        piece = payloads(field, field_type)
        length = np.diff(ca.value_offsets(piece))
        sizes[:, j] = length if not piece.null_count else np.where(ca.valid_mask(piece), length, NULL_SIZE)
        pieces.append(piece)
    head = ca.fixed_binary(sizes.view(np.uint8).reshape(n, 4 * len(fields)), None)
    joined = pc.binary_join_element_wise(head, *pieces, _EMPTY, null_handling="skip")
    return _with_validity(joined, array)


def _sequence(child: pa.Array, offsets: np.ndarray, type_: DataType) -> list[pa.Array]:
    """Pieces whose element-wise join is, per row, the sequence of ``child[offsets[i]:offsets[i + 1]]``."""
    lay = layout_of(type_)
    valid = ca.valid_mask(child)
    if lay.fixed:
        flags = np.zeros(len(child), np.uint8) if valid is None else (~valid).astype(np.uint8)
        data = ca.value_bytes(child, lay)
        if valid is not None:
            data = np.where(valid[:, None], data, 0).astype(np.uint8)
        return [_ranges(flags, offsets), _ranges(np.ascontiguousarray(data).ravel(), offsets * lay.width)]
    piece = payloads(child, type_)
    valid = ca.valid_mask(piece)
    piece_offsets = ca.value_offsets(piece).astype(np.int64)
    sizes = np.diff(piece_offsets)
    if valid is not None and np.any(sizes[~valid]):  # a null item takes no bytes (its slot may hold some)
        piece = pc.fill_null(piece, _EMPTY)
        piece_offsets = ca.value_offsets(piece).astype(np.int64)
        sizes = np.diff(piece_offsets)
    if valid is not None:
        sizes = np.where(valid, sizes, NULL_SIZE)
    data = ca.data_bytes(piece)
    return [_ranges(sizes.astype("<i4").view(np.uint8), offsets * 4), _ranges(data, piece_offsets[offsets])]


def _ranges(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """A binary array whose element i is ``data[offsets[i]:offsets[i + 1]]`` (zero-copy)."""
    if offsets[-1] >= 1 << 31:
        raise InvalidRowError("nested values of a batch take more than 2 GiB: write fewer rows at once")
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def _validity(array: pa.Array) -> pa.Buffer | None:
    if not array.null_count:
        return None
    if array.offset == 0 and array.buffers()[0] is not None:
        return array.buffers()[0]
    return pa.py_buffer(np.packbits(ca.valid_mask(array), bitorder="little"))


def _with_validity(joined: pa.Array, array: pa.Array) -> pa.Array:
    """``joined`` (no nulls, offset 0) null where ``array`` is."""
    if not array.null_count:
        return joined
    return pa.Array.from_buffers(pa.binary(), len(joined), [_validity(array), *joined.buffers()[1:]])


# ---- decoding ------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """The bytes values are decoded from, and what errors name: ``rows[i]`` is the row (of the whole call)
    item i belongs to."""
    data: np.ndarray
    buffer: pa.Buffer
    column: str
    base: int


def decode(src: Source, type_: DataType, starts: np.ndarray, ends: np.ndarray, valid: np.ndarray,
           rows: np.ndarray) -> pa.Array:
    """The values of ``type_`` whose payloads lie at ``[starts[i], ends[i])`` of ``src.data`` (``valid[i]``
    False: null, its range is empty); InvalidRowError naming the row if they are not payloads of it."""
    lay = layout_of(type_)
    mask = None if valid.all() else valid
    if lay.fixed:
        _check(src, rows, valid & (ends - starts != lay.width), "a value of the wrong size")
        return ca.fixed_array(ca.load(src.data, starts, mask, lay.value_dtype), lay, mask)
    if type_.name in ("STRING", "BYTES"):
        return _binary(src, type_, starts, ends, mask)
    if type_.name == "STRUCT":
        return _struct(src, type_, starts, ends, valid, rows)
    _check(src, rows, valid & (ends - starts < 4), "ends inside a count")
    counts = ca.load(src.data, starts, mask, "<u4").astype(np.int64)  # 0 where null
    offsets = np.concatenate([[0], np.cumsum(counts)])
    first = np.where(valid, starts + 4, starts)  # a null value's empty range holds an empty sequence
    if type_.name == "ARRAY":
        children, end = _decode_sequence(src, type_.element, first, counts, offsets, ends, rows)
    else:
        keys, middle = _decode_sequence(src, type_.key, first, counts, offsets, ends, rows)
        if keys.null_count:
            _check(src, np.repeat(rows, counts), ~np.asarray(keys.is_valid()), "a null map key")
        items, end = _decode_sequence(src, type_.value, middle, counts, offsets, ends, rows)
        children = pa.StructArray.from_arrays([keys, items], fields=[lay.arrow.key_field, lay.arrow.item_field])
    _check(src, rows, valid & (end != ends), "has trailing bytes")
    validity = None if mask is None else pa.py_buffer(np.packbits(mask, bitorder="little"))
    return pa.Array.from_buffers(lay.arrow, len(starts), [validity, pa.py_buffer(offsets.astype(np.int32))],
                                 children=[children])


def _decode_sequence(src: Source, type_: DataType, starts: np.ndarray, counts: np.ndarray, offsets: np.ndarray,
                     bounds: np.ndarray, rows: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The items of the sequences of ``counts[i]`` items at ``starts[i]`` (each within ``bounds[i]``), and where
    each sequence ends."""
    lay = layout_of(type_)
    header = 1 + lay.width if lay.fixed else 4
    _check(src, rows, starts + counts * header > bounds, "ends inside a sequence")
    item_rows = np.repeat(rows, counts)
    index = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)  # within its row
    if lay.fixed:
        flags = src.data[np.repeat(starts, counts) + index]
        _check(src, item_rows, flags > 1, "a bad null flag")
        valid = flags == 0
        positions = np.repeat(starts + counts, counts) + index * lay.width
        mask = None if valid.all() else valid
        return (ca.fixed_array(ca.load(src.data, positions, mask, lay.value_dtype), lay, mask),
                starts + counts * header)
    sizes = ca.load(src.data, np.repeat(starts, counts) + index * 4, None, "<i4").astype(np.int64)
    _check(src, item_rows, sizes < NULL_SIZE, "a bad size")
    lengths = np.maximum(sizes, 0)
    before = np.concatenate([[0], np.cumsum(lengths)])  # bytes of the items before each item
    item_starts = np.repeat(starts + counts * 4 - before[offsets[:-1]], counts) + before[:-1]
    ends = starts + counts * 4 + before[offsets[1:]] - before[offsets[:-1]]
    _check(src, rows, ends > bounds, "ends inside a sequence")
    return decode(src, type_, item_starts, item_starts + lengths, sizes >= 0, item_rows), ends


def _struct(src: Source, type_: DataType, starts: np.ndarray, ends: np.ndarray, valid: np.ndarray,
            rows: np.ndarray) -> pa.Array:
    lay, m = layout_of(type_), len(type_.fields)
    _check(src, rows, valid & (ends - starts < 4 * m), "ends inside its field sizes")
    sizes = np.stack([ca.load(src.data, starts + 4 * j, valid, "<i4") for j in range(m)], axis=1).astype(np.int64)
    sizes[~valid] = NULL_SIZE
    _check(src, rows, sizes.min(axis=1, initial=0) < NULL_SIZE, "a bad size")
    lengths = np.maximum(sizes, 0)
    field_starts = starts[:, None] + 4 * m + np.cumsum(lengths, axis=1) - lengths
    _check(src, rows, valid & (starts + 4 * m + lengths.sum(axis=1) != ends), "a size that does not add up")
    children = [decode(src, field_type, field_starts[:, j], field_starts[:, j] + lengths[:, j], sizes[:, j] >= 0,
                       rows) for j, (_, field_type) in enumerate(type_.fields)]
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(lay.arrow, len(starts), [validity], children=children)


def _binary(src: Source, type_: DataType, starts: np.ndarray, ends: np.ndarray, mask: np.ndarray | None) -> pa.Array:
    """STRING / BYTES items at ``[starts[i], ends[i])``: the ranges are in order and do not overlap, so one
    binary array over the data holds them at its even positions, and one ``take`` gathers them."""
    n = len(starts)
    if not n:
        return pa.array([], layout_of(type_).arrow)
    large = len(src.data) >= 1 << 31
    flat = np.empty(2 * n, np.int64)
    flat[0::2], flat[1::2] = starts, ends
    if mask is not None:  # a null item: an empty range where the valid one before it ends
        before = np.maximum.accumulate(np.where(mask, ends, 0))
        flat[0::2], flat[1::2] = np.where(mask, starts, before), np.where(mask, ends, before)
    spans = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * n - 1,
                                  [None, pa.py_buffer(flat.astype(np.int64 if large else np.int32)), src.buffer])
    taken = pc.take(spans, pa.array(np.arange(0, 2 * n, 2), mask=None if mask is None else ~mask))
    if large:
        taken = taken.cast(pa.binary())
    if type_.name == "BYTES":
        return taken
    try:
        return taken.cast(pa.string())
    except pa.ArrowInvalid as e:
        raise InvalidRowError(f"column {src.column!r}: stored STRING is not valid UTF-8 ({e})") from None


def _check(src: Source, rows: np.ndarray, bad: np.ndarray, why: str) -> None:
    if np.any(bad):
        ca.corrupt("value", src.base + int(rows[ca.first(bad)]), f"column {src.column!r}: {why}")
