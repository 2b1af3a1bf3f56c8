"""Moving bucket replicas on the active coordinator: reassign one bucket, decommission a tablet server,
rebalance, and completing the moves as their new replicas catch up.

The plans are pure (:mod:`kvlease.coordinator.reassignment_plan`, :mod:`kvlease.coordinator.rebalance_plan`);
this shell writes them through :class:`~kvlease.coordinator.membership.Membership`
(fenced, then applied, then every replica of a changed bucket is told; a
replica a completed move took the bucket off is told to delete its copy).
A move's state lives in ZooKeeper with the bucket's assignment, so
:meth:`Moves.progress` — run after every applied change (an AlterIsr that
added a new replica to the ISR, servers coming and going, a failover's first
look at the servers) — completes a move wherever it was started. A completion
whose write failed (not fatally) is tried again on the next expiry tick.

A decommission also marks its server (:mod:`kvlease.coordinator.decommissioned`, in
the same write as the moves it starts): no placement chooses it again until
:meth:`Moves.recommission`; a rebalance moves what is left on it away.

Runs on the event loop's thread, like every part of the controller.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Sequence

from kvlease.common import errors
from kvlease.common.tables import TableInfo
from kvlease.common.zk import ZkOp
from kvlease.coordinator import reassignment_plan, rebalance_plan
from kvlease.coordinator.assignment import BucketAssignment, Changes
from kvlease.coordinator.membership import Membership

log = logging.getLogger(__name__)

_FATAL = (errors.CoordinatorFencedError, errors.OutcomeUnknownError)  # the coordinator steps down

#: One bucket's move as answered: (table, bucket, its state).
Row = tuple[TableInfo, int, BucketAssignment]


class Moves:
    def __init__(self, members: Membership) -> None:
        self.members = members
        self.retry_progress = False  # a completion's write failed: the next tick tries again
        members.on_changed = self.progress

    @property
    def _live(self) -> set[int]:
        return set(self.members.servers)

    def _table(self, table_id: int) -> TableInfo:
        return self.members.catalog.physical[table_id]

    def _rf(self, table_id: int) -> int:
        table = self.members.catalog.physical.get(table_id)
        return table.replication_factor if table is not None else 1

    def _name(self, table_id: int) -> str:
        table = self.members.catalog.physical.get(table_id)
        return table.where if table is not None else f"table id {table_id}"

    def _restore_args(self, table_id: int) -> str:
        """What ``kvlease bucket restore`` names a physical table by: ``DB.T`` [``--partition P``]."""
        table = self.members.catalog.physical.get(table_id)
        if table is None:
            return f"<table id {table_id}>"
        return table.path if table.partition_name is None else f"{table.path} --partition {table.partition_name}"

    # -- requests --------------------------------------------------------------------

    def reassign(self, table: TableInfo, bucket: int, target: Sequence[int]) -> Row:
        """Start moving a bucket's replicas to ``target``; the bucket's state after it (its move in progress, or
        done). Resent with the same target: the same answer, nothing more written."""
        plan = self.members.assignments.table(table.physical_id)
        current = plan.get(bucket)
        if current is None:
            raise errors.BucketOutOfRangeError(f"{table.where} has no bucket {bucket} (it has {table.buckets})",
                                               table=table.path, bucket=bucket)
        where = f"bucket {bucket} of {table.where}"
        asked = tuple(int(r) for r in target)
        if current.reassign != asked and not (current.reassign is None and current.replicas == asked):
            asked = reassignment_plan.check_target(where, table.replication_factor, asked, self._live, current.replicas)
            retired = sorted((set(asked) - set(current.replicas)) & self.members.decommissioned.ids)
            if retired:
                raise errors.InvalidRequestError(
                    f"cannot move {where}: tablet server(s) {retired} are decommissioned and take no new replicas "
                    f"(`kvlease cluster recommission --tablet ID` first)")
            new = reassignment_plan.start(current, asked, where)
            if new != current:
                self.members.apply({table.physical_id: {**plan, bucket: new}})
                log.info("%s: moving replicas %s -> %s (leader %d, ISR %s)", where, list(current.replicas),
                         list(asked), new.leader, list(new.isr))
        return table, bucket, self.members.assignments.table(table.physical_id)[bucket]

    def decommission(self, server_id: int) -> list[Row]:
        """Mark ``server_id`` decommissioned and start moving every replica off it; every move taking one off it
        (started now or before). Refused as a whole (nothing started, not marked) if any of its buckets cannot
        move, or if no server of that id is known (:meth:`_check_known`). Resent: the mark is there, the moves
        in progress are answered."""
        self._check_known(server_id, "decommission")
        assignments, retired = self.members.assignments, self.members.decommissioned
        moves = rebalance_plan.decommission(assignments, server_id, self._live, self.members.capacity, self._name,
                                            excluded=retired.ids, restore_args=self._restore_args)
        marking = retired.mark_ops(server_id)
        self._start(moves, extra_ops=marking, extra_written=lambda: retired.marked(server_id))
        if moves or marking:
            log.info("decommission of tablet server %d: %d move(s) started%s", server_id, len(moves),
                     "; it takes no new replicas" if marking else "")
        return [(self._table(t), b, a) for t, b, a in sorted(assignments.all(), key=lambda x: (x[0], x[1]))
                if a.reassign is not None and server_id in a.replicas and server_id not in a.reassign]

    def recommission(self, server_id: int) -> bool:
        """Clear ``server_id``'s decommission mark: placements may choose it again (the moves already started
        off it go on). Whether it was marked (resent: False). InvalidRequestError if no server of that id is
        known."""
        retired = self.members.decommissioned
        if server_id not in retired:
            self._check_known(server_id, "recommission")
            return False
        self.members.writer.commit(retired.clear_ops(server_id))
        retired.cleared(server_id)
        log.info("tablet server %d recommissioned: it takes new replicas again", server_id)
        return True

    def _check_known(self, server_id: int, verb: str) -> None:
        """InvalidRequestError unless ``server_id`` is live, holds a replica, is marked, or registered a data dir
        once (a typo is not marked)."""
        members = self.members
        if (server_id in members.servers or server_id in members.decommissioned or server_id in members.dirs.by_server
                or any(server_id in a.replicas + (a.reassign or ()) for _t, _b, a in members.assignments.all())):
            return
        raise errors.InvalidRequestError(
            f"cannot {verb} tablet server {server_id}: no tablet server with this id is registered or holds a "
            f"replica (registered: {sorted(members.servers) or 'none'})")

    def rebalance(self, leaders_only: bool = False) -> tuple[list[Row], list[tuple[Row, int]]]:
        """Start the moves and leader changes of :func:`kvlease.coordinator.rebalance_plan.rebalance` (replicas left on
        decommissioned servers move first; ``leaders_only``: no moves): (moves started, [(bucket after its
        leader's change, its old leader)])."""
        assignments = self.members.assignments
        plan = rebalance_plan.rebalance(assignments, self._live, self.members.capacity,
                                   excluded=self.members.decommissioned.ids, leaders_only=leaders_only)
        before = {key: assignments.table(key[0])[key[1]] for key in plan.leaders}
        changes: Changes = {}
        for (table_id, bucket), elected in sorted(plan.leaders.items()):
            changes.setdefault(table_id, dict(assignments.table(table_id)))[bucket] = elected
        self._start(plan.moves, changes)
        if plan.moves or plan.leaders:
            log.info("rebalance%s: %d move(s) started, %d bucket(s) led by their preferred replica (%d of them with "
                     "a new one)", " of leaders" if leaders_only else "", len(plan.moves), len(plan.leaders),
                     sum(a.replicas != before[key].replicas for key, a in plan.leaders.items()))
        moved = [(self._table(t), b, assignments.table(t)[b]) for t, b, _target in plan.moves]
        leaders = [((self._table(t), b, assignments.table(t)[b]), before[(t, b)].leader)
                   for t, b in sorted(plan.leaders)]
        return moved, leaders

    def in_progress(self) -> list[Row]:
        """Every bucket being moved."""
        return [(self._table(t), b, a) for t, b, a in sorted(self.members.assignments.all(), key=lambda x: (x[0], x[1]))
                if a.reassign is not None and t in self.members.catalog.physical]

    def _start(self, moves: Iterable[tuple[int, int, tuple[int, ...]]], changes: Changes | None = None,
               extra_ops: list[ZkOp] = (), extra_written: Callable[[], None] = lambda: None) -> None:
        """Start ``moves`` (checked first, all of them: one that cannot start refuses the lot) together with
        ``changes`` and ``extra_ops`` (then ``extra_written()``), in one write."""
        changes = changes if changes is not None else {}
        assignments = self.members.assignments
        for table_id, bucket, target in moves:
            where = f"bucket {bucket} of {self._name(table_id)}"
            plan = changes.setdefault(table_id, dict(assignments.table(table_id)))
            reassignment_plan.check_target(where, self._rf(table_id), target, self._live, plan[bucket].replicas)
            plan[bucket] = reassignment_plan.start(plan[bucket], target, where)
        if changes or extra_ops:
            self.members.apply(changes, extra_ops, extra_written)

    # -- completing moves -------------------------------------------------------------

    def progress(self, table_ids: Iterable[int] | None = None) -> None:
        """Complete every move (of ``table_ids``; None: all) whose target replicas are all in the ISR. A
        non-fatal write failure is logged and tried again on the next tick (:meth:`tick`)."""
        changes = reassignment_plan.progress_all(self.members.assignments, self._live, table_ids)
        if not changes:
            return
        before = {(t, b): self.members.assignments.table(t)[b] for t, plan in changes.items() for b in plan}
        try:
            self.members.apply(changes)
        except _FATAL:
            raise
        except errors.KvLeaseError as exc:
            self.retry_progress = True
            log.warning("completing replica moves failed (tried again): %s", exc)
            return
        for (table_id, bucket), old in sorted(before.items()):
            new = self.members.assignments.table(table_id).get(bucket)
            if old.reassign is not None and new is not None and new.reassign is None:
                log.info("bucket %d of %s: move to %s complete (leader %d, leader epoch %d; removed from %s)", bucket,
                         self._name(table_id), list(new.replicas), new.leader, new.leader_epoch,
                         sorted(reassignment_plan.removed_replicas(old, new)))

    def tick(self) -> None:
        """The expiry tick: try the completions whose write failed again."""
        if self.retry_progress:
            self.retry_progress = False
            self.progress()
