"""Moving a bucket's replicas to other tablet servers: pure planning, no ZooKeeper
(docs/architecture.md, "Losing and moving replicas").

Kafka's reassignment, in two phases. Its state is in the bucket's assignment
(``reassign``: the target replicas, :class:`~kvlease.coordinator.assignment.BucketAssignment`),
written fenced like every change, so a coordinator that takes over resumes a
move where the last one left it.

1. :func:`start`: replicas := the target, then the old replicas not in it.
   The new ones are told as followers: they fetch from the leader (or rebuild
   from the bucket's remote snapshot) and the leader's AlterIsr adds them to
   the ISR once they caught up. Leader and ISR stay.
2. :func:`progress`, once every target replica is in the ISR and the bucket
   has a leader: replicas := the target, ISR := ISR ∩ target; a leader not in
   the target hands over to the first target replica in the ISR. The removed
   replicas are told so (they delete their copy of the bucket).

Both phases change the replica set under the leader, so both bump the leader
epoch (as Kafka's reassignment does): the leader starts a new leadership that
knows the new replicas, its followers fence anything older. The bucket epoch
goes +1 on every change as always.

A bucket of a one-replica table moves the same way: during phase 1 it has
two replicas (the new one, then the old leader) and is replicated on both
tablet servers (``tablet/replicas/manager.py`` opens a replica again when its mode
changes), so the new replica copies it like any follower; phase 2 leaves the
new one as its only replica and leader. Its only replica must be live to
start (no replica could copy it otherwise). Moving a bucket whose
move is in progress to another target is refused (wait for it to complete,
then move again); the same target again answers the move in progress
(a resent request).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from kvlease.common import errors
from kvlease.coordinator import data_loss_plan
from kvlease.coordinator.assignment import Assignments, BucketAssignment, Changes


def check_target(where: str, replication_factor: int, target: Sequence[int], live: Iterable[int],
                 current: Iterable[int] = ()) -> tuple[int, ...]:
    """``target`` as a tuple, if it can be a bucket's replicas: InvalidRequestError (one line naming ``where``)
    for an empty list, a server twice, a count other than the table's replication factor, a new replica
    (not one of ``current``) that is not a live tablet server, or a bucket whose replicas (``current``) are all
    down (none could copy it). A current replica that is down may stay (the move completes once it is back in
    the ISR)."""
    target = tuple(int(r) for r in target)
    live = set(live)
    current = tuple(current)
    if current and not set(current) & live and set(target) != set(current):
        raise errors.InvalidRequestError(
            f"cannot move {where}: none of its replicas {list(current)} is live, so no replica can copy it "
            f"(live: {sorted(live) or 'none'}); bring one of them back first")
    if not target:
        raise errors.InvalidRequestError(f"cannot move {where}: the new replica list is empty")
    twice = sorted({r for r in target if target.count(r) > 1})
    if twice:
        raise errors.InvalidRequestError(f"cannot move {where}: tablet server(s) {twice} named more than once in "
                                         f"{list(target)}")
    if len(target) != replication_factor:
        raise errors.InvalidRequestError(
            f"cannot move {where}: {len(target)} replica(s) {list(target)} given, its table has replication factor "
            f"{replication_factor} (name exactly {replication_factor} tablet servers)")
    not_live = sorted(set(target) - live - set(current))
    if not_live:
        raise errors.InvalidRequestError(
            f"cannot move {where}: tablet server(s) {not_live} are not live (live: {sorted(live) or 'none'})")
    return target


def start(a: BucketAssignment, target: Sequence[int], where: str = "the bucket") -> BucketAssignment:
    """``a`` once a move to ``target`` (checked by :func:`check_target`) started, or ``a`` itself when there
    is nothing to do (``target`` is its replicas, or the move to it is in progress already). A target holding
    exactly its replicas in another order only reorders them (the preferred leader changes; no move).
    InvalidRequestError if another move of the bucket is in progress or the bucket has no leader."""
    target = tuple(target)
    if a.reassign is not None:
        if a.reassign == target:
            return a  # resent: the move in progress
        raise errors.InvalidRequestError(
            f"cannot move {where} to {list(target)}: its move to {list(a.reassign)} is in progress (ISR "
            f"{list(a.isr)}); wait until it completes, then move it again")
    if target == a.replicas:
        return a
    if set(target) == set(a.replicas):
        return replace(a, replicas=target, isr=tuple(r for r in target if r in a.isr), bucket_epoch=a.bucket_epoch + 1)
    if a.offline:
        raise errors.InvalidRequestError(
            f"cannot move {where}: it has no leader (no live in-sync replica among {list(a.replicas)}), so no "
            f"replica can copy it; bring one of its replicas back first")
    replicas = target + tuple(r for r in a.replicas if r not in target)
    return replace(a, replicas=replicas, leader_epoch=a.leader_epoch + 1, bucket_epoch=a.bucket_epoch + 1,
                   reassign=target)


def progress(a: BucketAssignment, live: set[int]) -> BucketAssignment | None:
    """``a`` with its move completed, if it can complete now (every target replica in the ISR, a live target
    replica to lead, no unclean takeover waiting for its leader's log end); None: nothing to do yet (or no
    move). The bucket's accepted losses stay with it (a restore still owed by its new leader is carried
    out, readers and snapshot commits are fenced by them). An unclean leader reports its log end at the
    loss's leader epoch: completing the move before would bump that epoch and leave the loss unresolved."""
    target = a.reassign
    if target is None or a.offline or not set(target) <= set(a.isr) or data_loss_plan.pending_takeover(a):
        return None
    leader = a.leader if a.leader in target else next((r for r in target if r in live), None)
    if leader is None:
        return None
    return replace(a, leader=leader, leader_epoch=a.leader_epoch + 1, replicas=target,
                   isr=tuple(r for r in target if r in a.isr), bucket_epoch=a.bucket_epoch + 1, reassign=None)


def progress_all(assignments: Assignments, live: set[int], table_ids: Iterable[int] | None = None) -> Changes:
    """Every table (of ``table_ids``; None: all) with a move that can complete now, all its buckets."""
    changes: Changes = {}
    tables = sorted(assignments.by_table) if table_ids is None else sorted(set(table_ids))
    for table_id in tables:
        buckets = assignments.table(table_id)
        for bucket, a in sorted(buckets.items()):
            done = progress(a, live)
            if done is not None:
                changes.setdefault(table_id, dict(buckets))[bucket] = done
    return changes


def removed_replicas(old: BucketAssignment | None, new: BucketAssignment) -> set[int]:
    """The servers a change took the bucket off (a completed move): they delete their copy."""
    if old is None or new.reassign is not None:
        return set()
    return set(old.replicas) - set(new.replicas) - {new.leader}


def move_state(a: BucketAssignment) -> dict:
    """What a client is told of a bucket's move: ``state`` ``moving`` (``target``; ``waiting``: target replicas
    not in the ISR yet; ``removing``: replicas the move takes the bucket off) or ``done`` (no move in progress:
    ``target`` is its replicas)."""
    target = a.replicas if a.reassign is None else a.reassign
    return {"replicas": list(a.replicas), "target": list(target), "isr": list(a.isr), "leader": a.leader,
            "state": "done" if a.reassign is None else "moving",
            "waiting": [r for r in target if r not in a.isr],
            "removing": [r for r in a.replicas if r not in target]}
