"""Where a new table's bucket replicas go: pure, no ZooKeeper.

Each bucket's leader is the live server with room that leads the fewest
buckets (then holds the fewest replicas, then the lowest id); its followers
are the other live servers with room that hold the fewest replicas. Counted
as the plan goes, so replicas and leaders both spread evenly over the live
servers, across tables too (the counts start from what the servers hold).
``capacity`` (server id -> the most replicas it holds, None: no limit)
counts every replica.
"""

from __future__ import annotations

from collections import Counter

from common import errors
from coordinator.assignment import UNASSIGNED, BucketAssignment, Capacity


def place(buckets: int, replication_factor: int, live: list[int], replicas_held: Counter[int],
          leaders_held: Counter[int], capacity: Capacity) -> dict[int, BucketAssignment]:
    """bucket -> its first state (leader epoch and bucket epoch 1; 0 while unassigned).

    A one-replica bucket no server has room for stays unassigned (it waits for a server: check
    :meth:`~coordinator.assignment.Assignments.room` first). A bucket of a replicated table that
    does not find ``replication_factor`` servers with room raises InvalidRequestError.
    """
    replicas_held, leaders_held = Counter(replicas_held), Counter(leaders_held)
    plan = {}
    for bucket in range(buckets):
        with_room = [s for s in sorted(set(live)) if capacity.get(s) is None or replicas_held[s] < capacity[s]]
        if len(with_room) < replication_factor:
            if replication_factor == 1:
                plan[bucket] = BucketAssignment(UNASSIGNED, 0)
                continue
            raise errors.InvalidRequestError(
                f"bucket {bucket} needs {replication_factor} tablet servers with room for a replica, "
                f"{len(with_room)} have room (their capacity tablet.buckets.max)")
        leader = min(with_room, key=lambda s: (leaders_held[s], replicas_held[s], s))
        followers = sorted((s for s in with_room if s != leader),
                           key=lambda s: (replicas_held[s], leaders_held[s], s))[:replication_factor - 1]
        replicas = (leader, *followers)
        for server in replicas:
            replicas_held[server] += 1
        leaders_held[leader] += 1
        plan[bucket] = BucketAssignment(leader, 1, replicas, replicas, 1)
    return plan
