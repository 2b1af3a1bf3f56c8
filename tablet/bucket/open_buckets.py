"""The buckets of a tablet server whose files are open: at most ``capacity``, least recently used parked first.

One open bucket holds up to :data:`~kvlease.tablet.store.kvstore.FDS_PER_OPEN_BUCKET` file
descriptors (RocksDB and the changelog); a server leading 10,000 buckets with
every one open runs out of them. :class:`OpenBuckets` is the server's budget:
each :class:`~kvlease.tablet.bucket.files.BucketFiles` reports that it opened, was used
or closed, and after a use that leaves more than ``capacity`` open, the least
recently used ones are *parked* (their files closed; the next use opens them
again). A bucket that cannot be parked right now (an operation runs on it, a
live scan holds a snapshot of it, it failed and waits for its reopen) counts as
just used, so the search moves on; the budget is then exceeded only by buckets
that are in use.
"""

from __future__ import annotations

import itertools
import resource
import threading
from collections import OrderedDict
from typing import Protocol

from kvlease.tablet.store.kvstore import FDS_PER_OPEN_BUCKET

_SEARCH = 8  # buckets tried beyond the number to park, per use (busy ones are skipped)
AUTO_MAX_OPEN = 1000  # the automatic capacity's ceiling (memory: each open RocksDB has its memtable)


def fd_limit() -> int:
    """This process's soft open-file limit (raised to the hard one at start: common/process.py)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def open_capacity(configured: int, limit: int | None = None) -> int:
    """``tablet.buckets.max-open``, or for 0 as many buckets as three quarters of the open-file
    ``limit`` hold at :data:`FDS_PER_OPEN_BUCKET` each (the rest: connections, threads, snapshot
    uploads), at most :data:`AUTO_MAX_OPEN`."""
    if configured > 0:
        return configured
    limit = fd_limit() if limit is None else limit
    return max(1, min(AUTO_MAX_OPEN, limit * 3 // 4 // FDS_PER_OPEN_BUCKET))


class Parkable(Protocol):
    def park(self) -> bool:
        """Close the files if idle; True if they are closed now."""


class OpenBuckets:
    """An LRU of the buckets with open files (thread-safe); see the module docstring."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the open-bucket capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._open: OrderedDict[Parkable, None] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        #: Buckets parked so far (for metrics: a high rate means the capacity is too small for the load).
        self.parked = 0
        #: Bucket files opened so far, first opens and reopens of parked ones alike.
        self.opens = 0

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, files: Parkable) -> None:
        """``files`` opened: the most recently used now (the caller's :meth:`used` parks others)."""
        with self._lock:
            self._open[files] = None
            self.opens += 1

    def closed(self, files: Parkable) -> None:
        with self._lock:
            self._open.pop(files, None)

    def used(self, files: Parkable) -> None:
        """``files`` was just used; park the least recently used others while over capacity."""
        with self._lock:
            if files in self._open:
                self._open.move_to_end(files)
            over = len(self._open) - self.capacity
            if over <= 0:
                return
            candidates = [f for f in itertools.islice(self._open, over + _SEARCH) if f is not files]
        for candidate in candidates:
            if over <= 0:
                return
            if candidate.park():  # it calls closed()
                over -= 1
                with self._lock:
                    self.parked += 1
            else:
                with self._lock:  # busy: search further next time
                    if candidate in self._open:
                        self._open.move_to_end(candidate)
