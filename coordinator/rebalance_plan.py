"""Which moves empty a tablet server or even out the cluster: pure planning, no ZooKeeper.

The moves themselves are :mod:`kvlease.coordinator.reassignment_plan`'s; this module only
chooses their targets.

- :func:`decommission`: every bucket replica on a server goes to a live
  server that does not hold the bucket, has room (``tablet.buckets.max``) and
  holds the fewest replicas (then leads the fewest, then the lowest id); the
  replaced server's place in the replica list is taken by the new one, so the
  preferred leaders stay spread. A bucket whose move is in progress away from
  the server is left as it is (a resent decommission starts nothing new).
- :func:`rebalance`: replicas on a decommissioned server go to the least
  loaded others (where one has room); then replicas go from the servers
  holding the most to those holding the fewest until they differ by at most
  one (e.g. after servers joined); then the leaders
  (:func:`kvlease.coordinator.leader_balance_plan.balance`): replica lists are reordered
  so that preferred leaders (``replicas[0]``) spread evenly, per table and
  over the cluster, and every leader that is not its bucket's preferred one
  goes back to it when that replica is live, in the ISR and not
  decommissioned (a restarted server leads its buckets again). With
  ``leaders_only`` (``cluster rebalance --leaders``) only the leaders: no
  replica moves.

Buckets of one-replica tables are planned like the others (they move through
a second replica, :mod:`kvlease.coordinator.reassignment_plan`); their only replica leads them.
Decommissioned servers (``excluded``, :mod:`kvlease.coordinator.decommissioned`) are never a destination.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from kvlease.common import errors
from kvlease.coordinator.assignment import Assignments, BucketAssignment, Capacity
from kvlease.coordinator.leader_balance_plan import balance, preferred_leader

__all__ = ["Move", "Plan", "decommission", "preferred_leader", "rebalance"]

#: A planned move: (table id, bucket, target replicas).
Move = tuple[int, int, tuple[int, ...]]


@dataclass(frozen=True)
class Plan:
    moves: list[Move]
    #: (table id, bucket) -> its state after its leader's change: a preferred-leader election, or its replicas
    #: reordered (a new preferred leader, leading it)
    leaders: dict[tuple[int, int], BucketAssignment]


def _target_load(assignments: Assignments) -> Counter[int]:
    """Replicas per server once the moves in progress complete."""
    return Counter(r for _t, _b, a in assignments.all() for r in (a.reassign or a.replicas))


def decommission(assignments: Assignments, server: int, live: set[int], capacity: Capacity,
                 name: Callable[[int], str] = str, excluded: set[int] = frozenset(),
                 restore_args: Callable[[int], str] = str) -> list[Move]:
    """The moves that take every replica off ``server``. InvalidRequestError (nothing planned) if a bucket it
    holds cannot move: none of its replicas is live (a one-replica bucket on a stopped ``server``), another
    move of it includes ``server``, or no other live server with room (and not ``excluded``: decommissioned)
    can take it. ``name(table_id)`` names a table (or partition) in errors, ``restore_args(table_id)`` in the
    ``kvlease bucket restore`` command an error suggests."""
    load, preferred = _target_load(assignments), assignments.preferred_per_server()
    others = sorted(live - {server} - set(excluded))
    retired = sorted((live & set(excluded)) - {server})
    moves: list[Move] = []
    for table_id, bucket, a in sorted(assignments.all(), key=lambda x: (x[0], x[1])):
        holds = a.reassign if a.reassign is not None else a.replicas
        if server not in holds:
            continue
        where = f"bucket {bucket} of {name(table_id)}"
        if a.reassign is not None:
            raise errors.InvalidRequestError(
                f"cannot decommission tablet server {server}: {where} is being moved to {list(a.reassign)}, which "
                f"holds it; wait until that move completes, then decommission again")
        if not set(a.replicas) & live:
            raise errors.InvalidRequestError(
                f"cannot decommission tablet server {server}: none of the replicas {list(a.replicas)} of {where} is "
                f"live, so no replica can copy it; start tablet server {server} again first, or, if it is gone for "
                f"good, `kvlease bucket restore {restore_args(table_id)} --bucket {bucket} --accept-data-loss "
                f"--tablet N` "
                "brings its latest snapshot back on live tablet server N (losing the changes after it)")
        free = [s for s in others if s not in a.replicas and (capacity.get(s) is None or load[s] < capacity[s])]
        if not free:
            raise errors.InvalidRequestError(
                f"cannot decommission tablet server {server}: {where} needs {len(a.replicas)} replicas on distinct "
                f"live tablet servers and no other live server with room can take it (live: {sorted(live)}"
                + (f", decommissioned: {retired}" if retired else "")
                + "; their capacity tablet.buckets.max); start another tablet server first")
        chosen = min(free, key=lambda s: (load[s], preferred[s], s))
        target = tuple(chosen if r == server else r for r in a.replicas)
        load[chosen] += 1
        load[server] -= 1
        if a.replicas[0] == server:
            preferred[server] -= 1
            preferred[chosen] += 1
        moves.append((table_id, bucket, target))
    return moves


def rebalance(assignments: Assignments, live: set[int], capacity: Capacity, max_moves: int = 1000,
              excluded: set[int] = frozenset(), leaders_only: bool = False) -> Plan:
    """Replica moves off the ``excluded`` (decommissioned) servers (:func:`_drain`), then those that even out
    the other live servers' replica counts (to a difference of at most one), then the leaders of the buckets
    not moved (:func:`~kvlease.coordinator.leader_balance_plan.balance`: preferred leaders spread, never to an excluded
    server, and elected). ``leaders_only``: no replica moves. Offline buckets and those being moved are left
    alone."""
    if leaders_only:
        return Plan([], balance(assignments, live, excluded))
    load = _target_load(assignments)
    servers = sorted(live - set(excluded))
    movable = sorted((t, b, a) for t, b, a in assignments.all()
                     if a.reassign is None and not a.offline)
    moves = _drain(movable, set(excluded), servers, load, capacity, max_moves)
    moved = {(t, b) for t, b, _target in moves}
    while servers and len(moves) < max_moves:
        def room(s: int) -> bool:
            return capacity.get(s) is None or load[s] < capacity[s]
        most = max(servers, key=lambda s: (load[s], -s))
        fewest = [s for s in sorted(servers, key=lambda s: (load[s], s)) if room(s) and load[most] - load[s] > 1]
        found = None
        for dst in fewest:
            found = next(((t, b, a) for t, b, a in movable
                          if (t, b) not in moved and most in a.replicas and dst not in a.replicas), None)
            if found is not None:
                break
        if found is None:
            break
        table_id, bucket, a = found
        moves.append((table_id, bucket, tuple(dst if r == most else r for r in a.replicas)))
        moved.add((table_id, bucket))
        load[most] -= 1
        load[dst] += 1
    targets = {(t, b): target for t, b, target in moves}
    return Plan(moves, balance(assignments, live, excluded, targets))


def _drain(movable: list[tuple[int, int, BucketAssignment]], excluded: set[int], servers: list[int],
           load: Counter[int], capacity: Capacity, max_moves: int) -> list[Move]:
    """Moves of the ``movable`` buckets' replicas on ``excluded`` servers, each to the server of ``servers``
    with room that holds the fewest replicas and not the bucket (``load`` counted as they go); a replica no
    server can take stays."""
    moves: list[Move] = []
    for table_id, bucket, a in movable:
        if len(moves) >= max_moves:
            break
        target = list(a.replicas)
        for leaving in (r for r in a.replicas if r in excluded):
            free = [s for s in servers if s not in target and (capacity.get(s) is None or load[s] < capacity[s])]
            if not free:
                break
            chosen = min(free, key=lambda s: (load[s], s))
            target[target.index(leaving)] = chosen
            load[chosen] += 1
            load[leaving] -= 1
        if tuple(target) != a.replicas:
            moves.append((table_id, bucket, tuple(target)))
    return moves
