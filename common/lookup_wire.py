"""Packed byte strings on the Lookup wire: the encoded keys a client sends, the stored values a leader answers.

A Lookup request may carry its keys encoded (docs/row-encoding.md) instead of as an Arrow IPC stream of key
columns, and its answer then carries the found rows' stored values instead of decoded rows
(``LookupRequest.key_data`` / ``key_offsets``, ``LookupResponse.values`` / ``value_offsets`` / ``found_mask``
in tablet.proto). Either list of byte strings travels as two ``bytes`` fields: the strings one after another,
and their ``n + 1`` offsets (little-endian int32, the first 0, the last the data's length): an Arrow binary
array's two buffers, so packing and unpacking copy no string one by one in Python. A few strings (at most
:data:`FEW`: a single-key lookup) are packed and unpacked with ``struct`` instead (:func:`unpack_list`,
:func:`pack_list`): the same bytes, without numpy's and Arrow's fixed costs.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np
import pyarrow as pa

from kvlease.common import errors

_OFFSET = np.dtype("<i4")
#: At most this many strings go through :func:`unpack_list` / :func:`pack_list` without numpy or Arrow.
FEW = 8


def pack(array: pa.Array) -> tuple[bytes, bytes]:
    """``(data, offsets)`` of a binary array without nulls (any slice of one)."""
    if array.type != pa.binary():
        array = array.cast(pa.binary())
    n = len(array)
    if n == 0:
        return b"", np.zeros(1, _OFFSET).tobytes()
    _validity, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, _OFFSET, n + 1, array.offset * _OFFSET.itemsize)
    start, end = int(offsets[0]), int(offsets[-1])
    data = data_buffer[start:end].to_pybytes() if data_buffer is not None else b""
    return data, (offsets - start).astype(_OFFSET, copy=False).tobytes()


def unpack(data: bytes, offsets: bytes, what: str) -> pa.Array:
    """The binary array :func:`pack` made (not copied); InvalidRequestError naming ``what`` if the offsets
    do not describe ``data``."""
    if len(offsets) % _OFFSET.itemsize or len(offsets) < _OFFSET.itemsize:
        raise errors.InvalidRequestError(f"{what}: {len(offsets)} bytes of offsets is not a whole number (at "
                                         f"least one) of little-endian int32")
    at = np.frombuffer(offsets, _OFFSET)
    if at[0] != 0 or at[-1] != len(data) or (len(at) > 1 and bool((np.diff(at) < 0).any())):
        raise errors.InvalidRequestError(f"{what}: its offsets do not cut its {len(data)} bytes into strings "
                                         f"(they must start at 0, never decrease and end at {len(data)})")
    return pa.Array.from_buffers(pa.binary(), len(at) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def pack_mask(mask: np.ndarray | Sequence[bool]) -> bytes:
    """One byte per item of a numpy bool mask or a list of bools (1: true)."""
    if isinstance(mask, list):
        return bytes(map(bool, mask))
    return np.ascontiguousarray(mask, dtype=bool).view(np.uint8).tobytes()


def unpack_mask(data: bytes) -> np.ndarray:
    """The numpy bool mask :func:`pack_mask` made."""
    return np.frombuffer(data, np.uint8).astype(bool)


def unpack_list(data: bytes, offsets: bytes, what: str) -> list[bytes]:
    """The strings of :func:`unpack` as a list of bytes (the same checks, the same error)."""
    count = len(offsets) // _OFFSET.itemsize - 1
    if len(offsets) % _OFFSET.itemsize or not 0 <= count <= FEW:
        return unpack(data, offsets, what).to_pylist()
    at = struct.unpack(f"<{count + 1}i", offsets)
    if at[0] != 0 or at[-1] != len(data) or any(end < start for start, end in zip(at, at[1:])):
        return unpack(data, offsets, what).to_pylist()  # raises its InvalidRequestError
    return [data[start:end] for start, end in zip(at, at[1:])]


def pack_list(values: Sequence[bytes] | pa.Array) -> tuple[bytes, bytes]:
    """:func:`pack` of a list of bytes (or of a binary array: :func:`pack` itself)."""
    if isinstance(values, pa.Array):
        return pack(values)
    offsets = [0]
    for value in values:
        offsets.append(offsets[-1] + len(value))
    return b"".join(values), struct.pack(f"<{len(offsets)}i", *offsets)
