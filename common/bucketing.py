"""Which bucket a row belongs to: the CRC-32 of its encoded primary key, modulo the bucket count.

Stable forever: changing it would move rows between buckets. Keys are encoded
by :class:`kvlease.common.codec.RowCodec` (``encode_keys``); :mod:`kvlease.common.codec`
re-exports these functions.
"""

from __future__ import annotations

import zlib
from typing import Iterable

import numpy as np


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
    return bucket_array(keys, num_buckets).tolist()


def bucket_array(keys: Iterable[bytes], num_buckets: int) -> np.ndarray:
    """:func:`bucket_of` of every key as a numpy ``uint64`` array."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be at least 1, got {num_buckets}")
    crcs = np.fromiter(map(zlib.crc32, keys), dtype=np.uint64)
    return crcs % np.uint64(num_buckets)
