"""The writer sequence table of idempotent writes (Kafka's ``ProducerStateManager``, without transactions).

A table client has a writer id and numbers its batches per bucket; each
changelog entry carries the writer id and the batch's first and last
sequence, so every replica builds the same table from the entries it holds.
Per writer the table remembers its newest ``window`` (default 5) batches:
``(first_seq, last_seq, base_offset, last_offset, time_ms)``.

:meth:`SequenceTable.check` answers a new batch with one of:

- :class:`Append` — next in order (``first_seq == last remembered last_seq + 1``),
  or a writer the table does not know starting at 0;
- :class:`Duplicate` — a remembered batch with the same first and last
  sequence: the retry is answered with the original offsets, not appended.
  (On the leader the original may still be above the HW: the answer waits
  for it to be committed like the original's.)
- :class:`OutOfOrder` — anything else: a gap, an overlap, a duplicate older
  than the window, or an unknown writer not starting at 0. The client
  cannot continue with this writer id: it takes a new one (and numbers
  from 0 again).

Writer id :data:`NO_WRITER` (-1) is a write that is not idempotent: always
:class:`Append`, never recorded.

**Sequences do not wrap.** They are int32-like, 0 … :data:`MAX_SEQUENCE`
(2^31 - 1); a sequence outside that range raises ValueError. Kafka wraps at
2^31; here a writer id is short-lived (one per table client), so a client
takes a new writer id before its sequence would pass the maximum. That keeps
"next" and "older" plain integer comparisons.

**Replicas agree.** :meth:`SequenceTable.record` takes what an entry carries
and is not checked against the table (a follower copies what its leader
checked; a table rebuilt from a changelog whose head retention removed
starts mid-stream), so applying the same entries in order gives the same
table (:meth:`SequenceTable.view`): :meth:`SequenceTable.rebuild` is exactly
that. Expiry is the only thing that differs between replicas in time: a
writer whose newest batch is older than ``writer.id.expiration`` (by the
entries' append times, which every replica shares, against a ``now`` passed
in) is forgotten.

**Truncation is exact above the committed offset.** A replica only
truncates records above its high watermark (the rest is committed), so the
table keeps per writer its newest ``window`` committed batches and every
batch not yet below the committed offset (:meth:`SequenceTable.advance_committed`).
:meth:`SequenceTable.truncate_from` at or above it then leaves exactly the
table of the remaining entries. Truncating below it (an unclean election)
raises ValueError: the shell rebuilds the table from the changelog instead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

NO_WRITER = -1
MAX_SEQUENCE = 2**31 - 1
MAX_WRITER_ID = 2**63 - 1
DEFAULT_WINDOW = 5


@dataclass(frozen=True)
class BatchMeta:
    """One appended batch of a writer: its sequences, the offsets of its first and last record, its append time."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    time_ms: int


@dataclass(frozen=True)
class WriterBatch:
    """What a changelog entry carries for the table (:meth:`SequenceTable.rebuild`)."""

    writer_id: int
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    time_ms: int


@dataclass(frozen=True)
class Append:
    """The batch is next in order: append it."""


@dataclass(frozen=True)
class Duplicate:
    """The batch was appended before, at these offsets: answer with them."""

    base_offset: int
    last_offset: int


@dataclass(frozen=True)
class OutOfOrder:
    """Not the next batch (the table expected ``expected`` as its first sequence): refuse it."""

    expected: int


CheckOutcome = Append | Duplicate | OutOfOrder
APPEND = Append()


def _check_sequences(writer_id: int, first_seq: int, last_seq: int) -> None:
    if not (NO_WRITER <= writer_id <= MAX_WRITER_ID):
        raise ValueError(f"writer id {writer_id} is neither {NO_WRITER} nor 0..{MAX_WRITER_ID}")
    if not (0 <= first_seq <= last_seq <= MAX_SEQUENCE):
        raise ValueError(f"writer {writer_id}: sequences {first_seq}..{last_seq} must satisfy "
                         f"0 <= first <= last <= {MAX_SEQUENCE} (a writer takes a new id instead of wrapping)")


@dataclass
class SequenceTable:
    """Per writer id its newest batches; see the module docstring."""

    window: int = DEFAULT_WINDOW
    committed: int = 0  # records below this offset are committed: never truncated
    _writers: dict[int, deque[BatchMeta]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"the window must hold at least one batch, not {self.window}")

    def __len__(self) -> int:
        return len(self._writers)

    def view(self) -> dict[int, tuple[BatchMeta, ...]]:
        """What :meth:`check` answers from: per writer its newest ``window`` batches, oldest first."""
        return {w: tuple(batches)[-self.window:] for w, batches in sorted(self._writers.items())}

    def last_sequence(self, writer_id: int) -> int | None:
        """The writer's newest last sequence (None: an unknown writer)."""
        batches = self._writers.get(writer_id)
        return batches[-1].last_seq if batches else None

    def check(self, writer_id: int, first_seq: int, last_seq: int) -> CheckOutcome:
        """What to do with a new batch of ``writer_id`` numbered ``first_seq``..``last_seq``.

        Raises ValueError for an id or sequences out of range (an invalid request).
        """
        if writer_id == NO_WRITER:
            return APPEND
        _check_sequences(writer_id, first_seq, last_seq)
        batches = self._writers.get(writer_id)
        if not batches:
            return APPEND if first_seq == 0 else OutOfOrder(0)
        expected = batches[-1].last_seq + 1
        if first_seq == expected:
            return APPEND
        for batch in list(batches)[-self.window:]:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return Duplicate(batch.base_offset, batch.last_offset)
        return OutOfOrder(expected)

    def record(self, writer_id: int, first_seq: int, last_seq: int, base_offset: int, last_offset: int,
               time_ms: int) -> None:
        """A batch was appended (by this replica as leader, or copied from the leader), at ``time_ms``.

        Not checked against the table (see the module docstring); raises
        ValueError for values out of range or offsets that do not follow the
        writer's newest batch.
        """
        if writer_id == NO_WRITER:
            return
        _check_sequences(writer_id, first_seq, last_seq)
        batches = self._writers.get(writer_id)
        newest = batches[-1] if batches else None
        if not 0 <= base_offset <= last_offset or (newest is not None and base_offset <= newest.last_offset):
            raise ValueError(f"writer {writer_id}: batch at offsets {base_offset}..{last_offset} does not "
                             f"follow the writer's newest batch {newest}")
        if batches is None:
            batches = self._writers[writer_id] = deque()
        batches.append(BatchMeta(first_seq, last_seq, base_offset, last_offset, time_ms))
        self._trim(batches)

    def rebuild(self, entries: Iterable[WriterBatch], *, committed: int) -> None:
        """Forget everything, then record ``entries`` in log order; records below ``committed`` are committed."""
        self._writers.clear()
        self.committed = committed
        for e in entries:
            self.record(e.writer_id, e.first_seq, e.last_seq, e.base_offset, e.last_offset, e.time_ms)

    def advance_committed(self, offset: int) -> None:
        """Records below ``offset`` are committed (the HW); a lower offset is ignored. O(1): writers are
        trimmed when next touched."""
        self.committed = max(self.committed, offset)

    def truncate_from(self, offset: int) -> None:
        """The log lost its records at ``offset`` and above: forget the batches that reached there.

        A writer left with no batch is forgotten. Raises ValueError below
        the committed offset (rebuild from the changelog instead).
        """
        if offset < self.committed:
            raise ValueError(f"truncation to {offset} is below the committed offset {self.committed}: "
                             f"rebuild the table from the changelog")
        for writer_id in list(self._writers):
            batches = self._writers[writer_id]
            while batches and batches[-1].last_offset >= offset:
                batches.pop()
            if not batches:
                del self._writers[writer_id]

    def expire(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget the writers whose newest batch is committed and was appended more than ``expiration_ms``
        before ``now_ms``; their ids, ascending."""
        gone = sorted(w for w, batches in self._writers.items()
                      if now_ms - batches[-1].time_ms > expiration_ms and batches[-1].last_offset < self.committed)
        for writer_id in gone:
            del self._writers[writer_id]
        for batches in self._writers.values():
            self._trim(batches)
        return gone

    def _trim(self, batches: deque[BatchMeta]) -> None:
        """Drop the oldest batch while ``window`` newer committed ones remain: a truncation (never below
        the committed offset) then still leaves the newest ``window`` batches of what stays."""
        while len(batches) > self.window and batches[self.window].last_offset < self.committed:
            batches.popleft()
