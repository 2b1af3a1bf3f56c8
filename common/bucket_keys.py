"""A table's bucket key: the leading primary-key columns whose values pick a row's bucket.

``table create --bucket-key a[,b]`` names a proper prefix of the primary key, in primary-key order
(:func:`check_bucket_key`; on a partitioned table it holds every partition-key column, so the bucket-key
values name one partition and one bucket). Rows with the same bucket-key values share a bucket:
``crc32(encoded bucket-key columns) % buckets``. A table without one hashes its whole encoded key, as it
always has (:mod:`kvlease.common.bucketing`): the same rule with the whole primary key as bucket key.

The key encoding (:mod:`kvlease.common.codec_keys`) makes the encoded bucket-key columns a byte prefix of
every encoded key, and prefix-free: a fixed-width column has one width, a STRING or BYTES column escapes
each 0x00 as 0x00 0xFF and ends with 0x00 0x01, a pair that occurs nowhere inside it. So the keys that
start with a row's encoded bucket-key bytes ``P`` are exactly its rows with those bucket-key values, and
they form the RocksDB range ``P <= key < prefix_upper(P)`` (:func:`prefix_upper`): a prefix lookup is one
range scan (docs/row-encoding.md, "Buckets and prefix ranges").
"""

from __future__ import annotations

from typing import Sequence

from kvlease.common.errors import InvalidTableError, show

#: Ends each encoded STRING or BYTES key column (codec_arrays.TERMINATOR).
_TERMINATOR = b"\x00\x01"


def check_bucket_key(primary_key: Sequence[str], partition_key: Sequence[str], bucket_key: Sequence[str]) -> None:
    """InvalidTableError naming the problem unless ``bucket_key`` is empty (the whole primary key) or a proper
    prefix of ``primary_key`` in its order that holds every column of ``partition_key``."""
    if isinstance(bucket_key, str):
        raise InvalidTableError(f"bucket key {show(bucket_key)} must be a list of column names, not a string")
    if not bucket_key:
        return
    pk = ", ".join(primary_key)
    for name in bucket_key:
        if name not in primary_key:
            raise InvalidTableError(f"bucket key column {show(name)} is not a column of the primary key ({pk})")
    if len(set(bucket_key)) != len(bucket_key):
        raise InvalidTableError(f"bucket key ({', '.join(bucket_key)}) names a column twice")
    if tuple(bucket_key) != tuple(primary_key[:len(bucket_key)]):
        raise InvalidTableError(f"bucket key ({', '.join(bucket_key)}) is not a prefix of the primary key ({pk}): "
                                f"it must be its first columns, in its order")
    if len(bucket_key) == len(primary_key):
        raise InvalidTableError(f"bucket key ({', '.join(bucket_key)}) is the whole primary key, which is the "
                                f"default: name its first column(s) only, or leave --bucket-key out")
    missing = [name for name in partition_key if name not in bucket_key]
    if missing:
        raise InvalidTableError(f"bucket key ({', '.join(bucket_key)}) leaves out partition column "
                                f"{show(missing[0])}: on a partitioned table the bucket key holds every partition "
                                f"column (put them first in the primary key)")


class KeyPrefix:
    """Cuts the leading ``count`` columns' bytes out of encoded keys. ``widths``: per primary-key column, its
    key width if fixed-width, else None (a STRING or BYTES column, ended by 0x00 0x01)."""

    def __init__(self, widths: Sequence[int | None], count: int) -> None:
        self.widths = tuple(widths[:count])
        #: The prefix length when every prefix column is fixed-width, else None.
        self.width = sum(self.widths) if all(w is not None for w in self.widths) else None  # type: ignore[misc]

    def length(self, key: bytes) -> int:
        """The length of ``key``'s prefix; ValueError if the key ends before it (not a key of this table)."""
        pos = 0
        for width in self.widths:
            pos = pos + width if width is not None else key.index(_TERMINATOR, pos) + 2
        if pos > len(key):
            raise ValueError(f"key of {len(key)} bytes is shorter than its bucket-key prefix")
        return pos

    def cut(self, keys: Sequence[bytes]) -> list[bytes]:
        """Each key's prefix bytes, in order."""
        if self.width is not None:
            width = self.width
            return [key[:width] for key in keys]
        length = self.length
        return [key[:length(key)] for key in keys]


def prefix_upper(prefix: bytes) -> bytes | None:
    """The least byte string above every string that starts with ``prefix`` (the exclusive end of its RocksDB
    range): ``prefix`` without its trailing 0xFF bytes, its last byte + 1; None if it is all 0xFF (no end)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
