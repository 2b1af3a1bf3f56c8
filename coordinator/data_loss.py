"""The coordinator's side of lost data: replica losses reported, leaders' log ends, restores and operator elections.

Runs on the event loop's thread (requests of :mod:`kvlease.coordinator.requests`,
routed by :class:`~kvlease.coordinator.controller.Controller`). Planning is pure
(:mod:`kvlease.coordinator.data_loss_plan`); a change is written (fenced) and told to the
replicas through :class:`~kvlease.coordinator.membership.Membership` before it is
answered. The leaders' log ends (``ReportLogEnds``, sent by every tablet
server every ``kv.snapshot.interval`` for the buckets whose end moved) are
kept (:mod:`kvlease.coordinator.log_ends`: in memory and in ZooKeeper): a restore says
from them how many committed offsets it loses ("unknown" when none was ever
reported).
A restored bucket's replicas confirm the restore once carried out
(``ConfirmRestore``): until then each still owes it. An unclean leader's
takeover report resolves its loss; the snapshots of the
lost history then leave the kept list (``on_resolved``:
:meth:`~kvlease.coordinator.snapshot_commits.SnapshotCommits.drop_lost_history`).
"""

from __future__ import annotations

import logging
from typing import Callable

from kvlease.common import errors
from kvlease.common.data_loss import UNKNOWN, DataLoss
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo
from kvlease.coordinator import data_loss_plan
from kvlease.coordinator.assignment import BucketAssignment
from kvlease.coordinator.log_ends import LogEnds
from kvlease.coordinator.membership import Membership
from kvlease.coordinator.snapshots import SnapshotStore

log = logging.getLogger(__name__)


class DataLossShell:
    def __init__(self, members: Membership, snapshots: Callable[[], SnapshotStore], clock_ms: Callable[[], int],
                 metrics=None, on_resolved: Callable[[TableBucket, tuple[DataLoss, ...]], object] = lambda tb, l: None
                 ) -> None:
        """``on_resolved(bucket, losses)``: run once an unclean leader's takeover report resolved a loss, after
        it was written (the snapshots of the lost history leave the kept list there)."""
        self.members = members
        self.on_resolved = on_resolved
        self.snapshots = snapshots
        self.clock_ms = clock_ms
        self.metrics = metrics
        #: the bucket leaders' last reported committed log ends (persisted: coordinator/log_ends.py)
        self.ends = LogEnds(clock_ms)

    # -- queries ----------------------------------------------------------------------------

    def _bucket(self, table_id: int, bucket: int) -> tuple[str, BucketAssignment]:
        table = self._table(table_id)
        current = self.members.assignments.table(table_id).get(bucket)
        if current is None:
            raise errors.BucketOutOfRangeError(f"{table.where} has buckets 0..{table.buckets - 1}, not {bucket}",
                                               table=table.path)
        return f"bucket {bucket} of {table.where}", current

    def _table(self, table_id: int) -> TableInfo:
        """The physical table of an id (buckets are named by physical ids here: common/tables.py)."""
        table = self.members.catalog.physical.get(table_id)
        if table is None:
            raise errors.TableNotExistError(f"table or partition id {table_id} does not exist", table_id=table_id)
        return table

    def last_known_end(self, table_id: int, bucket: int) -> int:
        known = self.ends.get(table_id, bucket)
        return UNKNOWN if known is None else known[1]

    def _store(self, table_id: int, bucket: int, new: BucketAssignment) -> None:
        self.members._apply({table_id: {**self.members.assignments.table(table_id), bucket: new}})

    def _count(self, loss: DataLoss, where: str) -> None:
        log.warning("data loss accepted on %s: %s", where, loss.describe())
        if self.metrics is not None:
            self.metrics.data_losses.labels(loss.kind).inc()

    # -- tablet servers -----------------------------------------------------------------------

    def replica_lost(self, server_id: int, table_id: int, bucket: int, reason: str) -> BucketAssignment:
        """``server_id`` found its replica of the bucket lost: out of the ISR, offline if it was the last."""
        where, current = self._bucket(table_id, bucket)
        new = data_loss_plan.replica_lost(current, server_id, f"data lost on tablet server {server_id}: {reason}",
                                     set(self.members.servers))
        if new != current:
            log.warning("%s: tablet server %d reports its replica lost (%s)%s", where, server_id, reason,
                        f"; offline: {new.offline_reason}" if data_loss_plan.lost_data(new) else "")
            self._store(table_id, bucket, new)
        return new

    def log_ends_reported(self, server_id: int, ends: list[tuple[int, int, int, int]], takeover: bool) -> None:
        """``ends``: (table id, bucket, leader epoch, log end) of buckets ``server_id`` leads. With
        ``takeover`` each is an unclean leader's log end at takeover: its loss record's from_offset."""
        for table_id, bucket, leader_epoch, log_end in ends:
            current = self.members.assignments.table(table_id).get(bucket)
            if current is None or current.leader != server_id or current.leader_epoch != leader_epoch:
                continue  # not (or no longer) its leader
            if takeover:
                new = data_loss_plan.takeover_reported(current, server_id, leader_epoch, log_end)
                if new != current:
                    self._store(table_id, bucket, new)
                    log.warning("bucket %d of table %d: its unclean leader %d reported its log end: %s", bucket,
                                table_id, server_id, new.losses[-1].describe())
                if new.losses and new.losses[-1].resolved:  # also a resent report: dropping is idempotent
                    self.on_resolved(self._table(table_id).bucket(bucket), new.losses)
            self.ends.note(table_id, bucket, leader_epoch, log_end)

    def restore_confirmed(self, server_id: int, table_id: int, bucket: int, leader_epoch: int) -> BucketAssignment:
        """``server_id`` carried out the restore of ``leader_epoch``: it no longer owes it (written, then
        told: its pushes say so). A resent confirmation changes nothing."""
        where, current = self._bucket(table_id, bucket)
        new = data_loss_plan.restore_confirmed(current, server_id, leader_epoch)
        if new != current:
            self._store(table_id, bucket, new)
            log.info("%s: tablet server %d carried out the restore of leader epoch %d (still owed by %s)", where,
                     server_id, leader_epoch, list(next(loss.owed_by for loss in new.losses
                                                        if loss.leader_epoch == leader_epoch)))
        return new

    # -- operators --------------------------------------------------------------------------------

    def restore(self, table_id: int, bucket: int, accept_data_loss: bool, tablet: int | None = None
                ) -> tuple[DataLoss, BucketAssignment]:
        """``tablet``: the server to restore onto (None: a live replica, else the least loaded live server)."""
        where, current = self._bucket(table_id, bucket)
        latest = self.snapshots().latest(self._table(table_id).bucket(bucket))
        live = set(self.members.servers)
        assignments = self.members.assignments
        servers = data_loss_plan.RestoreServers(assignments.load_per_server(),
                                           assignments.room(sorted(live), self.members.capacity),
                                           frozenset(self.members.decommissioned.ids))
        new, loss = data_loss_plan.restore(current, live,
                                      None if latest is None else (latest.snapshot_id, latest.log_offset),
                                      self.last_known_end(table_id, bucket), self.clock_ms(),
                                      accept_data_loss=accept_data_loss, where=where, tablet=tablet, servers=servers)
        if new != current:
            self._store(table_id, bucket, new)
            self._count(loss, where)
            if new.replicas != current.replicas:
                table = self._table(table_id)
                log.warning("%s restored onto tablet server %d: replicas %s -> %s%s", where, new.leader,
                            list(current.replicas), list(new.replicas),
                            f" (fewer than its replication factor {table.replication_factor}: no other live "
                            "tablet server with room)" if len(new.replicas) < table.replication_factor else "")
        return loss, new

    def elect(self, table_id: int, bucket: int, unclean: bool, tablet: int | None
              ) -> tuple[DataLoss | None, BucketAssignment]:
        where, current = self._bucket(table_id, bucket)
        latest = self.snapshots().latest(self._table(table_id).bucket(bucket))
        new, loss = data_loss_plan.elect(current, set(self.members.servers), unclean=unclean, tablet=tablet,
                                    last_known_end=self.last_known_end(table_id, bucket), at_ms=self.clock_ms(),
                                    where=where, newest_snapshot_id=0 if latest is None else latest.snapshot_id)
        if new != current:
            self._store(table_id, bucket, new)
            log.warning("%s: %s election by an operator: tablet server %d leads (leader epoch %d)", where,
                        "unclean" if unclean else "clean", new.leader, new.leader_epoch)
            if loss is not None:
                self._count(loss, where)
        return loss, new
