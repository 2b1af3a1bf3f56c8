"""Where a new table's bucket replicas go: pure, no ZooKeeper.

The live servers are ordered least loaded first (replicas held, then buckets
led, then id) and seen as a ring. Bucket ``b`` takes the ``rf`` servers with
room holding the fewest replicas, ties going to those nearest slot ``b * rf``
of the ring on; of those, the one leading the fewest buckets leads it (ties
the same way). On servers holding the same, that lays the replicas out around
the ring (even to one replica and one leader per server); what servers held
before is evened out first. Counted
as the plan goes, so replicas and leaders both spread evenly over the live
servers, across tables too (the counts start from what the servers hold).
``capacity`` (server id -> the most replicas it holds, None: no limit)
counts every replica.
"""

from __future__ import annotations

from collections import Counter

from common import errors
from coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment, Capacity


def plan_new(assignments: Assignments, buckets: int, live: list[int], capacity: Capacity | None = None,
             replication_factor: int = 1) -> dict[int, BucketAssignment]:
    """A new table's buckets placed on the live servers, counting what they hold already (:func:`place`)."""
    return place(buckets, replication_factor, live, assignments.load_per_server(), assignments.leaders_per_server(),
                 capacity or {})


def place(buckets: int, replication_factor: int, live: list[int], replicas_held: Counter[int],
          leaders_held: Counter[int], capacity: Capacity) -> dict[int, BucketAssignment]:
    """bucket -> its first state (leader epoch and bucket epoch 1; 0 while unassigned).

    A one-replica bucket no server has room for stays unassigned (it waits for a server: check
    :meth:`~coordinator.assignment.Assignments.room` first). A bucket of a replicated table that
    does not find ``replication_factor`` servers with room raises InvalidRequestError.
    """
    replicas_held, leaders_held = Counter(replicas_held), Counter(leaders_held)
    order = sorted(set(live), key=lambda s: (replicas_held[s], leaders_held[s], s))  # the least loaded first
    position = {server: i for i, server in enumerate(order)}
    plan = {}
    for bucket in range(buckets):
        with_room = {s for s in order if capacity.get(s) is None or replicas_held[s] < capacity[s]}
        if len(with_room) < replication_factor:
            if replication_factor == 1:
                plan[bucket] = BucketAssignment(UNASSIGNED, 0)
                continue
            raise errors.InvalidRequestError(
                f"bucket {bucket} needs {replication_factor} tablet servers with room for a replica, "
                f"{len(with_room)} have room (their capacity tablet.buckets.max)")
        slot = bucket * replication_factor % len(order)
        def turn(server: int) -> int:  # how far the server is from this bucket's slot on the ring
            return (position[server] - slot) % len(order)
        chosen = sorted(with_room, key=lambda s: (replicas_held[s], turn(s)))[:replication_factor]
        leader = min(chosen, key=lambda s: (leaders_held[s], turn(s)))
        replicas = (leader, *(s for s in chosen if s != leader))
        for server in replicas:
            replicas_held[server] += 1
        leaders_held[replicas[0]] += 1
        plan[bucket] = BucketAssignment(replicas[0], 1, replicas, replicas, 1)
    return plan

