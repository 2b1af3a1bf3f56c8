"""Leaders and in-sync replicas as tablet servers come and go: pure, no ZooKeeper
(docs/architecture.md, "Leader leases").

- A server gone (its ``/tabletservers/ids`` node went, or it re-registered with
  a new incarnation): every bucket it led gets the first replica (in
  ``replicas`` order) that is live and in the ISR as leader, the ISR loses the
  gone servers, leader and bucket epochs +1. No live ISR member: the bucket is
  offline (leader -1, the ISR kept so that the last in-sync replica leads when
  it returns) unless unclean election is on (the first live replica leads
  alone: its missing writes are lost; never one that reported its data lost,
  it would lead empty, nor one that still owes the bucket's latest restore,
  it would serve what the restore replaced, nor a replica a move in progress
  is adding, which may hold nothing yet, e.g. a one-replica bucket's new
  copy). A bucket it only followed drops it from its ISR. One-replica
  buckets keep their leader (they wait for it).
- A server joined: an offline bucket whose ISR holds it gets a leader again
  (the first live ISR member); a one-replica bucket it leads gets a new
  leader epoch; an unassigned one-replica bucket goes to the live server with
  room that holds the fewest replicas (never a decommissioned one). Otherwise it is a follower: it rejoins
  ISRs through the leaders' AlterIsr once caught up.
- :func:`alter_isr`: the leader's ISR change, fenced by its epochs (a replica it adds owes no restore
  any more: it holds what the leader holds).
- :func:`controlled_shutdown`: a stopping server's leaderships move to other live ISR members.
- :func:`resign_leadership`: a leader that cannot write (its disk is full, ``tablet/replicas/step_down.py``) hands
  a bucket to another live ISR member and leaves the ISR, fenced by its leader epoch
  (:func:`resign_leaderships`: several buckets, one set of changes).

Every function returns new states; the caller writes them (fenced) and only then applies them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from kvlease.common import errors
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment, Capacity, Changes


@dataclass(frozen=True)
class Outcome:
    """A bucket's new state and whether it took an unclean election."""

    state: BucketAssignment
    unclean: bool = False


def _new_leader(a: BucketAssignment, leader: int, isr: Iterable[int]) -> BucketAssignment:
    return replace(a, leader=leader, isr=a.in_replica_order(isr), leader_epoch=a.leader_epoch + 1,
                   bucket_epoch=a.bucket_epoch + 1)


def _unclean_choice(a: BucketAssignment, live: set[int], gone: set[int] = frozenset()) -> int | None:
    """The first live replica an unclean election may make leader: not one that reported its data lost (it
    would lead empty), nor one that still owes the bucket's latest restore (it would serve its data from
    before the restore), nor one a move in progress is adding (in its target and out of the ISR: it may
    still be copying the bucket, or not have started)."""
    adding = set(a.reassign or ()) - set(a.isr)
    return next((r for r in a.replicas if r in live and r not in gone and r not in adding and r not in a.lost
                 and r not in a.restore_owed_by), None)


def server_gone(a: BucketAssignment, gone: set[int], live: set[int], unclean: bool = False) -> Outcome | None:
    """``a`` once the ``gone`` servers are not live any more (``live``: the servers that are); None: unchanged."""
    if a.replication_factor <= 1 or a.offline:
        return None  # one replica: it waits for its leader; offline: its ISR is kept for the last in-sync one
    if a.leader in gone or a.leader not in live:
        isr = a.in_replica_order(r for r in a.isr if r not in gone and r in live)
        if isr:
            return Outcome(_new_leader(a, isr[0], isr))
        first_live = _unclean_choice(a, live, gone)
        if unclean and first_live is not None:
            return Outcome(_new_leader(a, first_live, [first_live]), unclean=True)
        return Outcome(replace(a, leader=UNASSIGNED, leader_epoch=a.leader_epoch + 1,
                               bucket_epoch=a.bucket_epoch + 1))
    isr = [r for r in a.isr if r not in gone and r in live]
    if len(isr) == len(a.isr):
        return None
    return Outcome(replace(a, isr=a.in_replica_order(isr), bucket_epoch=a.bucket_epoch + 1))


def server_joined(a: BucketAssignment, joined: set[int], live: set[int], unclean: bool = False) -> Outcome | None:
    """``a`` once the ``joined`` servers are live (a new incarnation); None: unchanged. Unassigned
    one-replica buckets are placed by :func:`servers_changed`."""
    if a.replication_factor <= 1:
        if a.leader in joined:
            return Outcome(replace(a, leader_epoch=a.leader_epoch + 1, bucket_epoch=a.bucket_epoch + 1))
        return None
    if not a.offline or not joined & set(a.replicas):
        return None
    isr = a.in_replica_order(r for r in a.isr if r in live)
    if isr:
        return Outcome(_new_leader(a, isr[0], isr))
    first_live = _unclean_choice(a, live)
    if unclean and first_live is not None and not a.offline_reason:  # lost data: an operator decides
        return Outcome(_new_leader(a, first_live, [first_live]), unclean=True)
    return None


def servers_changed(assignments: Assignments, gone: set[int], joined: set[int], live: set[int],
                    capacity: Capacity, unclean: bool = False,
                    excluded: set[int] = frozenset()) -> tuple[Changes, list[tuple[int, int]]]:
    """Every table with a changed bucket (all its buckets), and the (table, bucket) that took an
    unclean election. ``gone`` and ``joined`` may share a server (it re-registered unseen); a server
    not in ``live`` counts as gone whether it is in ``gone`` or not (e.g. gone while no coordinator
    was active). Unassigned buckets are not placed on ``excluded`` servers (decommissioned)."""
    changes: Changes = {}
    unclean_buckets = []
    for table_id, buckets in sorted(assignments.by_table.items()):
        for bucket, current in sorted(buckets.items()):
            state, took_unclean = current, False
            for step, servers in ((server_gone, gone), (server_joined, joined)):
                outcome = step(state, servers, live, unclean)  # gone: also any leader or ISR member not live
                if outcome is not None:
                    state, took_unclean = outcome.state, took_unclean or outcome.unclean
            if state != current:
                changes.setdefault(table_id, dict(buckets))[bucket] = state
            if took_unclean:
                unclean_buckets.append((table_id, bucket))
    _place_unassigned(assignments, changes, live - set(excluded), capacity)
    return changes, unclean_buckets


def servers_joined(assignments: Assignments, joined: set[int], live: set[int], capacity: Capacity) -> Changes:
    return servers_changed(assignments, set(), joined, live, capacity)[0]


def _place_unassigned(assignments: Assignments, changes: Changes, live: set[int], capacity: Capacity) -> None:
    """Unassigned one-replica buckets to the live servers with room holding the fewest replicas."""
    if not live:
        return
    load = assignments.load_per_server()
    for table_id, buckets in sorted(assignments.by_table.items()):
        for bucket, current in sorted(buckets.items()):
            if current.replicas or current.leader != UNASSIGNED:
                continue
            with_room = [s for s in sorted(live) if capacity.get(s) is None or load[s] < capacity[s]]
            if not with_room:
                return
            server = min(with_room, key=lambda s: load[s])
            load[server] += 1
            changes.setdefault(table_id, dict(buckets))[bucket] = BucketAssignment(server, current.leader_epoch + 1)


def current_state(a: BucketAssignment) -> dict:
    """What a refused or answered AlterIsr reports of the bucket."""
    return {"leader": a.leader, "leader_epoch": a.leader_epoch, "bucket_epoch": a.bucket_epoch, "isr": list(a.isr)}


def alter_isr(a: BucketAssignment, server_id: int, leader_epoch: int, bucket_epoch: int, isr: Iterable[int],
              live: set[int], where: str = "the bucket") -> BucketAssignment:
    """The state after the leader's AlterIsr (``a`` itself: nothing to change).

    FencedLeaderEpochError (its details: the current state) unless ``server_id`` leads at
    ``leader_epoch`` and ``bucket_epoch`` is current; a resent call (its answer lost, so its bucket
    epoch is the one before) whose ISR is already the current one answers the current state.
    InvalidRequestError for an ISR without the leader, with a server that is not a replica or
    twice, or adding a server that is not live.
    """
    asked = list(isr)
    leads = a.leader == server_id and a.leader_epoch == leader_epoch and not a.offline
    if leads and set(asked) == set(a.isr) and len(asked) == len(a.isr):
        return a  # the same ISR: nothing to do (also a resent call whose answer was lost)
    if not leads or a.bucket_epoch != bucket_epoch:
        raise errors.FencedLeaderEpochError(
            f"AlterIsr of {where} by tablet server {server_id} at leader epoch {leader_epoch}, bucket epoch "
            f"{bucket_epoch} refused: the bucket's leader is {a.leader} at leader epoch {a.leader_epoch}, bucket "
            f"epoch {a.bucket_epoch}", **current_state(a))
    if len(set(asked)) != len(asked) or a.leader not in asked or not set(asked) <= set(a.replicas):
        raise errors.InvalidRequestError(
            f"AlterIsr of {where}: ISR {asked} must hold the leader {a.leader}, each replica at most once, and only "
            f"replicas ({list(a.replicas)})")
    not_live = sorted(set(asked) - set(a.isr) - live)
    if not_live:
        raise errors.InvalidRequestError(f"AlterIsr of {where}: tablet server(s) {not_live} are not live: they "
                                         "cannot join the ISR")
    return replace(a, isr=a.in_replica_order(asked), bucket_epoch=a.bucket_epoch + 1).in_sync(set(asked) - set(a.isr))


def controlled_shutdown(assignments: Assignments, server_id: int, live: set[int]) -> tuple[Changes, int]:
    """The changes that move ``server_id``'s leaderships to the first other live ISR member (and take it
    out of every ISR it is in), and how many buckets it still leads with no one to take them (one-replica
    buckets do not count: there is nothing to move). Sent again, nothing more changes."""
    changes: Changes = {}
    remaining = 0
    for table_id, buckets in sorted(assignments.by_table.items()):
        for bucket, a in sorted(buckets.items()):
            if a.replication_factor <= 1 or server_id not in a.isr or a.offline:
                continue
            others = [r for r in a.isr if r != server_id and r in live]
            if a.leader == server_id:
                if not others:
                    remaining += 1
                    continue
                new = _new_leader(a, others[0], [r for r in a.isr if r != server_id])
            else:
                new = replace(a, isr=a.in_replica_order(r for r in a.isr if r != server_id),
                              bucket_epoch=a.bucket_epoch + 1)
            changes.setdefault(table_id, dict(buckets))[bucket] = new
    return changes, remaining


@dataclass(frozen=True)
class Resignation:
    """The answer to a leader's resignation: the bucket's state after it, and why the leader keeps it
    (``refused``; "" when it no longer leads at the epoch it named)."""

    state: BucketAssignment
    refused: str = ""


def resign_leadership(a: BucketAssignment, server_id: int, leader_epoch: int, live: set[int],
                      where: str = "the bucket") -> Resignation:
    """``server_id``, which leads ``a`` at ``leader_epoch`` and cannot write, gives the leadership up: the first
    other live ISR member (in replica order) leads, and ``server_id`` leaves the ISR in the same state (it
    must not be elected back while it cannot write; it rejoins through the new leader's AlterIsr once its
    writes work and it caught up). Refused, ``a`` unchanged, when no other live in-sync replica exists (or
    the bucket has one replica): it keeps leading and ``refused`` says why.

    Resent after its answer was lost, or asked of a leadership already over (another server leads, or none,
    at a later epoch): ``a`` unchanged. FencedLeaderEpochError (its details: the current state) if
    ``server_id`` leads at another epoch than ``leader_epoch``, or the bucket's epoch is older than it (a
    request that is not a leader's).
    """
    if a.leader != server_id and a.leader_epoch > leader_epoch:
        return Resignation(a)  # that leadership is over already
    if a.leader != server_id or a.leader_epoch != leader_epoch:
        raise errors.FencedLeaderEpochError(
            f"resignation of {where} by tablet server {server_id} at leader epoch {leader_epoch} refused: the "
            f"bucket's leader is {a.leader} at leader epoch {a.leader_epoch}", **current_state(a))
    if a.replication_factor <= 1:
        return Resignation(a, f"{where} has one replica: no other can lead it")
    others = [r for r in a.isr if r != server_id and r in live]
    if not others:
        return Resignation(a, f"{where} has no other live in-sync replica (ISR {list(a.isr)}, replicas "
                              f"{list(a.replicas)}) to lead it")
    return Resignation(_new_leader(a, others[0], [r for r in a.isr if r != server_id]))


def resign_leaderships(assignments: Assignments, server_id: int, asked: Iterable[tuple[int, int, int]], live: set[int],
                       paths: Mapping[int, str]) -> tuple[Changes, list[Resignation | errors.KvLeaseError]]:
    """:func:`resign_leadership` of each ``(table id, bucket, leader epoch)`` asked by ``server_id``: the changes
    to write (every table with a changed bucket, all its buckets) and each one's outcome in order, a
    Resignation or the error that refused it (FencedLeaderEpochError; TableNotExistError for a table not in
    ``paths``, physical table id -> its name in messages, ``table db.t [partition P]``; InvalidRequestError for
    a bucket it does not have)."""
    changes: Changes = {}
    outcomes: list[Resignation | errors.KvLeaseError] = []
    for table_id, bucket, leader_epoch in asked:
        buckets = changes.get(table_id) or assignments.by_table.get(table_id, {})
        if table_id not in paths:
            outcomes.append(errors.TableNotExistError(f"table id {table_id} does not exist", table_id=table_id))
            continue
        if bucket not in buckets:
            outcomes.append(errors.InvalidRequestError(f"{paths[table_id]} has no bucket {bucket}"))
            continue
        try:
            outcome = resign_leadership(buckets[bucket], server_id, leader_epoch, live,
                                        f"bucket {bucket} of {paths[table_id]}")
        except errors.FencedLeaderEpochError as exc:
            outcomes.append(exc)
            continue
        if outcome.state != buckets[bucket]:
            changes[table_id] = {**buckets, bucket: outcome.state}
        outcomes.append(outcome)
    return changes, outcomes
