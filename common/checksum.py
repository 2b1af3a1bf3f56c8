"""CRC-32 as zlib computes it (the IEEE 802.3 polynomial), the changelog's entry checksum.

:func:`crc32` is ISA-L's (the ``isal`` package: carry-less multiply
instructions, ~20x zlib's speed on a 1 MiB entry) where it is installed, else
:func:`zlib.crc32`. Both give the same value for the same bytes and start
value, so entries written with either read back with either; a test holds
them equal. Bucket hashing keeps ``zlib.crc32`` (keys are a few bytes, where a
call's overhead, not the CRC, is the cost).
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # no wheel for this platform: zlib's is as correct, only slower
    from zlib import crc32

__all__ = ["crc32", "file_crc32"]


def file_crc32(path: str, chunk_bytes: int = 1 << 20) -> int:
    """:func:`crc32` of a whole file, read in ``chunk_bytes`` steps. Raises OSError."""
    value = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            value = crc32(chunk, value)
    return value
