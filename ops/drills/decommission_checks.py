"""Pure checkers of the decommission drill: every replica moved off one tablet server (a one-replica table's
too), a retried ``decommission_tablet`` started nothing more, and the server stayed decommissioned across
its restart until recommissioned.

No cluster, clock or I/O in here. A move is what
``AdminClient.decommission_tablet`` / ``list_reassignments`` answer: a dict
naming at least its bucket (and its table, by path or id, and partition when
it has them) or any other value, compared as it is. Where the buckets end up
is checked by :func:`kvlease.ops.drills.service_checks.isr_full` with the server
``away``.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

from kvlease.ops.check import Check


def move_key(move: Any) -> Hashable:
    """What a move is of: ``(table, partition, bucket)`` of a dict, else the value's repr."""
    if isinstance(move, dict):
        table = move.get("table", move.get("path", move.get("table_id")))
        return (str(table), str(move.get("partition")), move.get("bucket"))
    return repr(move)


def retry_started_nothing_new(first: Sequence[Any], retried: Sequence[Any]) -> Check:
    """A retried decommission (its answer lost) starts no move of a bucket the first call did not move."""
    known = {move_key(m) for m in first}
    violations = [f"the retried call started a move the first did not: {m!r}" for m in retried
                  if move_key(m) not in known]
    return Check.of("a retried decommission starts nothing new", violations, len(retried))


def moves_finished(started: Sequence[Any], in_progress: Sequence[Any], waited_s: float) -> Check:
    """Every move finished: ``in_progress`` is what ``list_reassignments`` still answered after waiting
    ``waited_s`` for the moves ``started``."""
    violations = [f"still in progress after {waited_s:.0f}s: {m!r}" for m in in_progress]
    return Check.of("every move of the decommission finished", violations, len(started) + len(in_progress))


def mark_kept(server: int, after_restart: Sequence[int], recommissioned: bool, after: Sequence[int]) -> Check:
    """The decommissioned ``server`` is still marked once restarted (``after_restart``: the ids marked then),
    and its recommission (``recommissioned``: what it answered) cleared the mark (``after``: the ids marked
    afterwards)."""
    violations = []
    if server not in after_restart:
        violations.append(f"tablet server {server}, restarted, is not decommissioned any more "
                          f"(decommissioned: {list(after_restart)})")
    if not recommissioned:
        violations.append(f"the recommission of tablet server {server} answered it was not decommissioned")
    if server in after:
        violations.append(f"tablet server {server} is still decommissioned after its recommission")
    return Check.of("the server stays decommissioned across its restart until recommissioned", violations, 3)


def one_replica_moved(state: Mapping[int, Any], away: int, held: Sequence[int], written: Mapping[int, Any],
                      found: Mapping[int, Any]) -> Check:
    """A one-replica table after tablet server ``away`` was decommissioned and stopped: ``state`` (bucket ->
    its ``replicas`` and ``leader_id``) has one replica per bucket, not ``away``, leading it; ``held``: its
    buckets that were on ``away`` (none: nothing of it was moved, which the drill must not let happen); every
    key ``written`` reads back (``found``) with its value."""
    violations = [] if held else [f"no bucket of the one-replica table was on tablet server {away}: none was moved"]
    for bucket, a in sorted(state.items()):
        replicas = list(a.replicas)
        if len(replicas) != 1 or away in replicas or a.leader_id not in replicas:
            violations.append(f"bucket {bucket}: replicas {replicas}, leader {a.leader_id} (want one replica, not "
                              f"tablet server {away}, leading it)")
    violations += [f"key {k}: wrote {v!r}, read {found.get(k)!r}" for k, v in sorted(written.items())
                   if found.get(k) != v]
    return Check.of(f"the one-replica table's buckets moved off tablet server {away}, every row read back",
                    violations, len(state) + len(written))
