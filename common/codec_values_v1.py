"""Values of format 1, written before schema ids: still read (docs/row-encoding.md, "Values: full rows").

``[0x01][null bitmap][columns]``: each non-null column in table order (a null one takes no bytes), a
fixed-width type as its little-endian bytes, a variable-width one as a uint32 little-endian length then
its bytes. Nothing writes this format any more.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kvlease.common import codec_arrays as ca
from kvlease.common import codec_nested as nested
from kvlease.common.codec_types import Layout
from kvlease.common.columns import Column

VERSION = 1


def decode_v1(columns: tuple[Column, ...], layouts: list[Layout], schema: pa.Schema, array: pa.Array,
              base: int) -> pa.RecordBatch:
    """Rows from a binary array of format-1 values of ``columns``; ``base``: the index of its first row."""
    n, nbitmap = len(array), (len(columns) + 7) // 8
    starts, ends, data = ca.layout(array)
    short = ends - starts < 1 + nbitmap
    if short.any():
        ca.corrupt("value", base + ca.first(short), "shorter than its header")
    bitmap = np.stack([data[starts + 1 + b] for b in range(nbitmap)], axis=1)
    nulls = np.unpackbits(bitmap, axis=1, count=len(columns), bitorder="little").view(bool)
    valids = [None if not nulls[:, j].any() else ~nulls[:, j] for j in range(len(columns))]
    pos, loaded = starts + 1 + nbitmap, []  # per column: its values, or (begin, end) of its bytes
    for column, lay, valid in zip(columns, layouts, valids):
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
    arrays = var_arrays(columns, layouts, array, starts, ends, loaded, valids, base)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def var_arrays(columns, layouts, array: pa.Array, starts, ends, loaded: list, valids: list,
               base: int) -> list[pa.Array]:
    """Each column's Arrow array: ``loaded[j]`` holds its values (fixed-width) or (begin, end) of its bytes in
    each row (STRING, BYTES and nested types), ``valids[j]`` its validity (None: no nulls)."""
    strings = [(j, bounds) for j, (lay, bounds) in enumerate(zip(layouts, loaded)) if lay.name in ("STRING", "BYTES")]
    pieces = ca.take_pieces(array, starts, ends, [b for _, b in strings]) if strings else None
    string_index = {j: k for k, (j, _) in enumerate(strings)}
    arrays = []
    for j, (column, lay, value, valid) in enumerate(zip(columns, layouts, loaded, valids)):
        if lay.fixed:
            arrays.append(ca.fixed_array(value, lay, valid))
        elif j in string_index:
            arrays.append(ca.var_array(pieces, len(strings), string_index[j], column, valid, escaped=False))
        else:
            src = nested.Source(ca.data_bytes(array), array.buffers()[2], column.name, base)
            mask = np.ones(len(array), bool) if valid is None else valid
            arrays.append(nested.decode(src, lay.type, value[0], value[1], mask, np.arange(len(array))))
    return arrays
