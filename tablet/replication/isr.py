"""The leader's view of its followers: the high watermark, ISR changes, and writes waiting to be committed.

One :class:`LeaderView` lives for one leadership of one bucket (a new leader
epoch starts a new one). Offsets are log ends: a follower that fetches at
offset X has every record below X, and its log end is X.

- **High watermark** (:meth:`LeaderView.high_watermark`): the lowest log end
  over the ISR, the leader's own included; it never moves backwards. A
  follower whose log end is not known yet (it has not fetched in this
  leadership) holds it where it is, so a new leader starts from the HW it
  knew as a follower. While an ISR change is in flight (:meth:`LeaderView.propose_isr`)
  the HW is taken over the current ISR *and* the proposed one (Kafka's
  "maximal ISR", KIP-497): a follower about to join cannot be left below a
  HW that advanced while the coordinator decided.
- **Caught up** (Kafka's rule): a fetch at the leader's log end (as of that
  fetch) makes the follower caught up now; a fetch that reaches the leader's
  log end as of the follower's *previous* fetch makes it caught up as of that
  previous fetch. So a follower that keeps pace under steady writes stays
  caught up although it never quite reaches the end.
- **Shrink** (:meth:`LeaderView.shrink_candidates`): ISR followers not caught
  up for more than ``max_lag_ms`` (and not at the leader's log end).
  **Expand** (:meth:`LeaderView.expand_candidates`): other replicas whose log
  end reached the HW and the start of the current leader epoch.
- A write is refused with NOT_ENOUGH_REPLICAS before its append when the
  ISR is smaller than ``min.insync-replicas`` (:func:`can_write`); it is
  committed, and acknowledged, once the HW reached its end offset
  (:meth:`LeaderView.committed`; :class:`PendingAcks` releases the waiting
  writes in order).

Input a correct shell never gives (a fetch from a non-replica, a fetch past
the leader's log end — a follower that must truncate first — or a leader log
end that shrinks) raises ValueError and changes nothing.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Collection, Generic, TypeVar

T = TypeVar("T")


def can_write(isr: Collection[int], min_insync: int) -> bool:
    """Whether a write may be appended: the ISR has at least ``min_insync`` members (else NOT_ENOUGH_REPLICAS)."""
    return len(isr) >= min_insync


@dataclass
class FollowerState:
    """What the leader knows of one follower in this leadership."""

    log_end: int | None = None  # None: has not fetched yet
    last_caught_up_ms: int = 0
    last_fetch_ms: int | None = None
    last_fetch_leader_end: int | None = None  # the leader's log end as of the follower's last fetch


class LeaderView:
    """One leadership's view of the followers; see the module docstring."""

    def __init__(self, leader: int, replicas: Collection[int], isr: Collection[int], *, leader_log_end: int,
                 high_watermark: int, epoch_start_offset: int, now_ms: int) -> None:
        """``high_watermark``: the HW this replica knew before it led; ``epoch_start_offset``: the leader's
        log end when this leader epoch began. ISR followers count as caught up at ``now_ms``."""
        self.leader = leader
        self.replicas = frozenset(replicas)
        if leader not in self.replicas or len(self.replicas) != len(replicas):
            raise ValueError(f"replicas {sorted(replicas)} must be distinct and hold the leader {leader}")
        if not 0 <= high_watermark <= leader_log_end or not 0 <= epoch_start_offset <= leader_log_end:
            raise ValueError(f"high watermark {high_watermark} and epoch start {epoch_start_offset} must be "
                             f"between 0 and the log end {leader_log_end}")
        self._isr = self._checked_isr(isr)
        self._proposed: frozenset[int] | None = None
        self._leader_end = leader_log_end
        self._hw = high_watermark
        self.epoch_start_offset = epoch_start_offset
        self._followers = {r: FollowerState(last_caught_up_ms=now_ms) for r in self.replicas - {leader}}

    # -- reading ------------------------------------------------------------

    def high_watermark(self) -> int:
        return self._hw

    @property
    def leader_log_end(self) -> int:
        return self._leader_end

    @property
    def isr(self) -> frozenset[int]:
        """The ISR as the coordinator last accepted it."""
        return self._isr

    @property
    def proposed_isr(self) -> frozenset[int] | None:
        """The ISR of the change in flight, if any."""
        return self._proposed

    def follower(self, replica: int) -> FollowerState:
        return self._followers[replica]

    def committed(self, end_offset: int) -> bool:
        """Whether a write whose records end at ``end_offset`` (its last offset + 1) is on every ISR member."""
        return self._hw >= end_offset

    # -- events -------------------------------------------------------------

    def on_append(self, leader_log_end: int) -> bool:
        """The leader appended; its log now ends at ``leader_log_end``. Whether the HW advanced."""
        self._check_leader_end(leader_log_end)
        self._leader_end = leader_log_end
        return self._advance()

    def on_fetch(self, follower: int, fetch_offset: int, now_ms: int, leader_log_end: int) -> bool:
        """``follower`` fetched from ``fetch_offset`` at ``now_ms`` while the leader's log ended at
        ``leader_log_end``. Whether the HW advanced."""
        state = self._followers.get(follower)
        if state is None:
            raise ValueError(f"replica {follower} is not a follower of this bucket (replicas {sorted(self.replicas)})")
        self._check_leader_end(leader_log_end)
        if not 0 <= fetch_offset <= leader_log_end:
            raise ValueError(f"follower {follower} fetches at {fetch_offset}, beyond the leader's log end "
                             f"{leader_log_end}: it must truncate first")
        if fetch_offset >= leader_log_end:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif (state.last_fetch_leader_end is not None and state.last_fetch_ms is not None
              and fetch_offset >= state.last_fetch_leader_end):
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.log_end = fetch_offset
        state.last_fetch_ms, state.last_fetch_leader_end = now_ms, leader_log_end
        self._leader_end = leader_log_end
        return self._advance()

    def propose_isr(self, isr: Collection[int]) -> None:
        """An ISR change was sent to the coordinator (one at a time): until it answers, the HW waits for
        the members of both the current and the proposed ISR."""
        if self._proposed is not None:
            raise ValueError(f"an ISR change to {sorted(self._proposed)} is already in flight")
        self._proposed = self._checked_isr(isr)

    def set_isr(self, isr: Collection[int]) -> bool:
        """The coordinator's ISR (accepted change, or the state it holds): clears the change in flight.
        Whether the HW advanced (a slow member left). A member that left has its log end forgotten: the
        coordinator takes a server that died out of the ISR, and the log end it fetched at before is no
        proof of what its next incarnation holds (a wiped data dir holds nothing)."""
        members = self._checked_isr(isr)
        for gone in self._isr - members:  # its log end is forgotten: only a fetch from now on brings it back
            self._followers[gone] = FollowerState(last_caught_up_ms=self._followers[gone].last_caught_up_ms)
        self._isr = members
        self._proposed = None
        return self._advance()

    def forget(self, followers: Collection[int]) -> None:
        """What ``followers`` (not in the ISR) fetched is forgotten, as for a member that left it."""
        for r in set(followers) & (set(self._followers) - self._isr):
            self._followers[r] = FollowerState(last_caught_up_ms=self._followers[r].last_caught_up_ms)

    def isr_change_failed(self) -> bool:
        """The change in flight was refused or failed: the ISR stays. Whether the HW advanced."""
        self._proposed = None
        return self._advance()

    # -- decisions ------------------------------------------------------------

    def shrink_candidates(self, now_ms: int, max_lag_ms: int) -> frozenset[int]:
        """ISR followers not caught up for more than ``max_lag_ms`` (and not at the leader's log end)."""
        return frozenset(r for r in self._isr - {self.leader}
                         if self._followers[r].log_end != self._leader_end
                         and now_ms - self._followers[r].last_caught_up_ms > max_lag_ms)

    def expand_candidates(self) -> frozenset[int]:
        """Replicas outside the ISR whose log end reached the HW and the start of this leader epoch."""
        return frozenset(r for r in self._followers if self.can_join(r))

    def can_join(self, replica: int) -> bool:
        """Whether ``replica`` is one of :meth:`expand_candidates`."""
        s = self._followers.get(replica)
        return (s is not None and replica not in self._isr and s.log_end is not None
                and s.log_end >= self._hw and s.log_end >= self.epoch_start_offset)

    # -- inside ---------------------------------------------------------------

    def _checked_isr(self, isr: Collection[int]) -> frozenset[int]:
        members = frozenset(isr)
        if self.leader not in members or not members <= self.replicas:
            raise ValueError(f"ISR {sorted(members)} must hold the leader {self.leader} and only replicas "
                             f"{sorted(self.replicas)}")
        return members

    def _check_leader_end(self, leader_log_end: int) -> None:
        if leader_log_end < self._leader_end:
            raise ValueError(f"the leader's log end went back from {self._leader_end} to {leader_log_end}")

    def _advance(self) -> bool:
        members = self._isr | (self._proposed or frozenset())
        ends = [self._leader_end if r == self.leader else self._followers[r].log_end for r in members]
        if any(end is None for end in ends):
            return False
        low = min(end for end in ends if end is not None)
        if low <= self._hw:
            return False
        self._hw = low
        return True


class PendingAcks(Generic[T]):
    """Writes waiting for the HW, keyed by their end offset (last offset + 1), released in offset order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._order = itertools.count()
        self._hw = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, end_offset: int, token: T) -> bool:
        """Wait for the HW to reach ``end_offset``; True (and nothing kept) if it already has."""
        if end_offset <= self._hw:
            return True
        heapq.heappush(self._heap, (end_offset, next(self._order), token))
        return False

    def advance(self, high_watermark: int) -> list[T]:
        """The HW is now ``high_watermark`` (a lower one is ignored): the writes it commits, in offset order."""
        self._hw = max(self._hw, high_watermark)
        released = []
        while self._heap and self._heap[0][0] <= self._hw:
            released.append(heapq.heappop(self._heap)[2])
        return released

    def discard(self, token: T) -> bool:
        """Stop waiting for ``token`` (its request timed out); whether it was waiting."""
        kept = [item for item in self._heap if item[2] is not token]
        if len(kept) == len(self._heap):
            return False
        heapq.heapify(kept)
        self._heap = kept
        return True

    def fail_all(self) -> list[T]:
        """The leadership ended: every waiting write, in offset order (their outcome is unknown to the writer)."""
        released = [item[2] for item in sorted(self._heap)]
        self._heap.clear()
        return released
