"""Preferred leaders: which buckets a preferred-leader election gives back to their first replica, and which
replica lists a leader rebalance reorders so that preferred leaders spread. Pure: no ZooKeeper, no clock
(docs/architecture.md "Preferred leaders").

A bucket's **preferred leader** is its first replica (``replicas[0]``).
Placement spreads them (:mod:`kvlease.coordinator.placement_plan`) and they stay put:
a failover, a controlled shutdown or an operator's election moves only the
leadership, to another in-sync replica, so a server that returns leads
less than it is preferred for until leadership goes back to it. Giving it
back is a controlled change (the old leader is live): leader and bucket
epochs +1 in one fenced write, every replica told; a write in flight at the
old leader is answered ``NOT_LEADER`` and the client retries it on the new
one (idempotent: exactly once), so no caller sees an error.

- :func:`may_lead`: whether a replica may be made leader by such an
  election: live, in the ISR, not decommissioned, neither reported its data
  lost nor owes the bucket's latest restore (:mod:`kvlease.coordinator.data_loss_plan`);
  the bucket replicated, led, not being moved (a move hands leadership over
  itself, :mod:`kvlease.coordinator.reassignment_plan`) and no unclean leader waiting to
  report its log end.
- :func:`preferred_leader`: the bucket led by its preferred replica, if it
  may lead and does not already.
- :func:`imbalance`: per server, the replicated buckets it is preferred for
  and how many of those another server leads (or none).
- :func:`elections`: the preferred-leader elections of every bucket, or,
  with a threshold, only of the servers whose share of preferred buckets led
  by another exceeds it (Kafka's ``leader.imbalance.per.broker.percentage``;
  here ``leader.imbalance.per-server.percentage``).
- :func:`rejoined`: whether an ISR change brought the preferred replica back
  (the automatic election after a server returns).
- :func:`balance`: ``cluster rebalance``'s leader part. Replica lists are
  reordered (no data moves: the first replica changes to another in-sync
  one) until each table's preferred leaders differ by at most one between
  the live servers, then until the cluster's do, never widening a table's
  spread; then every bucket goes to its preferred leader where it may lead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from kvlease.coordinator import data_loss_plan
from kvlease.coordinator.assignment import Assignments, BucketAssignment

#: (table id, bucket)
Key = tuple[int, int]


def may_lead(a: BucketAssignment, server: int, live: Iterable[int], excluded: Iterable[int] = ()) -> bool:
    """Whether a controlled election may make ``server`` the leader of ``a`` (see the module docstring)."""
    return (a.reassign is None and not a.offline and a.replication_factor > 1 and server in a.isr
            and server in set(live) and server not in set(excluded) and server not in a.lost
            and server not in a.restore_owed_by and not data_loss_plan.pending_takeover(a))


def led_by(a: BucketAssignment, server: int) -> BucketAssignment:
    """``a`` with ``server`` leading it (leader and bucket epochs +1; ``a`` itself if it leads already)."""
    if a.leader == server:
        return a
    return replace(a, leader=server, leader_epoch=a.leader_epoch + 1, bucket_epoch=a.bucket_epoch + 1)


def preferred_leader(a: BucketAssignment, live: Iterable[int],
                     excluded: Iterable[int] = ()) -> BucketAssignment | None:
    """``a`` led by its preferred replica (``replicas[0]``) if another leads it and it :func:`may_lead`;
    None: nothing to change."""
    if not a.replicas or a.leader == a.replicas[0] or not may_lead(a, a.replicas[0], live, excluded):
        return None
    return led_by(a, a.replicas[0])


@dataclass(frozen=True)
class Imbalance:
    """One server's preferred leaderships: of the ``preferred`` replicated buckets (not being moved) whose first
    replica it is, ``not_led`` are led by another server or by none."""

    preferred: int
    not_led: int

    @property
    def percent(self) -> float:
        return 100.0 * self.not_led / self.preferred if self.preferred else 0.0


def imbalance(assignments: Assignments) -> dict[int, Imbalance]:
    """server -> its :class:`Imbalance`, for every server that is the preferred leader of a replicated bucket
    (from the counts ``assignments`` keeps: the periodic check walks no bucket while no server is over)."""
    return {s: Imbalance(n, not_led) for s, (n, not_led) in assignments.preferred_leaderships().items()}


def elections(assignments: Assignments, live: Iterable[int], excluded: Iterable[int] = (),
              threshold_pct: float | None = None) -> dict[Key, BucketAssignment]:
    """(table id, bucket) -> the bucket led by its preferred replica, for every bucket :func:`preferred_leader`
    changes; with ``threshold_pct``, only those whose preferred replica's :class:`Imbalance` exceeds it."""
    live, excluded = set(live), set(excluded)
    over = None
    if threshold_pct is not None:
        over = {s for s, i in imbalance(assignments).items() if i.percent > threshold_pct}
        if not over:
            return {}
    elected = {}
    for table_id, bucket, a in sorted(assignments.all(), key=lambda x: (x[0], x[1])):
        if over is not None and (not a.replicas or a.replicas[0] not in over):
            continue
        new = preferred_leader(a, live, excluded)
        if new is not None:
            elected[(table_id, bucket)] = new
    return elected


def rejoined(before: BucketAssignment | None, after: BucketAssignment) -> bool:
    """Whether the change ``before`` -> ``after`` brought the bucket's preferred replica back into its ISR while
    another leads it. Not a move's change (its new replicas joining, its completion): a move hands leadership
    over itself (coordinator/reassignment_plan.py), and the periodic check sees the rest."""
    if before is None or before.reassign is not None or after.reassign is not None or not after.replicas:
        return False
    first = after.replicas[0]
    return after.leader != first and first in after.isr and first not in before.isr


def balance(assignments: Assignments, live: Iterable[int], excluded: Iterable[int] = (),
            targets: Mapping[Key, tuple[int, ...]] | None = None) -> dict[Key, BucketAssignment]:
    """(table id, bucket) -> its state after ``cluster rebalance``'s leader part (see the module docstring):
    reordered replica lists, each led by its new first replica, and the preferred-leader elections of the
    others. ``targets``: the replica moves planned with it ((table id, bucket) -> target replicas): those
    buckets count with their target's first replica and are left alone."""
    spread = _Spread(assignments, set(live) - set(excluded), targets or {})
    spread.even_tables()
    spread.even_cluster()
    changed = {}
    for key, a in sorted(spread.states.items()):
        first = spread.first[key]
        if key in spread.fixed or first == a.replicas[0]:
            continue
        order = (first, *(r for r in a.replicas if r != first))
        changed[key] = replace(a, replicas=order, isr=tuple(r for r in order if r in a.isr), leader=first,
                               leader_epoch=a.leader_epoch + (a.leader != first), bucket_epoch=a.bucket_epoch + 1)
    live, excluded = set(live), set(excluded)
    for key, a in sorted(spread.states.items()):
        if key not in changed and key not in spread.fixed:
            elected = preferred_leader(a, live, excluded)
            if elected is not None:
                changed[key] = elected
    return changed


class _Spread:
    """The planning state of :func:`balance`'s reorders: every bucket's first replica as planned so far, and
    the counts of preferred leaderships per server, of the cluster and of each table."""

    def __init__(self, assignments: Assignments, servers: set[int], targets: Mapping[Key, tuple[int, ...]]) -> None:
        self.servers = servers
        self.states = {(t, b): a for t, b, a in assignments.all() if a.replicas}
        self.first = {key: (targets.get(key) or a.reassign or a.replicas)[0] for key, a in self.states.items()}
        self.fixed = {key for key, a in self.states.items() if key in targets or a.reassign is not None}
        self.cluster: Counter[int] = Counter(self.first.values())
        self.tables: dict[int, Counter[int]] = {}
        for (t, _b), first in self.first.items():
            self.tables.setdefault(t, Counter())[first] += 1

    def _choices(self, key: Key) -> list[int]:
        """The servers the bucket's first replica may move to: another in-sync replica that may lead it, the
        current first one live and not decommissioned (one that is down keeps its place: it returns)."""
        a = self.states[key]
        first = self.first[key]
        if key in self.fixed or first not in self.servers:
            return []
        return [r for r in a.replicas if r != first and r in self.servers and may_lead(a, r, self.servers)]

    def _move(self, key: Key, to: int) -> None:
        t = key[0]
        old = self.first[key]
        self.first[key] = to
        for counts in (self.cluster, self.tables[t]):
            counts[old] -= 1
            counts[to] += 1

    def even_tables(self) -> None:
        """Within each table: move a first replica from the server preferred for the most of its buckets to
        one preferred for at least two fewer, while one can (the cluster's counts break ties)."""
        for t in sorted(self.tables):
            keys = sorted(k for k in self.first if k[0] == t)
            counts = self.tables[t]
            while True:
                best = None
                for key in keys:
                    hi = self.first[key]
                    for lo in self._choices(key):
                        gap = counts[hi] - counts[lo]
                        rank = (gap, self.cluster[hi] - self.cluster[lo])
                        if gap > 1 and (best is None or rank > best[0]):
                            best = (rank, key, lo)
                if best is None:
                    break
                self._move(best[1], best[2])

    def even_cluster(self) -> None:
        """Over the cluster: move a first replica from a server preferred for at least two more buckets than
        another to it, only where its table is left no less even (the table's count of the one losing it is
        above that of the one taking it), while one can; the most loaded server first."""
        by_first: dict[int, list[Key]] = {}
        for key in sorted(self.first):
            by_first.setdefault(self.first[key], []).append(key)
        while True:
            fewest = min((self.cluster[s] for s in self.servers), default=0)
            best = None
            for hi in sorted(self.servers, key=lambda s: (-self.cluster[s], s)):
                if self.cluster[hi] - fewest <= 1:
                    break
                for key in by_first.get(hi, ()):
                    if self.first[key] != hi:
                        continue  # moved on already
                    table = self.tables[key[0]]
                    for lo in self._choices(key):
                        gap = self.cluster[hi] - self.cluster[lo]
                        if gap > 1 and table[hi] > table[lo] and (best is None or gap > best[0]):
                            best = (gap, key, lo)
                if best is not None:
                    break
            if best is None:
                return
            _gap, key, lo = best
            self._move(key, lo)
            by_first.setdefault(lo, []).append(key)
