"""When a bucket's memtables should carry a Bloom filter: only while writes look keys up.

A memtable Bloom filter (RocksDB's ``memtable_prefix_bloom_size_ratio`` with
whole-key filtering) answers "not in this memtable" without a skiplist search,
so the before-image lookup of a *new* random key costs ~40% less. But every
key written is also added to it, a cache miss per row: with appending keys
(ids, timestamps), which :mod:`kvlease.tablet.store.key_ranges` already spares every lookup,
the filter only costs, ~15-25% of a write's CPU in ``bench writes``.

:class:`MemtableFilterPolicy` watches, per window of :data:`WINDOW_ROWS` written
keys, which share of them the write path had to look up, and says when to turn
the filter on (a share of at least :data:`ON_SHARE`) or off (at most
:data:`OFF_SHARE`); in between it keeps what it has, so a mixed load does not
flip it. It starts off: a bucket that appends never pays for the filter, and a
random or updating load turns it on after one window. RocksDB applies the
change to the memtables it creates from then on; the one being filled keeps
what it was created with. Correctness never depends on it: a lookup without
the filter searches the memtable and finds the same rows.

Pure: no RocksDB here; ``tablet/store/kvstore.py`` feeds it and applies its answers.
"""

from __future__ import annotations

WINDOW_ROWS = 65_536
ON_SHARE = 1 / 8
OFF_SHARE = 1 / 64


class MemtableFilterPolicy:
    """Whether memtables should have a Bloom filter; see the module docstring."""

    def __init__(self, *, window_rows: int = WINDOW_ROWS) -> None:
        if window_rows <= 0:
            raise ValueError(f"window_rows must be positive, got {window_rows}")
        self.enabled = False
        self.window_rows = window_rows
        self._rows = 0
        self._looked_up = 0

    def observe(self, rows: int, looked_up: int) -> bool | None:
        """A write of ``rows`` keys of which ``looked_up`` needed a lookup. Returns the setting to
        apply when it should change (set :attr:`enabled` once applied), None when it stays."""
        if not 0 <= looked_up <= rows:
            raise ValueError(f"looked_up must be in [0, rows={rows}], got {looked_up}")
        self._rows += rows
        self._looked_up += looked_up
        if self._rows < self.window_rows:
            return None
        share = self._looked_up / self._rows
        self._rows = self._looked_up = 0
        wanted = share >= ON_SHARE if not self.enabled else share > OFF_SHARE
        return None if wanted == self.enabled else wanted
