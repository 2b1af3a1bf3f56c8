"""Primary keys <-> order-preserving bytes, vectorized (the layouts: docs/row-encoding.md).

The key is the primary-key columns concatenated in primary-key order; comparing two keys as bytes gives the
order of their key tuples. Fixed-width columns are big-endian with the sign flipped (floats: Java's
``compare`` order, one canonical NaN); STRING and BYTES have each 0x00 escaped as 0x00 0xFF, then the
terminator 0x00 0x01.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common import codec_arrays as ca
from kvlease.common.codec_types import layout
from kvlease.common.columns import Column


class KeyCodec:
    """The keys of one table: ``columns`` are its primary-key columns, in primary-key order."""

    def __init__(self, columns: tuple[Column, ...], schema: pa.Schema) -> None:
        self.columns, self.schema = columns, schema
        self.layouts = [layout(c.type) for c in columns]
        #: The length of every encoded key when all primary-key columns are fixed-width, else None.
        self.width = sum(lay.key_width for lay in self.layouts) if all(l.fixed for l in self.layouts) else None

    def encode_list(self, keys: pa.RecordBatch) -> list[bytes]:
        fixed, pieces = self._pieces(keys)
        if fixed is not None:  # only fixed-width columns: every key has the same length
            return fixed.view(f"V{fixed.shape[1]}").ravel().tolist()
        return ca.to_list(pc.binary_join_element_wise(*pieces, ca.EMPTY_JOIN))

    def encode_array(self, keys: pa.RecordBatch) -> pa.Array:
        fixed, pieces = self._pieces(keys)
        if fixed is not None:
            return ca.fixed_binary(fixed, None)
        return pc.binary_join_element_wise(*pieces, ca.EMPTY_JOIN)

    def _pieces(self, keys: pa.RecordBatch) -> tuple[np.ndarray | None, list]:
        """``(rows, [])``: a (rows, width) uint8 array when every key column is fixed-width;
        else ``(None, pieces)`` whose element-wise join is the keys."""
        fixed, pieces = [], []  # runs of fixed-width columns become one (rows, width) array
        for lay, array in zip(self.layouts, keys.columns):
            if lay.fixed:
                fixed.append(ca.key_bytes(array, lay))
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

    def decode(self, array: pa.Array, base: int) -> pa.RecordBatch:
        """Key columns from a binary array of keys; ``base`` is the index of its first row (for errors)."""
        starts, ends, data = ca.layout(array)
        # loaded: per column, its values (fixed width) or its index in var_bounds (STRING/BYTES)
        pos, loaded, var_bounds, terminators = starts, [], [], None
        for column, lay in zip(self.columns, self.layouts):
            if lay.fixed:
                end = pos + lay.key_width
                ca.check_within(end, ends, base, "key", column.name)
                loaded.append(ca.from_key(ca.load(data, pos, None, lay.key_dtype), lay))
            else:
                if terminators is None:  # every 0x00 0x01 (an escaped 0x00 is followed by 0xFF), then a sentinel
                    terminators = np.append(np.flatnonzero((data[:-1] == 0) & (data[1:] == 1)), len(data))
                stop = terminators[np.searchsorted(terminators, pos)]  # the first one at or after pos
                end = stop + 2
                ca.check_within(end, ends, base, "key", column.name)
                loaded.append(len(var_bounds))
                var_bounds.append((pos, stop))
            pos = end
        if np.any(pos != ends):
            ca.corrupt("key", base + ca.first(pos != ends), "has trailing bytes")
        pieces = ca.take_pieces(array, starts, ends, var_bounds) if var_bounds else None
        arrays = [ca.fixed_array(value, lay, None) if lay.fixed
                  else ca.var_array(pieces, len(var_bounds), value, column, None, escaped=True)
                  for column, lay, value in zip(self.columns, self.layouts, loaded)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
