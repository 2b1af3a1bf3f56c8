"""Pure checkers of lookups made during the faults: reads never go back in time (linearizable reads).

Each key is written by one client thread, one call at a time (as in
:mod:`kvlease.ops.drills.row_checks`), so its writes ``w0, w1, …`` have an order, and
its state at any instant is the value of one of them (or no row: before the
first write, after a delete). A lookup is *sent* at ``t0`` and *answered* at
``t1``; its answer is the key's state at some instant between the two. The
states it may show are those from the last write acknowledged before it was
sent up to the last write sent before it was answered; an unacknowledged
write in that range may or may not have happened, one before it was
overwritten by the acknowledged one (docs/drills.md "The invariants").

- :func:`reads_see_acknowledged_writes`: a lookup shows one of those states;
  an older one (a write the last acknowledged one overwrote, "no row" after
  an acknowledged upsert, a deleted row after an acknowledged delete) is a
  stale read, as a deposed leader would give (docs/architecture.md "Leader
  leases").
- :func:`reads_in_order`: a lookup sent after another lookup of the key was
  answered shows that one's state or a later one (the state a read saw was
  real: once seen, no later read may show an earlier one). With the first,
  this makes the lookups linearizable with the writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from kvlease.ops.check import Check
from kvlease.ops.drills.row_checks import WriteOp

MAX_LISTED = 20  # violations listed per check; the rest are counted


@dataclass(frozen=True)
class ReadOp:
    """A lookup of ``key`` sent at ``t0``, answered at ``t1`` (the writers' clock) with ``value`` (None: no
    row), or failed with the typed error ``error`` (then ``value`` means nothing)."""

    key: int
    value: int | None
    t0: float
    t1: float
    error: str = ""


@dataclass(frozen=True)
class _Seen:
    """An answered read and the writes (indices; -1: the state before the key's first write) it may show."""

    read: ReadOp
    first: int  # the last write acknowledged before the read was sent (-1: none)
    candidates: tuple[int, ...]  # the writes of first..(last sent before it was answered) with its value


def _value(writes: Sequence[WriteOp], index: int) -> int | None:
    return writes[index].value if index >= 0 else None


def _seen(writes: Sequence[WriteOp], read: ReadOp) -> _Seen:
    first = -1
    for i, w in enumerate(writes):
        if w.acked and w.t1 <= read.t0:
            first = i
    last = first
    while last + 1 < len(writes) and writes[last + 1].t0 <= read.t1:
        last += 1  # one writer per key: the writes are sent in order
    return _Seen(read, first, tuple(i for i in range(first, last + 1) if _value(writes, i) == read.value))


def _show(value: int | None) -> str:
    return "no row" if value is None else str(value)


def _at(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def _capped(violations: list[str]) -> list[str]:
    if len(violations) <= MAX_LISTED:
        return violations
    return violations[:MAX_LISTED] + [f"… and {len(violations) - MAX_LISTED} more"]


def _answered(reads: Iterable[ReadOp], history: Mapping[int, Sequence[WriteOp]]) -> dict[int, list[_Seen]]:
    out: dict[int, list[_Seen]] = {}
    for read in reads:
        if not read.error:
            out.setdefault(read.key, []).append(_seen(history.get(read.key, ()), read))
    return out


def reads_see_acknowledged_writes(history: Mapping[int, Sequence[WriteOp]], reads: Iterable[ReadOp]) -> Check:
    """Every answered lookup shows the write last acknowledged before it was sent, or a later one sent
    before it was answered; each violation names the key, the lookup's times and both values."""
    violations, checked = [], 0
    for key, seen in sorted(_answered(reads, history).items()):
        writes = history.get(key, ())
        for s in seen:
            checked += 1
            if s.candidates:
                continue
            read = s.read
            said = (f"key {key}: a lookup sent at {_at(read.t0)}, answered {read.t1 - read.t0:.3f}s later, read "
                    f"{_show(read.value)}")
            if s.first >= 0:
                acked = writes[s.first]
                said += (f"; the write of {_show(acked.value)} was acknowledged at {_at(acked.t1)}, "
                         f"{read.t0 - acked.t1:.3f}s before the lookup was sent")
            later = [_show(w.value) for w in writes[s.first + 1:] if w.t0 <= read.t1]
            if later:
                shown = ", ".join(later[:5]) + (f", … ({len(later)} in all)" if len(later) > 5 else "")
                said += f" (later writes sent before the answer: {shown})"
            if all(w.value != read.value for w in writes) and read.value is not None:
                said += f"; {read.value} was never written to key {key}"
            violations.append(said)
    return Check.of("lookups see every write acknowledged before they were sent", _capped(violations), checked)


def reads_in_order(history: Mapping[int, Sequence[WriteOp]], reads: Iterable[ReadOp]) -> Check:
    """A lookup sent after another lookup of its key was answered shows no earlier write than that one did.
    Lookups that show no state their writes allow are :func:`reads_see_acknowledged_writes`' to report."""
    violations, checked = [], 0
    for key, seen in sorted(_answered(reads, history).items()):
        writes = history.get(key, ())
        valid = [s for s in seen if s.candidates]
        checked += len(valid)
        by_answer = sorted(valid, key=lambda s: s.read.t1)
        floor: _Seen | None = None  # of the lookups answered so far, the one that saw the latest write
        i = 0
        for s in sorted(valid, key=lambda s: s.read.t0):
            while i < len(by_answer) and by_answer[i].read.t1 < s.read.t0:
                if floor is None or min(by_answer[i].candidates) > min(floor.candidates):
                    floor = by_answer[i]
                i += 1
            if floor is not None and max(s.candidates) < min(floor.candidates):
                before, read = floor.read, s.read
                violations.append(
                    f"key {key}: a lookup sent at {_at(read.t0)}, answered {read.t1 - read.t0:.3f}s later, read "
                    f"{_show(read.value)}, but one answered at {_at(before.t1)}, {read.t0 - before.t1:.3f}s before "
                    f"it was sent, read {_show(before.value)}, a later write"
                    + ("" if writes[min(floor.candidates)].acked else " (not acknowledged to its writer)"))
    return Check.of("a lookup sent after another was answered sees no earlier write", _capped(violations), checked)
