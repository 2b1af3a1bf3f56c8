"""Pure checkers of the decommission drill: every replica moved off one tablet server, a retried
``decommission_tablet`` started nothing more, and the server stayed decommissioned across its restart
until recommissioned.

No cluster, clock or I/O in here. A move is what
``AdminClient.decommission_tablet`` / ``list_reassignments`` answer: a dict
naming at least its bucket (and its table, by path or id, and partition when
it has them) or any other value, compared as it is. Where the buckets end up
is checked by :func:`ops.drills.service_checks.isr_full` with the server
``away``.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

from ops.drills.report import Check


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
