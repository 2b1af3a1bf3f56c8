"""Where a new table's bucket replicas go, and which replica is each bucket's preferred leader: pure, no ZooKeeper.

What it balances, in this order, counted as the plan goes and starting
from what the servers hold already (so across tables too):

1. **Replicas.** Bucket ``b`` takes the ``rf`` live servers with room
   (``capacity``: server id -> the most replicas it holds, None: no limit;
   every replica counts) that hold the fewest replicas.
2. **Preferred leaders** (the first replica: the one that leads the bucket
   whenever it is live and in sync, :mod:`kvlease.coordinator.leader_balance_plan`). Of
   the ``rf`` chosen, the first replica is, in order of the keys:

   - one still within this table's even share (each live server is the
     preferred leader of ``buckets // servers`` of the table's buckets, or one
     more for ``buckets % servers`` of them), so a table's preferred leaders
     differ by at most one per server where the replicas allow it;
   - the one that is the preferred leader of the fewest buckets of the whole
     cluster: every existing bucket's first replica (of a move in progress,
     its target's), whether or not it leads now. A server restarted after a
     failover leads nothing until its preferred-leader election gives its
     buckets back, yet it is as loaded as before: counting current leaders
     put most new preferred leaders on it (issue 39, 13/5/6 after a few
     rounds);
   - the one leading the fewest buckets now (its load until the elections);
   - the ring below.

   The others follow in the order of step 1.
3. **Ties** go to the servers nearest slot ``b * rf`` of a ring of the live
   servers ordered least loaded first (replicas held, then preferred leader
   of, then leading, then id), which lays the replicas out around the ring on
   servers that hold the same (one replica and one preferred leader per
   server and bucket).
"""

from __future__ import annotations

from collections import Counter

from kvlease.common import errors
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment, Capacity


def plan_new(assignments: Assignments, buckets: int, live: list[int], capacity: Capacity | None = None,
             replication_factor: int = 1) -> dict[int, BucketAssignment]:
    """A new table's buckets placed on the live servers, counting what they hold already (:func:`place`)."""
    return place(buckets, replication_factor, live, assignments.load_per_server(),
                 assignments.preferred_per_server(), capacity or {}, assignments.leaders_per_server())


def place(buckets: int, replication_factor: int, live: list[int], replicas_held: Counter[int],
          preferred_held: Counter[int], capacity: Capacity,
          leading: Counter[int] | None = None) -> dict[int, BucketAssignment]:
    """bucket -> its first state (leader epoch and bucket epoch 1; 0 while unassigned).

    ``preferred_held``: buckets each server is the preferred leader of; ``leading``: buckets each leads now
    (None: as ``preferred_held``). A one-replica bucket no server has room for stays unassigned (it waits for
    a server: check :meth:`~kvlease.coordinator.assignment.Assignments.room` first). A bucket of a replicated table
    that does not find ``replication_factor`` servers with room raises InvalidRequestError.
    """
    replicas_held, preferred_held = Counter(replicas_held), Counter(preferred_held)
    leading = Counter(preferred_held if leading is None else leading)
    order = sorted(set(live), key=lambda s: (replicas_held[s], preferred_held[s], leading[s], s))  # least loaded first
    position = {server: i for i, server in enumerate(order)}
    share = _Share(buckets, order)
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
        leader = min(chosen, key=lambda s: (not share.may_take(s), preferred_held[s], share.taken[s], leading[s],
                                            turn(s)))
        replicas = (leader, *(s for s in chosen if s != leader))
        for server in replicas:
            replicas_held[server] += 1
        preferred_held[leader] += 1
        leading[leader] += 1
        share.take(leader)
        plan[bucket] = BucketAssignment(replicas[0], 1, replicas, replicas, 1)
    return plan


class _Share:
    """One table's even share of preferred leaders over ``servers``: each takes ``buckets // len(servers)``,
    ``buckets % len(servers)`` of them one more."""

    def __init__(self, buckets: int, servers: list[int]) -> None:
        self.floor, self.extra = divmod(buckets, max(1, len(servers)))
        self.taken: Counter[int] = Counter()
        self.above = 0  # servers that took one more than the floor

    def may_take(self, server: int) -> bool:
        taken = self.taken[server]
        return taken < self.floor or (taken == self.floor and self.above < self.extra)

    def take(self, server: int) -> None:
        self.taken[server] += 1
        if self.taken[server] == self.floor + 1:
            self.above += 1
