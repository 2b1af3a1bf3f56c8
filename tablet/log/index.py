"""The in-memory index of a changelog segment: where each entry starts, its first offset, its append time.

``tablet/log/changelog.py`` rebuilds it from the entry headers at open and
extends it on append. Append times never decrease within a changelog (the
writer takes ``max(previous, now)``), so the first entry appended at or after
a time is a binary search over segments, then over one segment's entries:
no file is read.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field
from typing import Sequence

#: The time key of an entry without a timestamp (format version 1): older than any timestamp.
NO_TIMESTAMP = -1


class SegmentIndex:
    """Entry i of the segment file ``path`` starts at byte ``positions[i]`` with offset ``bases[i]``
    and was appended at ``times[i]`` (ms since the epoch; :data:`NO_TIMESTAMP` for a v1 entry).
    ``floor`` is the time key of the entry before the segment's first one."""

    __slots__ = ("base_offset", "path", "floor", "bases", "positions", "times", "end_offset", "size")

    def __init__(self, base_offset: int, path: str, floor: int = NO_TIMESTAMP) -> None:
        self.base_offset = base_offset
        self.path = path
        self.floor = floor
        self.bases = array("q")
        self.positions = array("q")
        self.times = array("q")
        self.end_offset = base_offset
        self.size = 0

    def add(self, base_offset: int, position: int, time_key: int) -> None:
        self.bases.append(base_offset)
        self.positions.append(position)
        self.times.append(time_key)

    def entry(self, i: int) -> tuple[int, int, int, int]:
        """(position, size, base_offset, count) of entry i."""
        last = i + 1 == len(self.bases)
        end_pos = self.size if last else self.positions[i + 1]
        next_base = self.end_offset if last else self.bases[i + 1]
        return self.positions[i], end_pos - self.positions[i], self.bases[i], next_base - self.bases[i]

    def cut(self, end_offset: int) -> None:
        """Forget the entries at ``end_offset`` and above (an entry's base): the segment ends there."""
        i = bisect.bisect_left(self.bases, end_offset)
        if i < len(self.bases):
            self.size = self.positions[i]
        del self.bases[i:], self.positions[i:], self.times[i:]
        self.end_offset = end_offset

    @property
    def last_time(self) -> int:
        """The time key of the newest entry (``floor`` while the segment has none)."""
        return self.times[-1] if self.times else self.floor


def time_key(timestamp_ms: int | None, floor: int) -> int:
    """The index key of an entry read back from disk: its timestamp (:data:`NO_TIMESTAMP` if it has
    none), never below ``floor``, the key of the entry before it. Entries this code appended never
    go backwards; the floor keeps the search well defined over any file."""
    return max(floor, NO_TIMESTAMP if timestamp_ms is None else timestamp_ms)


def first_offset_at_or_after(segments: Sequence[SegmentIndex], timestamp_ms: int) -> int:
    """The base offset of the first entry appended at or after ``timestamp_ms`` (entries without a
    timestamp count as older than any); the end offset of the last segment when there is none.

    ``segments`` are contiguous, oldest first, with non-decreasing time keys.
    """
    s = bisect.bisect_left(segments, timestamp_ms, key=lambda segment: segment.last_time)
    if s == len(segments):
        return segments[-1].end_offset
    segment = segments[s]
    i = bisect.bisect_left(segment.times, timestamp_ms)
    return segment.bases[i] if i < len(segment.bases) else segment.end_offset


def runs_from(segments: Sequence[SegmentIndex], from_offset: int,
              max_bytes: int) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
    """The entries from the one holding ``from_offset`` on (in ``segments``, the first of which holds it)
    while their sizes fit ``max_bytes`` (the first always comes), as ``(segment path, [(position, size,
    base_offset, count)])`` per segment."""
    runs: list[tuple[str, list]] = []
    budget = max_bytes
    for seg in segments:
        first = max(bisect.bisect_right(seg.bases, from_offset) - 1, 0)
        for i in range(first, len(seg.bases)):
            entry = seg.entry(i)
            if runs and entry[1] > budget:
                return runs
            if not runs or runs[-1][0] != seg.path:
                runs.append((seg.path, []))
            runs[-1][1].append(entry)
            budget -= entry[1]
    return runs


@dataclass(eq=False)
class PendingAppend:
    """An append written to a changelog's file but not yet published (``Changelog.write``): what publishing
    adds to the index."""

    timestamp: int
    ranges: list[tuple[int, int]] = field(default_factory=list)  # (base_offset, next_offset) per batch
    entries: list[tuple[SegmentIndex, int, int, int]] = field(default_factory=list)  # (segment, base, position, time key)
    rolled: list[tuple[SegmentIndex, int, int]] = field(default_factory=list)  # (segment, final size, end)
    new_segments: list[SegmentIndex] = field(default_factory=list)
    active: SegmentIndex | None = None  # the active segment after it, its size and end offset
    size: int = 0
    end: int = 0


@dataclass(frozen=True)
class SegmentInfo:
    base_offset: int
    end_offset: int  # next offset after the segment's last record
    size: int
    mtime: float  # seconds since the epoch
    path: str
