"""The leader-epoch cache of one replica's log, and where a follower's log diverges from its leader's.

The cache is the ordered list of ``(leader_epoch, start_offset)``: the first
offset written under each leader epoch (Kafka's ``LeaderEpochFileCache``). An
epoch's records run from its start offset to the next epoch's start, the
latest epoch's to the log end. Only one leader writes under an epoch, so two
replicas that hold an offset under the same epoch hold the same record there
(entries are copied byte for byte).

Rules kept here:

- :meth:`EpochCache.assign` is called when the replica appends the first entry
  of a new epoch (every entry holds at least one record, so start offsets
  grow strictly, as epochs do). Assigning the latest epoch again at its own
  start is a no-op (an append retried after a crash); anything else that is
  not newer raises ValueError.
- :meth:`EpochCache.truncate_from` (the log lost offsets ≥ ``offset``) drops
  the epochs that start there or later; the epoch holding ``offset`` stays.
- :meth:`EpochCache.truncate_before` (retention removed the head) drops the
  epochs that end at or before the new start, and moves the start of the one
  holding it up to it (as Kafka's ``truncateFromStart``).

**Finding the divergence** (KIP-101, as refined by KIP-279). The follower
sends its latest epoch; the leader answers with :meth:`EpochCache.end_offset_for`
(Kafka's OffsetsForLeaderEpoch): the largest epoch ≤ the requested one that
it knows, and where that epoch ends in the leader's log. The follower then
takes one step, :meth:`EpochCache.truncation_for`: if it holds the answered
epoch it truncates to the lower of the two ends of that epoch and is done;
if not (the leader never had the follower's latest epoch, and the follower
never had the one answered) it truncates to the end of its own largest epoch
below the answer and asks again with its new latest epoch. KIP-101's single
step — "truncate to min(follower log end, the leader's end of the follower's
last epoch)" — is not enough: when the leader answers a smaller epoch the
follower's records of that epoch may end earlier than the leader's, and
under a newer epoch the leader never had, the follower holds different
records at the same offsets (``tests/tablet/log/test_epochs.py``
pins such a case). :func:`divergence` runs the rounds to the end for two
caches at hand.

The cache is checkpointed as JSON next to the changelog (:meth:`EpochCache.to_bytes`);
a corrupt checkpoint raises ValueError.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any, Iterable

FORMAT_VERSION = 1


@dataclass(frozen=True)
class EpochEntry:
    """The first offset written under ``epoch``."""

    epoch: int
    start_offset: int


@dataclass(frozen=True)
class EpochEnd:
    """The leader's answer to "where does my epoch end in your log?".

    ``epoch`` is the largest epoch ≤ the requested one the leader knows (the
    requested epoch itself when the leader knows only larger ones; None when
    its cache is empty); ``end_offset`` is where that epoch's records end in
    the leader's log (the next known epoch's start, or the log end).
    """

    epoch: int | None
    end_offset: int


@dataclass(frozen=True)
class Truncation:
    """One step of the follower: truncate its log to ``offset``; ``done`` False means ask the leader again
    with the new latest epoch."""

    offset: int
    done: bool


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class EpochCache:
    """The ``(epoch, start_offset)`` list of one replica's log; see the module docstring."""

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries:
            self.assign(epoch, start)

    # -- reading ------------------------------------------------------------

    @property
    def entries(self) -> list[EpochEntry]:
        return [EpochEntry(e, s) for e, s in zip(self._epochs, self._starts)]

    @property
    def latest_epoch(self) -> int | None:
        """The epoch of the log's last record (None: no epoch known — the log holds no record)."""
        return self._epochs[-1] if self._epochs else None

    def __len__(self) -> int:
        return len(self._epochs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EpochCache) and self.entries == other.entries

    def __repr__(self) -> str:
        return f"EpochCache({list(zip(self._epochs, self._starts))})"

    def epoch_at(self, offset: int) -> int | None:
        """The epoch the record at ``offset`` was written under (None: before the first known epoch).

        The caller knows ``offset`` is in the log; past the log end this is the latest epoch.
        """
        i = bisect.bisect_right(self._starts, offset)
        return self._epochs[i - 1] if i else None

    def end_offset_for(self, epoch: int, log_end: int) -> EpochEnd:
        """The answer to OffsetsForLeaderEpoch(``epoch``) for this log, which ends at ``log_end``.

        The largest known epoch ≤ ``epoch`` and its end: the start of the next
        known epoch, or ``log_end`` for the latest. If every known epoch is
        larger, the answer is ``epoch`` itself ending where the first known
        one starts (the records before it are gone or were never here:
        Kafka's answer). An empty cache (no record in the log) answers
        ``EpochEnd(None, log_end)``.
        """
        if not self._epochs:
            return EpochEnd(None, log_end)
        i = bisect.bisect_right(self._epochs, epoch)
        if i == 0:
            return EpochEnd(epoch, self._starts[0])
        end = self._starts[i] if i < len(self._starts) else log_end
        return EpochEnd(self._epochs[i - 1], end)

    def reader_divergence(self, epoch: int, from_offset: int, log_end: int) -> int | None:
        """Where a reader's history left this log: None if it did not, else the first offset of the range
        ``[returned, from_offset)`` the reader read that this log does not hold (KIP-320's fetch fencing).

        The reader read up to ``from_offset`` and the entry just below it under leader ``epoch``; this log
        ends at ``log_end``. With ``answer`` = :meth:`end_offset_for` (``epoch``):

        - ``answer.end_offset < from_offset``: this log does not hold ``epoch`` up to ``from_offset``
          (a restore started the log over at its snapshot's offset, or an unclean leader's log ended
          earlier): the range starts there.
        - ``answer.epoch < epoch`` (this log never had the reader's epoch, yet holds offsets up to
          ``from_offset`` under an older one): the entry just below ``from_offset`` at least differs;
          the range starts at ``from_offset - 1`` (where the reader's epoch began is not known here).
        - Every known epoch newer than ``epoch`` and ``from_offset`` at or below the first one's start
          (the log start of a restored log, say): no divergence — the entries below the start are the
          snapshot's, which the reader's history holds too (a loss never takes back offsets below the
          snapshot it restores). An empty cache (no entry since a restore) answers the log end: a
          reader past it diverged, one at or below it did not.
        """
        answer = self.end_offset_for(epoch, log_end)
        if answer.end_offset < from_offset:
            return answer.end_offset
        if answer.epoch is not None and answer.epoch < epoch and from_offset > 0:
            return from_offset - 1
        return None

    def truncation_for(self, answer: EpochEnd, log_end: int) -> Truncation:
        """The follower's step on the leader's ``answer`` (see the module docstring); this log ends at ``log_end``.

        ``done``: the follower holds the answered epoch (or the leader holds
        no epoch at all), so truncating to ``offset`` leaves a prefix of the
        leader's log. Otherwise ``offset`` drops the follower's epochs above
        the answer, and it asks again with its new latest epoch.
        """
        if answer.epoch is None:
            return Truncation(min(log_end, answer.end_offset), True)
        own = self.end_offset_for(answer.epoch, log_end)
        if own.epoch is None:
            return Truncation(min(log_end, answer.end_offset), True)  # no record here to compare
        if own.epoch == answer.epoch:
            return Truncation(min(own.end_offset, answer.end_offset, log_end), True)
        return Truncation(min(own.end_offset, log_end), False)

    # -- changing -----------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that the first entry of ``epoch`` starts at ``start_offset`` (called on its append).

        Raises ValueError for a negative value, or an epoch or start offset not
        greater than the latest (the same latest pair again is a no-op).
        """
        if not (_is_int(epoch) and _is_int(start_offset)) or epoch < 0 or start_offset < 0:
            raise ValueError(f"leader epoch and start offset must be integers >= 0, not {epoch!r}, {start_offset!r}")
        if self._epochs:
            latest, start = self._epochs[-1], self._starts[-1]
            if (epoch, start_offset) == (latest, start):
                return
            if epoch <= latest or start_offset <= start:
                raise ValueError(f"leader epoch {epoch} at offset {start_offset} does not follow the latest, "
                                 f"epoch {latest} at offset {start}: epochs and start offsets only grow")
        self._epochs.append(epoch)
        self._starts.append(start_offset)

    def truncate_from(self, offset: int) -> None:
        """The log lost its records at ``offset`` and above: drop the epochs that start there or later."""
        i = bisect.bisect_left(self._starts, offset)
        del self._epochs[i:], self._starts[i:]

    def truncate_before(self, offset: int) -> None:
        """Retention removed the records below ``offset``: the epoch holding ``offset`` now starts there."""
        i = bisect.bisect_right(self._starts, offset)
        if i == 0:
            return
        del self._epochs[:i - 1], self._starts[:i - 1]
        self._starts[0] = offset

    # -- the checkpoint -----------------------------------------------------

    def to_bytes(self) -> bytes:
        """The checkpoint: JSON ``{"version": 1, "epochs": [[epoch, start_offset], ...]}``."""
        doc = {"version": FORMAT_VERSION, "epochs": [[e, s] for e, s in zip(self._epochs, self._starts)]}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "EpochCache":
        """The cache of a checkpoint; ValueError if it is not one (bad JSON, version, shape or order)."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"leader-epoch checkpoint is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or set(doc) != {"version", "epochs"}:
            raise ValueError(f"leader-epoch checkpoint: expected version {FORMAT_VERSION} with epochs, "
                             f"got {str(doc)[:200]}")
        pairs = doc["epochs"]
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ValueError("leader-epoch checkpoint: epochs must be a list of [epoch, start_offset]")
        return cls((e, s) for e, s in pairs)  # assign refuses bad values and order


def divergence(leader: EpochCache, leader_log_end: int, follower: EpochCache, follower_log_end: int) -> int:
    """Where the follower must truncate so that its log is a prefix of the leader's.

    Runs the rounds of the module docstring on a copy of ``follower`` (which
    is not changed): ask with the latest epoch, step, until done.
    """
    own = EpochCache((e.epoch, e.start_offset) for e in follower.entries)
    end = follower_log_end
    while True:
        latest = own.latest_epoch
        if latest is None:
            return min(end, leader_log_end) if len(leader) == 0 else end
        step = own.truncation_for(leader.end_offset_for(latest, leader_log_end), end)
        end = min(end, step.offset)
        own.truncate_from(end)
        if step.done:
            return end
