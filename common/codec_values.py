"""Stored values (full rows) <-> Arrow batches of one column list, vectorized.

A value (docs/row-encoding.md) is ``[0x02][schema id: uint32 LE][null bitmap][columns]``: format version 2.
Version 1 (``[0x01][null bitmap][columns]``, written before schema ids) still decodes; its rows count as
schema id 1. The null bitmap has ``ceil(columns / 8)`` bytes (bit ``i % 8`` of byte ``i // 8`` set: column
``i`` is null); each non-null column follows in column order: a fixed-width type as its bytes (little-endian;
a DECIMAL as its unscaled value: 8 bytes up to precision 18, else 16), STRING, BYTES and the nested types as
a uint32 little-endian length then the bytes (for a nested type, the payload of
:mod:`kvlease.common.codec_nested`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common import codec_arrays as ca
from kvlease.common import codec_nested as nested
from kvlease.common.codec_types import layout
from kvlease.common.columns import Column
from kvlease.common.errors import InvalidRowError

FORMAT_VERSION = 2
#: The header (bytes before the null bitmap) of each format version.
HEADER = {1: 1, 2: 5}
#: The schema id of a version-1 value (written before tables had schema ids).
V1_SCHEMA_ID = 1


def value_schema_ids(values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The schema id each stored value was written with (uint32; 1 for a version-1 value); InvalidRowError
    naming the first one that is not a value."""
    array = ca.binary_array(values, "value")
    starts, ends, data = ca.layout(array)
    return _schema_ids(starts, ends, data, 0)


def _schema_ids(starts: np.ndarray, ends: np.ndarray, data: np.ndarray, base: int) -> np.ndarray:
    if not len(starts):
        return np.zeros(0, np.uint32)
    empty = ends <= starts
    if empty.any():
        ca.corrupt("value", base + ca.first(empty), "shorter than its header")
    version = data[starts]
    known = (version == 1) | (version == 2)
    if not known.all():
        i = ca.first(~known)
        ca.corrupt("value", base + i, f"format version {version[i]}, expected 1 or {FORMAT_VERSION}")
    v2 = version == 2
    if np.any(v2 & (ends - starts < HEADER[2])):
        ca.corrupt("value", base + ca.first(v2 & (ends - starts < HEADER[2])), "shorter than its header")
    ids = np.full(len(starts), V1_SCHEMA_ID, np.uint32)
    ids[v2] = ca.load(data, starts[v2] + 1, None, "<u4")
    return ids


class ValueCodec:
    """The values of rows of one column list, written with one schema id."""

    def __init__(self, columns: Sequence[Column], schema: pa.Schema, schema_id: int) -> None:
        self.columns, self.schema, self.schema_id = tuple(columns), schema, schema_id
        self._layouts = [layout(c.type) for c in self.columns]
        self._bitmap = (len(self.columns) + 7) // 8

    # ---- encoding ------------------------------------------------------------

    def encode(self, batch: pa.RecordBatch) -> pa.Array:
        """The values of a checked batch of these columns, as a binary array."""
        n, columns = batch.num_rows, self.columns
        valids = [np.asarray(a.is_valid()) if a.null_count else None for a in batch.columns]
        header = np.zeros((n, HEADER[FORMAT_VERSION] + self._bitmap), np.uint8)
        header[:, 0] = FORMAT_VERSION
        header[:, 1:5] = np.frombuffer(np.uint32(self.schema_id).astype("<u4").tobytes(), np.uint8)
        if any(v is not None for v in valids):
            nulls = np.zeros((n, len(columns)), bool)
            for j, valid in enumerate(valids):
                if valid is not None:
                    nulls[:, j] = ~valid
            header[:, 5:] = np.packbits(nulls, axis=1, bitorder="little")
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

        for lay, array, valid in zip(self._layouts, batch.columns, valids):
            validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
            raw = None
            if lay.fixed:
                fixed = ca.value_bytes(array, lay)
            else:  # a uint32 length, then the bytes (a null slot's length is never stored: its piece is null)
                raw = array.view(pa.binary()) if lay.name in ("STRING", "BYTES") else nested.payloads(array, lay.type)
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

    # ---- decoding ------------------------------------------------------------

    def decode(self, array: pa.Array, base: int) -> pa.RecordBatch:
        """Rows from a binary array of values written with this codec's schema id; ``base`` is the index of its
        first row (for errors). A value of another schema id is an InvalidRowError (for now)."""
        starts, ends, data = ca.layout(array)
        ids = _schema_ids(starts, ends, data, base)
        other = ids != self.schema_id
        if other.any():
            i = ca.first(other)
            raise InvalidRowError(f"row {base + i}: the value was written with schema id {ids[i]}, and this reader "
                                  f"reads schema id {self.schema_id} only (decoding older schemas comes later)")
        return self.decode_same_schema(array, base)

    def decode_same_schema(self, array: pa.Array, base: int) -> pa.RecordBatch:
        """Rows from values known to hold these columns (whatever schema id they carry; version 1 or 2)."""
        n, columns = len(array), self.columns
        starts, ends, data = ca.layout(array)
        version = data[starts] if n else np.zeros(0, np.uint8)
        head = np.where(version == 1, HEADER[1], HEADER[2]).astype(np.int64)
        short = ends - starts < head + self._bitmap
        if short.any():
            ca.corrupt("value", base + ca.first(short), "shorter than its header")
        bitmap = np.stack([data[starts + head + b] for b in range(self._bitmap)], axis=1)
        nulls = np.unpackbits(bitmap, axis=1, count=len(columns), bitorder="little").view(bool)
        valids = [None if not nulls[:, j].any() else ~nulls[:, j] for j in range(len(columns))]
        pos = starts + head + self._bitmap
        # loaded: per column, its values (fixed width) or (begin, end) of its bytes in each row
        loaded = []
        for column, lay, valid in zip(columns, self._layouts, valids):
            dtype = np.dtype(lay.value_dtype or "<u4")  # var-width: the length
            end = pos + (dtype.itemsize if valid is None else dtype.itemsize * valid)
            ca.check_within(end, ends, base, "value", column.name)
            value = ca.load(data, pos, valid, dtype)
            if lay.fixed:
                loaded.append(value)
            else:
                begin, end = end, end + value
                ca.check_within(end, ends, base, "value", column.name)
                loaded.append((begin, end))
            pos = end
        if np.any(pos != ends):
            ca.corrupt("value", base + ca.first(pos != ends), "has trailing bytes")
        return pa.RecordBatch.from_arrays(self._arrays(array, starts, ends, loaded, valids, base), schema=self.schema)

    def _arrays(self, array: pa.Array, starts, ends, loaded: list, valids: list, base: int) -> list[pa.Array]:
        strings = [(j, bounds) for j, (lay, bounds) in enumerate(zip(self._layouts, loaded))
                   if lay.name in ("STRING", "BYTES")]
        pieces = ca.take_pieces(array, starts, ends, [b for _, b in strings]) if strings else None
        string_index = {j: k for k, (j, _) in enumerate(strings)}
        arrays = []
        for j, (column, lay, value, valid) in enumerate(zip(self.columns, self._layouts, loaded, valids)):
            if lay.fixed:
                arrays.append(ca.fixed_array(value, lay, valid))
            elif j in string_index:
                arrays.append(ca.var_array(pieces, len(strings), string_index[j], column, valid, escaped=False))
            else:
                src = nested.Source(ca.data_bytes(array), array.buffers()[2], column.name, base)
                mask = np.ones(len(array), bool) if valid is None else valid
                arrays.append(nested.decode(src, lay.type, value[0], value[1], mask, np.arange(len(array))))
        return arrays
