"""Stored values (full rows) <-> Arrow batches of one column list, vectorized.

A value (docs/row-encoding.md) in format 2:

    [0x02][schema id: uint32 LE][null bitmap][fixed part][uint32 LE length of each variable-width column]
    [the bytes of each variable-width column]

The null bitmap has ``ceil(columns / 8)`` bytes (bit ``i % 8`` of byte ``i // 8`` set: column ``i`` is
null). The fixed part holds every fixed-width column in table order, each its width, whether null or not
(zeros when null; a DECIMAL is its unscaled value: 8 bytes up to precision 18, else 16). Then come the
lengths of the STRING, BYTES and nested columns (0 when null), in table order, then their bytes (for a
nested type, the payload of :mod:`kvlease.common.codec_nested`). So every fixed-width column and every
length lies at the same offset in every value of a schema: decoding gathers one block per row and slices
it, encoding writes one (rows, width) block and joins the variable-width columns to it.

Format 1 (``[0x01][null bitmap][columns]``, written before schema ids) still decodes
(:mod:`kvlease.common.codec_values_v1`); its rows count as schema id 1.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common import codec_arrays as ca
from kvlease.common import codec_nested as nested
from kvlease.common.codec_types import layout
from kvlease.common.codec_values_v1 import decode_v1, var_arrays
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
        #: The header and the fixed part of a value (the variable-width columns' lengths included) as a numpy
        #: structured type: field ``c{j}`` is column j (a variable-width one's: its length).
        self._var = [j for j, lay in enumerate(self._layouts) if not lay.fixed]
        names, formats, offsets = ["version", "schema_id", "bitmap"], ["u1", "<u4", ("u1", (self._bitmap,))], [0, 1, 5]
        offset = HEADER[FORMAT_VERSION] + self._bitmap
        for j in [j for j, lay in enumerate(self._layouts) if lay.fixed] + self._var:
            dtype = self._layouts[j].value_dtype or "<u4"
            names.append(f"c{j}")
            formats.append(dtype)
            offsets.append(offset)
            offset += np.dtype(dtype).itemsize
        self._head = offset
        self._dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": offset})

    # ---- encoding ------------------------------------------------------------

    def encode(self, batch: pa.RecordBatch) -> pa.Array:
        """The values of a checked batch of these columns, as a binary array."""
        n = batch.num_rows
        head = np.zeros(n, self._dtype)  # one typed copy per column into it (a strided copy of bytes is slower)
        head["version"] = FORMAT_VERSION
        head["schema_id"] = self.schema_id
        nulls, pieces = None, []
        for j, (lay, array) in enumerate(zip(self._layouts, batch.columns)):
            valid = ca.valid_mask(array)
            if lay.fixed:
                values = ca.value_array(array, lay)
            else:
                raw = array.view(pa.binary()) if lay.name in ("STRING", "BYTES") else nested.payloads(array, lay.type)
                values = np.diff(ca.value_offsets(raw)).astype("<u4")
                pieces.append(raw)
            if valid is not None:  # a null takes zeros (its length: 0)
                nulls = np.zeros((n, len(self.columns)), bool) if nulls is None else nulls
                nulls[:, j] = ~valid
                values = _zero_nulls(values, valid)
            head[f"c{j}"] = values
        if nulls is not None:
            head["bitmap"] = np.packbits(nulls, axis=1, bitorder="little")
        block = ca.fixed_binary(head.view(np.uint8).reshape(n, self._head), None)
        if not pieces:
            return block
        return pc.binary_join_element_wise(block, *pieces, ca.EMPTY_JOIN, null_handling="skip")

    # ---- decoding ------------------------------------------------------------

    def decode(self, array: pa.Array, base: int,
               others: Callable[[pa.Array, np.ndarray, int], pa.RecordBatch] | None = None) -> pa.RecordBatch:
        """Rows from a binary array of values; ``base`` is the index of its first row (for errors). Values of
        other schema ids than this codec's go, all of them, to ``others(array, schema ids, base)``
        (common/codec_schemas.py); without it they are an InvalidRowError."""
        where = ca.layout(array)  # once: the steps below take it
        ids = _schema_ids(*where, base)
        other = ids != self.schema_id
        if other.any():
            if others is not None:
                return others(array, ids, base)
            i = ca.first(other)
            raise InvalidRowError(f"row {base + i}: the value was written with schema id {ids[i]}, and this reader "
                                  f"reads schema id {self.schema_id} only")
        return self.decode_same_schema(array, base, where)

    def decode_same_schema(self, array: pa.Array, base: int,
                           where: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> pa.RecordBatch:
        """Rows from values known to hold these columns (whatever schema id they carry; format 1 or 2);
        ``where``: the array's :func:`~kvlease.common.codec_arrays.layout`, if the caller has it."""
        where = where if where is not None else ca.layout(array)
        starts, _ends, data = where
        version = data[starts] if len(array) else np.zeros(0, np.uint8)
        old = version == 1
        if not old.any():
            return self._decode_v2(array, base, where)
        if old.all():
            return decode_v1(self.columns, self._layouts, self.schema, array, base)
        rows = [np.flatnonzero(old), np.flatnonzero(~old)]  # both formats: each decoded, then put back in order
        parts = [decode_v1(self.columns, self._layouts, self.schema, array.take(pa.array(rows[0])), base),
                 self._decode_v2(array.take(pa.array(rows[1])), base)]
        order = np.empty(len(array), np.int64)
        order[np.concatenate(rows)] = np.arange(len(array))
        return pa.concat_batches(parts).take(pa.array(order))

    def _decode_v2(self, array: pa.Array, base: int,
                   where: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> pa.RecordBatch:
        n = len(array)
        starts, ends, data = where if where is not None else ca.layout(array)
        short = ends - starts < self._head
        if short.any():
            ca.corrupt("value", base + ca.first(short), "shorter than its header")
        version = data[starts]
        if np.any(version != FORMAT_VERSION):
            i = ca.first(version != FORMAT_VERSION)
            ca.corrupt("value", base + i, f"format version {version[i]}, expected 1 or {FORMAT_VERSION}")
        head = ca.load(data, starts, None, f"V{self._head}").view(self._dtype)
        nulls = np.unpackbits(head["bitmap"].reshape(n, self._bitmap), axis=1, count=len(self.columns),
                              bitorder="little").view(bool)
        valids = [None if not nulls[:, j].any() else ~nulls[:, j] for j in range(len(self.columns))]
        loaded, pos = [], starts + self._head
        for j, lay in enumerate(self._layouts):
            values = np.ascontiguousarray(head[f"c{j}"])
            if lay.fixed:
                loaded.append(values)
            else:  # the bytes of the variable-width columns follow each other in column order
                end = pos + values
                loaded.append((pos, end))
                pos = end
        if np.any(pos != ends):
            bad = pos != ends
            ca.corrupt("value", base + ca.first(bad), "has trailing bytes" if pos[ca.first(bad)] < ends[ca.first(bad)]
                       else f"ends inside column {self.columns[self._var[-1]].name!r}")
        return pa.RecordBatch.from_arrays(var_arrays(self.columns, self._layouts, array, starts, ends, loaded, valids,
                                                     base), schema=self.schema)


def _zero_nulls(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """``values`` with zeros where not ``valid`` (a null's slot holds whatever its array held)."""
    if values.dtype.kind == "V":  # a 16-byte DECIMAL
        words = values.view("<i8").reshape(-1, 2)
        return np.where(valid[:, None], words, 0).astype("<i8").view("V16").ravel()
    return np.where(valid, values, 0).astype(values.dtype, copy=False)
