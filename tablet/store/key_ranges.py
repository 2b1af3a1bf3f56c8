"""Which keys a bucket's RocksDB may hold: a few key ranges that cover every key stored.

A write reads the before-image of every key it touches (``tablet/bucket/store.py``);
for a key that was never stored that is a RocksDB point lookup that finds
nothing, most of the cost of a pure-insert write. :class:`KeyRanges` knows a
handful of ``[low, high]`` ranges (bytes order, like RocksDB's comparator) that
together cover every key ever stored since the store was opened, so a key
outside all of them surely does not exist and needs no lookup. Loads whose
keys grow (ids, timestamps) or arrive in key-range batches, also out of order,
then skip nearly every lookup; random keys soon fall inside the ranges and are
looked up as before.

The ranges only ever widen (a deleted key stays covered): covering more than
the stored keys costs lookups, never correctness. At most :data:`MAX_RANGES`
are kept; past that the two lowest are merged into one. When every key has
the same width (the table's primary key is fixed-width), two ranges with no
possible key between them (``high + 1 == low`` as big-endian integers) merge,
so batches of consecutive ids that arrive out of order end as one range.

Pure: no RocksDB here; ``tablet/store/kvstore.py`` feeds it every key it stores.
"""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_RANGES = 32
#: More ranges than this overlapping one batch: the batch is checked against their span instead.
_MAX_TESTS = 4


class KeyRanges:
    """Sorted, disjoint ``[low, high]`` key ranges covering every key added; see the module docstring."""

    def __init__(self, key_width: int | None = None) -> None:
        """``key_width``: the length of every key when all have the same one (enables merging
        ranges with nothing between them), else None."""
        self.key_width = key_width
        self._lows: list[bytes] = []
        self._highs: list[bytes] = []

    @property
    def ranges(self) -> list[tuple[bytes, bytes]]:
        return list(zip(self._lows, self._highs))

    def add(self, low: bytes, high: bytes) -> None:
        """Cover ``[low, high]`` (``low <= high``), merging the ranges it overlaps or touches."""
        if low > high:
            raise ValueError(f"empty key range [{low!r}, {high!r}]")
        # ranges[i:j] overlap [low, high] or touch it (nothing could lie between them)
        i = bisect.bisect_left(self._highs, low)
        if i > 0 and self._adjacent(self._highs[i - 1], low):
            i -= 1
        j = bisect.bisect_right(self._lows, high)
        if j < len(self._lows) and self._adjacent(high, self._lows[j]):
            j += 1
        if i < j:
            low, high = min(low, self._lows[i]), max(high, self._highs[j - 1])
        self._lows[i:j] = [low]
        self._highs[i:j] = [high]
        if len(self._lows) > MAX_RANGES:  # cover the gap between the two lowest
            self._lows[0:2] = [self._lows[0]]
            self._highs[0:2] = [self._highs[1]]

    def add_keys(self, keys: pa.Array) -> None:
        """Cover every key of a binary array."""
        if len(keys):
            self.add(*key_range(keys))

    def maybe_stored(self, keys: pa.Array, bounds: tuple[bytes, bytes] | None = None) -> np.ndarray | None:
        """A bool mask of the keys (binary array) that lie in a range, None when none does.
        ``bounds``: the keys' :func:`key_range` if the caller has it."""
        if not len(keys) or not self._lows:
            return None
        low, high = bounds or key_range(keys)
        i = bisect.bisect_left(self._highs, low)
        j = bisect.bisect_right(self._lows, high)
        if i >= j:
            return None  # the batch falls into a gap (or past either end): nothing to look up
        tests = list(zip(self._lows[i:j], self._highs[i:j]))
        if len(tests) > _MAX_TESTS:
            tests = [(tests[0][0], tests[-1][1])]
        mask = None
        for lo, hi in tests:
            inside = pc.and_(pc.greater_equal(keys, pa.scalar(lo, pa.binary())),
                             pc.less_equal(keys, pa.scalar(hi, pa.binary())))
            mask = inside if mask is None else pc.or_(mask, inside)
        return mask.to_numpy(zero_copy_only=False)

    def _adjacent(self, high: bytes, low: bytes) -> bool:
        """Whether no key can lie strictly between ``high`` and ``low`` (both stored-key shaped)."""
        width = self.key_width
        return (width is not None and len(high) == len(low) == width
                and int.from_bytes(high, "big") + 1 == int.from_bytes(low, "big"))


def key_range(keys: pa.Array) -> tuple[bytes, bytes]:
    """The lowest and highest key of a non-empty binary array."""
    result = pc.min_max(keys)
    return result["min"].as_py(), result["max"].as_py()
