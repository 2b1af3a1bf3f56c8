"""Idempotent writes of one bucket: which batches of which writers its changelog holds.

A table client sends each write of a bucket as ``(writer id, sequence)``;
every changelog entry records them (format 3). :class:`WriterSequences` keeps
the bucket's :class:`~kvlease.tablet.log.sequences.SequenceTable` and answers
a new batch: append it, answer a resent one with its original offsets, or
refuse one out of order. The table is built from the changelog on the first
idempotent write after the bucket opened or failed (the entries appended
within ``writer.id.expiration``; older writers are forgotten anyway), then
kept up to date as batches are appended. With one replica every published
entry is committed.

A store failure forgets the table (:meth:`WriterSequences.reset`): entries
written but not synced may be gone, and a batch the table remembered but
the log lost would be answered as a duplicate that is not there. The next
idempotent write builds it again from what the changelog holds.

A replica rebuilt from a remote snapshot has no changelog below the
snapshot's ``log_offset``: the snapshot's manifest carries the writers' batches
it holds, installed as the bucket's *seed* (``{dir}/writers.json``,
:func:`save_seed`, loaded when the files open). The table is built from the
seed, then the changelog.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterable

from kvlease.common.logentry import read_header
from kvlease.tablet.log.changelog import Changelog
from kvlease.tablet.log.segment_files import write_durably
from kvlease.tablet.log.sequences import CheckOutcome, SequenceTable, WriterBatch

#: Bytes of changelog read per step while building the table.
_READ_BYTES = 4 << 20
#: The seed's file in the bucket's directory (see the module docstring).
SEED_FILE = "writers.json"
#: ``writer.id.expiration``'s default: a store opened outside a tablet server uses it.
DEFAULT_WRITER_EXPIRATION_MS = 86_400_000


class WriterSequences:
    def __init__(self, expiration_ms: int, clock_ms: Callable[[], int]) -> None:
        self.expiration_ms = expiration_ms
        self.clock_ms = clock_ms
        self._table: SequenceTable | None = None
        #: Batches below the changelog's start that a rebuilt replica took from its snapshot, in log order.
        self.seed: tuple[WriterBatch, ...] = ()
        self.builds = 0  # how many times the table was built from the changelog (tests, metrics)

    def reset(self) -> None:
        """Forget the table: it is built again from the changelog when next needed."""
        self._table = None

    def check(self, changelog: Changelog, writer_id: int, sequence: int) -> CheckOutcome:
        """What to do with batch ``sequence`` of ``writer_id`` (hold the store's write lock). Raises
        ValueError for an id or sequence out of range."""
        return self._built(changelog).check(writer_id, sequence, sequence)

    def batches_below(self, changelog: Changelog, offset: int) -> list[tuple[int, ...]]:
        """The table's batches ending below ``offset`` as ``(writer_id, first_seq, last_seq, base_offset,
        last_offset, time_ms)`` (what a snapshot at ``offset`` holds; hold the write lock)."""
        return [(writer_id, b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.time_ms)
                for writer_id, batches in self._built(changelog).view().items() for b in batches
                if b.last_offset < offset]

    def record(self, writer_id: int, sequence: int, base_offset: int, next_offset: int, time_ms: int) -> None:
        """The batch was written at ``base_offset``..``next_offset`` (hold the write lock). A table not
        built yet is left so: building it reads this entry from the changelog."""
        if self._table is not None:
            self._table.record(writer_id, sequence, sequence, base_offset, next_offset - 1, time_ms)
            self._table.advance_committed(next_offset)

    def _built(self, changelog: Changelog) -> SequenceTable:
        if self._table is None:
            table = SequenceTable()
            now = self.clock_ms()
            start = changelog.offset_for_timestamp(max(now - self.expiration_ms, 0))
            seed = [b for b in self.seed if b.last_offset < changelog.start_offset]
            table.rebuild([*seed, *_writer_batches(changelog, start)], committed=changelog.end_offset)
            table.expire(now, self.expiration_ms)
            self._table = table
            self.builds += 1
        return self._table


def _writer_batches(changelog: Changelog, start: int):
    """The idempotent writers' batches of the changelog from ``start`` to its end, in log order (only the
    entry headers are decoded)."""
    offset, end = start, changelog.end_offset
    while offset < end:
        frames = changelog.read_raw(offset, _READ_BYTES)
        for frame in frames:
            header = read_header(frame, 0, len(frame))
            if header.writer_id >= 0 and header.base_offset >= start:
                yield WriterBatch(header.writer_id, header.sequence, header.sequence, header.base_offset,
                                  header.base_offset + header.count - 1, header.timestamp_ms or 0)
            offset = max(offset, header.base_offset + header.count)
        if not frames:
            break


def load_seed(dir: str) -> tuple[WriterBatch, ...]:
    """The seed saved in the bucket directory ``dir`` (empty if none), in log order."""
    try:
        with open(os.path.join(dir, SEED_FILE), "rb") as fh:
            rows = json.loads(fh.read())
    except FileNotFoundError:
        return ()
    return tuple(sorted((WriterBatch(*(int(v) for v in row)) for row in rows), key=lambda b: b.base_offset))


def save_seed(dir: str, batches: Iterable[tuple[int, ...]], fsync: bool = True) -> None:
    """Write the seed atomically (none: the file is removed)."""
    path = os.path.join(dir, SEED_FILE)
    rows = [list(b) for b in batches]
    if not rows:
        if os.path.exists(path):
            os.unlink(path)
        return
    write_durably(path, json.dumps(rows).encode(), fsync)
