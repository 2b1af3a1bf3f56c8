"""Lost replicas, restores and operator elections: pure planning, no ZooKeeper
(docs/architecture.md, "Losing and moving replicas").

A replica's data is *lost* when its tablet server registers with a data dir
other than the one the coordinator recorded for it (a wiped or replaced disk:
every replica placed there), or when the tablet server reports one bucket's
files lost (:func:`replica_lost`). Then:

- the replica leaves the ISR at once, also the ISR an offline bucket keeps
  for its last in-sync replica: it must never be elected as in sync;
- if it led, the next live ISR member leads (a clean election); with none the
  bucket is offline (leader -1) with an ``offline_reason`` naming the loss —
  a one-replica bucket always is: it is never served again from nothing;
- a lost follower just rebuilds from the remote snapshot and rejoins the ISR.

An operator brings such a bucket back at the price of the lost changes:
:func:`restore` (the latest kept snapshot; every replica drops its local
state, the leader installs it) or :func:`elect` with ``unclean`` (an
out-of-sync replica leads alone). A restore also brings back an offline
bucket none of whose replicas is live (their servers gone for good): it moves
onto other live servers (:func:`restore_placement`), and one offline with no
live replica an unclean election may make leader. Every replica of the
restored bucket owes the restore until it confirms it carried it out
(:func:`restore_confirmed`), across restarts and later epochs; until then an
unclean election never makes it lead (:func:`unclean_candidates`), and a
follower that carried it out is ``lost`` (empty) until back in the ISR; a
replica moved off the bucket, or added to the ISR, owes nothing
(coordinator/assignment.py). Each appends
a :class:`~kvlease.common.data_loss.DataLoss` to the bucket's ``losses``, bumps the
leader epoch and is idempotent: sent again, it answers the same record. :func:`elect` without ``unclean`` is a
clean election of an ISR member.

Every function returns the bucket's new state (``a`` itself: nothing to
change); the caller writes it (fenced) and only then applies it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from kvlease.common import errors
from kvlease.common.data_loss import RESTORE, UNCLEAN, UNKNOWN, DataLoss
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment, Changes


def new_dir_reason(server: int) -> str:
    return f"data lost on tablet server {server}: it started with a new data dir"


def _lost_reason(reason: str, one_replica: bool) -> str:
    return reason + ("; the bucket has no other replica" if one_replica else "; no other in-sync replica has it")


def lost_data(a: BucketAssignment) -> bool:
    """Offline because its data is lost (what restore and elect --unclean are for)."""
    return a.offline and bool(a.offline_reason)


def replica_lost(a: BucketAssignment, server: int, reason: str, live: Iterable[int]) -> BucketAssignment:
    """``a`` once ``server``'s replica of it lost its data (``reason`` says how); ``live``: the live servers.
    The replica is remembered in ``lost`` until it is in sync again (an unclean election prefers others)."""
    if server not in a.replicas and a.leader != server:
        return a
    live = set(live)
    lost = a.lost + (server,)
    if a.replication_factor <= 1:
        if lost_data(a):
            return a
        return replace(a, leader=UNASSIGNED, isr=(), leader_epoch=a.leader_epoch + 1,
                       bucket_epoch=a.bucket_epoch + 1, offline_reason=_lost_reason(reason, True), lost=lost)
    isr = tuple(r for r in a.isr if r != server)
    if a.leader != server:  # a follower (or an offline bucket's kept ISR member): out of the ISR
        if isr == a.isr:  # out of sync already: only remembered
            return a if server in a.lost else replace(a, bucket_epoch=a.bucket_epoch + 1, lost=lost)
        gone = a.offline and not isr
        return replace(a, isr=isr, bucket_epoch=a.bucket_epoch + 1,
                       offline_reason=_lost_reason(reason, False) if gone else a.offline_reason, lost=lost)
    candidates = [r for r in isr if r in live]
    if candidates:
        return replace(a, leader=candidates[0], isr=isr, leader_epoch=a.leader_epoch + 1,
                       bucket_epoch=a.bucket_epoch + 1, lost=lost)
    return replace(a, leader=UNASSIGNED, isr=isr, leader_epoch=a.leader_epoch + 1, bucket_epoch=a.bucket_epoch + 1,
                   offline_reason="" if isr else _lost_reason(reason, False), lost=lost)


def restore(a: BucketAssignment, live: Iterable[int], snapshot: tuple[int, int] | None, last_known_end: int,
            at_ms: int, *, accept_data_loss: bool, where: str, tablet: int | None = None,
            servers: RestoreServers | None = None) -> tuple[BucketAssignment, DataLoss]:
    """The bucket restored from ``snapshot`` (``(snapshot_id, log_offset)`` of its latest kept one; None:
    empty at offset 0) and its loss record. For a bucket offline for lost data, or none of whose replicas is
    live (their servers gone for good: a restore again after the restored leader's server died too is a new
    restore, with its own record), or offline with no live replica an unclean election may make leader
    (:func:`unclean_candidates`: each lost its data or owes the latest restore); where it goes:
    :func:`restore_placement` (``tablet``: the operator's choice; ``servers``: load, room and decommissioned
    servers). InvalidRequestError: another state (a retry of the restore that brought it back answers its
    record; a live replica merely behind is told to wait for the in-sync one or take an unclean election),
    no server to restore onto, or ``accept_data_loss`` not set (the message says what would be lost)."""
    live = set(live)
    latest = a.losses[-1] if a.losses else None
    gone = bool(a.replicas) and not live & set(a.replicas)  # (a one-replica bucket keeps its dead leader)
    unfit = a.offline and bool(live & set(a.replicas)) and not unclean_candidates(a, live)  # none may lead
    if not lost_data(a) and not gone and not unfit:
        if (latest is not None and latest.kind == RESTORE and a.leader == latest.leader
                and tablet in (None, a.leader)):
            return a, latest  # a retried restore: its answer was lost
        raise errors.InvalidRequestError(_not_restorable(a, live, where))
    leader, replicas = restore_placement(a, live, tablet, servers or RestoreServers(), where)
    from_offset, snapshot_id = (snapshot[1], snapshot[0]) if snapshot is not None else (0, 0)
    lost = (f"{last_known_end - from_offset} changelog offsets ({from_offset}..{last_known_end - 1})"
            if last_known_end >= from_offset else "an unknown number of changelog offsets (no log end is known)")
    source = f"snapshot {snapshot_id} (log offset {from_offset})" if snapshot is not None else "nothing: no snapshot is kept, it restarts empty at offset 0"
    if not accept_data_loss:
        why = a.offline_reason or (_none_fit(a, live) if unfit
                                   else f"none of its replicas {list(a.replicas)} is live")
        onto = "" if replicas == a.replicas else f" onto tablet server {leader} (replicas {list(replicas)})"
        raise errors.InvalidRequestError(
            f"{where} is offline: {why}. Restoring it{onto} from {source} loses {lost}; run again with "
            "--accept-data-loss to accept that")
    loss = DataLoss(RESTORE, a.leader_epoch + 1, from_offset, last_known_end, snapshot_id, at_ms, leader,
                    owed_by=replicas)
    return replace(a, leader=leader, replicas=replicas, isr=(leader,), leader_epoch=loss.leader_epoch,
                   bucket_epoch=a.bucket_epoch + 1, offline_reason="", losses=a.losses + (loss,),
                   reassign=a.reassign if replicas == a.replicas else None), loss


def _not_restorable(a: BucketAssignment, live: set[int], where: str) -> str:
    if a.leader in live:
        return f"{where} is not offline for lost data (led by tablet server {a.leader}): nothing to restore"
    if not a.replicas:
        return f"{where} is not assigned yet: it gets a replica once a tablet server with room is live"
    behind = [r for r in a.replicas if r in live]
    waited = f"its in-sync replica(s) {list(a.isr)}" if a.isr else "an in-sync replica"
    return (f"{where} is not offline for lost data (offline, waiting for {waited} to return) and its live "
            f"replica(s) {behind} may miss committed writes, so there is nothing to restore: start tablet "
            f"server(s) {list(a.isr) or list(a.replicas)} again, or let a live replica lead with `kvlease "
            "bucket elect --unclean` (losing what it missed)")


@dataclass(frozen=True)
class RestoreServers:
    """What a restore onto other servers needs to know of them: the replicas each holds (``load``), how
    many more each takes (``room``: absent or None, no limit) and the decommissioned ones (``excluded``)."""

    load: Mapping[int, int] = field(default_factory=dict)
    room: Mapping[int, "int | None"] = field(default_factory=dict)
    excluded: frozenset[int] = frozenset()


def restore_placement(a: BucketAssignment, live: set[int], tablet: int | None, servers: RestoreServers,
                      where: str) -> tuple[int, tuple[int, ...]]:
    """``(leader, replicas)`` of a restored bucket. A live replica (``tablet``, else the first live one)
    leads it with its replicas unchanged. Otherwise (none is live, or ``tablet`` names another live
    server) the bucket moves: ``tablet`` (else the least loaded live server that is not decommissioned
    and has room) leads as its first replica, the live replicas are kept, the others replaced by the
    least loaded such servers (they rebuild from the leader), as many as the live servers allow; a
    replica left out is told ``removed`` (or deletes its stray copy when it returns). InvalidRequestError:
    ``tablet`` not live, decommissioned or full; no live server to restore onto."""
    alive = [r for r in a.replicas if r in live]
    if tablet is not None and tablet not in live:
        raise errors.InvalidRequestError(f"{where}: tablet server {tablet} is not live")
    if tablet in a.replicas or (tablet is None and alive):
        return (tablet if tablet is not None else alive[0]), a.replicas
    load = Counter(servers.load)
    room = dict(servers.room)

    def free(taken) -> list[int]:
        """The live servers not decommissioned nor ``taken`` with room, the least loaded first."""
        return sorted((s for s in live - set(servers.excluded) - set(taken) if room.get(s) is None or room[s] > 0),
                      key=lambda s: (load[s], s))

    def take(server: int) -> int:
        load[server] += 1
        if room.get(server) is not None:
            room[server] -= 1
        return server

    if tablet is not None and tablet in servers.excluded:
        raise errors.InvalidRequestError(f"{where}: tablet server {tablet} is decommissioned; `kvlease cluster "
                                         f"recommission --tablet {tablet}` first, or name another")
    if tablet is not None and tablet not in free(()):
        raise errors.InvalidRequestError(f"{where}: tablet server {tablet} holds its most replicas "
                                         "(tablet.buckets.max); name another")
    if tablet is None and not free(()):
        retired = sorted(live & set(servers.excluded))
        raise errors.InvalidRequestError(
            f"{where}: none of its replicas {list(a.replicas)} is live and no other live tablet server with "
            f"room can take it (live: {sorted(live)}" + (f", decommissioned: {retired}" if retired else "")
            + "); start a tablet server first")
    leader = take(tablet if tablet is not None else free(())[0])
    others = [r for r in a.replicas if r != leader]
    if len(others) >= max(1, a.replication_factor):  # the leader takes a dead replica's place (else the last's)
        others.remove(next((r for r in others if r not in live), others[-1]))
    replicas = [leader]
    for r in others:
        if r in live:
            replicas.append(r)
            continue
        candidates = free(replicas + others)
        if candidates:
            replicas.append(take(candidates[0]))
    return leader, tuple(replicas)


def elect(a: BucketAssignment, live: Iterable[int], *, unclean: bool, tablet: int | None, last_known_end: int,
          at_ms: int, where: str, newest_snapshot_id: int = 0) -> tuple[BucketAssignment, DataLoss | None]:
    """A leader chosen by the operator, and the loss record of an unclean election (None: clean).

    Clean: the first live ISR member (or ``tablet``, which must be one) leads; already leading: nothing
    changes. Unclean, only for an offline replicated bucket: ``tablet`` or :func:`unclean_choice` leads
    alone and the loss's ``from_offset`` stays unknown until it reports its log end; never a ``tablet``
    that owes the latest restore (it would serve what the restore replaced: refused). A retried unclean
    election answers its record. ``newest_snapshot_id``: the bucket's newest committed snapshot (0: none),
    recorded in the loss (:meth:`DataLoss.lost_history`). InvalidRequestError otherwise, saying why."""
    live = set(live)
    if tablet is not None and tablet not in a.replicas:
        raise errors.InvalidRequestError(f"{where}: tablet server {tablet} holds no replica of it (replicas "
                                         f"{list(a.replicas)})")
    if tablet is not None and tablet not in live:
        raise errors.InvalidRequestError(f"{where}: tablet server {tablet} is not live")
    latest = a.losses[-1] if a.losses else None
    if not unclean:
        candidates = [r for r in a.isr if r in live and (tablet is None or r == tablet)]
        if not candidates:
            why = (f"tablet server {tablet} is not in its ISR {list(a.isr)}" if tablet is not None
                   else f"no live in-sync replica (ISR {list(a.isr)})")
            hint = "; --unclean lets an out-of-sync replica lead, losing what it missed" if a.offline else ""
            raise errors.InvalidRequestError(f"{where}: no clean election possible: {why}{hint}")
        if a.leader == candidates[0] or (tablet is None and a.leader in candidates):
            return a, None
        leader = candidates[0]
        return replace(a, leader=leader, leader_epoch=a.leader_epoch + 1, bucket_epoch=a.bucket_epoch + 1,
                       offline_reason=""), None
    if a.replication_factor <= 1:
        raise errors.InvalidRequestError(f"{where} has one replica: there is no other replica to elect; use "
                                         "`kvlease bucket restore --accept-data-loss`")
    if not a.offline:
        if latest is not None and latest.kind == UNCLEAN and a.leader == latest.leader \
                and a.leader_epoch == latest.leader_epoch and (tablet is None or tablet == a.leader):
            return a, latest  # a retried unclean election: its answer was lost
        raise errors.InvalidRequestError(f"{where} is led by tablet server {a.leader}: an unclean election is only "
                                         "for an offline bucket")
    if tablet is not None and tablet in a.restore_owed_by:
        fit = unclean_candidates(a, live)
        instead = (f"name another replica (without --tablet: tablet server {fit[0]})" if fit else
                   "`kvlease bucket restore --accept-data-loss` brings back its latest snapshot instead")
        raise errors.InvalidRequestError(
            f"{where}: tablet server {tablet} has not carried out the bucket's restore of leader epoch "
            f"{a.latest_restore.leader_epoch} yet: it holds its data from before the restore (or nothing), which "
            f"it would serve as leader; {instead}")
    leader = tablet if tablet is not None else unclean_choice(a, live, where)
    loss = DataLoss(UNCLEAN, a.leader_epoch + 1, UNKNOWN, last_known_end, 0, at_ms, leader, newest_snapshot_id)
    return replace(a, leader=leader, isr=(leader,), leader_epoch=loss.leader_epoch, bucket_epoch=a.bucket_epoch + 1,
                   offline_reason="", losses=a.losses + (loss,)), loss


def unclean_candidates(a: BucketAssignment, live: set[int]) -> list[int]:
    """The live replicas (in ``replicas`` order) an unclean election may make leader: not one that lost its
    data since it was last in sync (``a.lost``: it would lead empty, losing everything), nor one that still
    owes the bucket's latest restore (``a.restore_owed_by``: it holds its data from before the restore, or
    nothing, and would serve that instead of the restored data and the writes since)."""
    return [r for r in a.replicas if r in live and r not in a.lost and r not in a.restore_owed_by]


def unclean_choice(a: BucketAssignment, live: set[int], where: str) -> int:
    """The replica an unclean election without ``--tablet`` makes leader: the first of
    :func:`unclean_candidates`. The coordinator knows no follower's log end (only leaders report theirs), so
    the order decides among those; ``--tablet`` picks another. InvalidRequestError when no replica is live,
    or none of the live ones is a candidate (the message says what to do instead)."""
    alive = [r for r in a.replicas if r in live]
    if not alive:
        raise errors.InvalidRequestError(f"{where}: none of its replicas {list(a.replicas)} is live; start one "
                                         "of them first")
    fit = unclean_candidates(a, live)
    if fit:
        return fit[0]
    restore = "`kvlease bucket restore --accept-data-loss` brings back its latest snapshot"
    instead = (f"{restore}, better than an empty replica" if lost_data(a) or not a.isr else
               f"start its in-sync replica(s) {list(a.isr)} again: they have every committed write; or {restore}")
    owing = any(r in a.restore_owed_by for r in alive)
    harm = ("serve what the bucket's restore replaced (or nothing) instead of the restored data and the writes "
            "since" if owing else "lead empty, losing everything")
    force = ("" if all(r in a.restore_owed_by for r in alive)  # each refused with --tablet too
             else " (or name one that lost its data with --tablet to accept that)")
    raise errors.InvalidRequestError(f"{where}: {_none_fit(a, live)}, so an unclean election would make it "
                                     f"{harm}; {instead}{force}")


def _none_fit(a: BucketAssignment, live: set[int]) -> str:
    """Why none of the live replicas may lead after an unclean election (:func:`unclean_candidates` is empty)."""
    alive = [r for r in a.replicas if r in live]
    owing = [r for r in alive if r in a.restore_owed_by]
    lost = [r for r in alive if r not in owing]
    if not owing:
        return f"every live replica {alive} lost its data"
    pending = f"has not carried out the bucket's restore of leader epoch {a.latest_restore.leader_epoch} yet"
    return (f"every live replica {alive} {pending}" if not lost
            else f"every live replica {alive} lost its data ({lost}) or {pending} ({owing})")


def takeover_reported(a: BucketAssignment, server: int, leader_epoch: int, log_end: int) -> BucketAssignment:
    """The unclean leader ``server`` reported its log end at ``leader_epoch``: the loss's ``from_offset``.
    Anything else (a stale epoch, a loss already resolved) changes nothing."""
    latest = a.losses[-1] if a.losses else None
    if (latest is None or latest.kind != UNCLEAN or latest.resolved or a.leader != server
            or latest.leader_epoch != leader_epoch or a.leader_epoch != leader_epoch):
        return a
    return replace(a, losses=a.losses[:-1] + (replace(latest, from_offset=log_end),),
                   bucket_epoch=a.bucket_epoch + 1)


def restore_confirmed(a: BucketAssignment, server: int, leader_epoch: int) -> BucketAssignment:
    """``server`` carried out the restore that gave the bucket ``leader_epoch``: it no longer owes it
    (:attr:`~kvlease.common.data_loss.DataLoss.owed_by`). A replica other than the restore's leader only dropped
    its data (it rebuilds from the leader): it is ``lost`` until it is in the ISR again, so an unclean
    election meanwhile never makes it lead empty. Anything else (a resent confirmation, another loss, a
    restore recorded before owed_by was kept) changes nothing. The leader and ISR do not change, so
    neither does the bucket epoch (a leader's ISR change in flight stays valid)."""
    for i, loss in enumerate(a.losses):
        if loss.kind == RESTORE and loss.leader_epoch == leader_epoch and loss.owes(server):
            return replace(a, losses=a.losses[:i] + (loss.owed_only_by(lambda r: r != server),) + a.losses[i + 1:],
                           lost=a.lost if server == loss.leader else a.lost + (server,))
    return a


def pending_takeover(a: BucketAssignment) -> bool:
    """Led after an unclean election whose leader has not reported its log end yet (it does not serve)."""
    latest = a.losses[-1] if a.losses else None
    return (latest is not None and latest.kind == UNCLEAN and not latest.resolved
            and a.leader == latest.leader and a.leader_epoch == latest.leader_epoch)



def servers_lost(assignments: Assignments, lost: Mapping[int, str], live: Iterable[int]) -> Changes:
    """Every table with a bucket changed by the replicas of the ``lost`` servers (id -> reason) losing
    their data (all its buckets, as :func:`kvlease.coordinator.election_plan.servers_changed` gives them)."""
    changes: Changes = {}
    live = set(live)
    for table_id, buckets in sorted(assignments.by_table.items()):
        for bucket, current in sorted(buckets.items()):
            state = current
            for server, reason in sorted(lost.items()):
                state = replica_lost(state, server, reason, live)
            if state != current:
                changes.setdefault(table_id, dict(buckets))[bucket] = state
    return changes
