"""The pre-write buffer of a replicated bucket's leader: entries in the changelog, not yet committed.

A replicated bucket (``BucketStore(replicated=True)``, docs/bucket-store.md,
"Replication") appends and publishes a write's entry but applies it to
RocksDB only once the high watermark passes it. Until then the entry waits
here, in offset order, as the RocksDB WriteBatch that applies it and the
state it leaves each key in (its value, or None: deleted). The buffer covers
the changelog range ``[start, end)``: ``start`` is RocksDB's applied offset,
``end`` the changelog's published end, and every entry between them is held.

The before-images of a later write read through it (:meth:`PrewriteBuffer.before_images`):
a key written by a buffered entry has the value the newest such entry left,
whatever RocksDB holds. When the high watermark passes an entry, the store
commits its batch and pops it (:meth:`PrewriteBuffer.pop`).

Not locked: the bucket store uses it under its write lock. A buffer that no
longer matches the changelog (after a failure, a truncation, while the replica
follows) is :meth:`~PrewriteBuffer.invalidate`-d and rebuilt from the
changelog entries between the applied offset and the end (:func:`entry_changes`)
before the next write reads through it (:meth:`PrewriteBuffer.ready`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pyarrow as pa

from kvlease.common.logentry import ChangeType, LogEntry
from kvlease.tablet.log.changelog import Changelog
from kvlease.tablet.store.kvstore import KvStore, PreparedWrite

#: Changelog bytes decoded per step when rebuilding the buffer or applying entries the buffer does not hold.
READ_BYTES = 4 << 20

_PUT_TYPES = (int(ChangeType.INSERT), int(ChangeType.UPDATE_AFTER))
_DELETE = int(ChangeType.DELETE)


@dataclass(frozen=True)
class BufferedEntry:
    """The entry of records ``base``..``next - 1``: ``prepared`` applies it, ``changes`` is the state it leaves
    each key it touches in (None: deleted)."""

    base: int
    next: int
    prepared: PreparedWrite
    changes: dict[bytes, bytes | None]


def entry_changes(entry: LogEntry) -> dict[bytes, bytes | None]:
    """The state a changelog entry leaves each key it touches in: its last +I/+U value, or None after -D."""
    records = entry.records
    changes: dict[bytes, bytes | None] = {}
    types = records.column(0).to_numpy().tolist()
    for change_type, key, value in zip(types, records.column(1).to_pylist(), records.column(2).to_pylist()):
        if change_type in _PUT_TYPES:
            changes[key] = value
        elif change_type == _DELETE:
            changes[key] = None
    return changes


def prepared_of(changes: dict[bytes, bytes | None]) -> PreparedWrite:
    """The RocksDB batch that leaves each key of ``changes`` in its state."""
    puts = [k for k, v in changes.items() if v is not None]
    return KvStore.prepare(puts, [changes[k] for k in puts], [k for k, v in changes.items() if v is None])


class PrewriteBuffer:
    """The buffered entries of ``[start, end)``; see the module docstring. ``start is None``: not valid.

    Adding and popping an entry is O(1); a write's before-images look through the buffered entries,
    newest first, only for the keys it touches (a set intersection per entry: the buffer holds the few
    entries the followers have not acknowledged yet)."""

    def __init__(self) -> None:
        self._entries: deque[BufferedEntry] = deque()
        self.start: int | None = None
        self.end: int | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def covers(self, start: int, end: int) -> bool:
        """Whether it is valid and holds exactly the entries of ``[start, end)``."""
        return self.start == start and self.end == end

    def invalidate(self) -> None:
        """Forget everything: it must be rebuilt (:meth:`reset` then :meth:`add`) before use."""
        self._entries.clear()
        self.start = self.end = None

    def reset(self, offset: int) -> None:
        """Empty and valid at ``offset`` (RocksDB's applied offset == the changelog's end so far)."""
        self.invalidate()
        self.start = self.end = offset

    def ready(self, changelog: Changelog, applied: int) -> None:
        """Rebuild it from ``changelog``'s entries unless it holds exactly ``[applied, end)`` (``applied``:
        RocksDB's applied offset, ``end``: the changelog's end)."""
        end = changelog.end_offset
        if self.covers(applied, end):
            return
        self.reset(applied)
        offset = applied
        while offset < end:
            for entry in changelog.read(offset, READ_BYTES):
                changes = entry_changes(entry)
                self.add(entry.base_offset, entry.next_offset, prepared_of(changes), changes)
                offset = entry.next_offset

    def add(self, base: int, next_offset: int, prepared: PreparedWrite, changes: dict[bytes, bytes | None]) -> None:
        """Buffer the entry just published at ``base``: it must start at :attr:`end` (else the buffer is
        invalidated, to be rebuilt)."""
        if self.end != base:
            self.invalidate()
            return
        self._entries.append(BufferedEntry(base, next_offset, prepared, changes))
        self.end = next_offset

    def first(self) -> BufferedEntry | None:
        return self._entries[0] if self._entries else None

    def pop(self) -> BufferedEntry:
        """Remove the oldest entry (RocksDB has just applied it): :attr:`start` moves to its end."""
        entry = self._entries.popleft()
        self.start = entry.next
        return entry

    def before_images(self, key_list: list[bytes], olds: pa.Array) -> pa.Array:
        """``olds`` (RocksDB's values of ``key_list``, null where missing) with the buffered state of each
        key the buffer holds put in its place (the newest entry touching a key decides)."""
        if not self._entries:
            return olds
        wanted = set(key_list)
        found: dict[bytes, bytes | None] = {}
        for entry in reversed(self._entries):
            for key in wanted.intersection(entry.changes):
                found[key] = entry.changes[key]
            wanted.difference_update(found)
            if not wanted:
                break
        if not found:
            return olds
        values = olds.to_pylist()
        for i, key in enumerate(key_list):
            if key in found:
                values[i] = found[key]
        return pa.array(values, pa.binary())
