"""One bucket replica a tablet server holds: its store, role, leadership and snapshot state.

Made and owned by :class:`~kvlease.tablet.replicas.manager.ReplicaManager`; a push's role for
it is taken by :meth:`Replica.take_role`. Its store is replicated (a pre-write
buffer, a leadership of its own when it leads) when the table has more than
one replica or the push names more than one (a one-replica bucket being
moved): a role that changes that mode is taken by opening the replica again
(:meth:`Replica.changes_mode`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo
from kvlease.tablet.bucket.store import BucketStore
from kvlease.tablet.replication.leader import Leadership
from kvlease.tablet.replication.roles import BucketRole
from kvlease.tablet.store.snapshot import SnapshotUploader

log = logging.getLogger("kvlease.tablet.replicas.manager")  # its role changes log with the manager's


def bucket_details(table: TableInfo, bucket: int) -> dict:
    """An error's details naming a bucket of ``table`` (a table's, or a partition's view): its table's id, the
    bucket, and the partition's id if it is a partition's."""
    details = {"table_id": table.table_id, "bucket": bucket}
    if table.partition_id is not None:
        details["partition_id"] = table.partition_id
    return details


@dataclass
class Replica:
    table: TableInfo
    bucket: int
    store: BucketStore
    uploader: SnapshotUploader
    next_snapshot_id: int = 1
    snapshot_offset: int = -1  # log offset of the last committed snapshot (-1: none)
    snapshot_lock: threading.Lock = field(default_factory=threading.Lock)
    base_known: bool = False  # the latest committed snapshot was asked of the coordinator
    role: BucketRole | None = None  # None: led alone (a store opened outside a push)
    server_id: int = 0
    lead: Leadership | None = None  # a replicated bucket's leadership, made on first use
    on_commit: Callable[[], None] = lambda: None
    on_isr_due: Callable[[], None] = lambda: None
    #: Held while a role changes and while a follower's fetch answer is applied.
    fetch_lock: threading.RLock = field(default_factory=threading.RLock)
    closed: bool = False
    #: Replicated and no local data when taken (new replica, wiped dir): rebuilt from the latest snapshot.
    fresh: bool = False
    #: A follower's leader's log end, from its last fetch answer (-1: none yet): how far behind it is.
    leader_end: int = -1
    #: A restore, an unclean takeover or a loss report to carry out before it serves or fetches
    #: (tablet/replicas/lost_data.py, tablet/replicas/loss.py).
    loss_work: str | None = None
    #: Why its data is lost (loss_work REPORT), and whether the coordinator answered the report.
    lost_reason: str = ""
    loss_reported: bool = False
    #: When (monotonic s) a leadership new to this server may serve: an earlier leader's lease is over by then
    #: (the push's ``lease_wait_ms``; tablet/replication/leader_lease.py). 0: at once.
    ready_at: float = 0.0

    @property
    def leads(self) -> bool:
        return self.role is None or self.role.leads(self.server_id)

    @property
    def replicated(self) -> bool:
        """Its store's mode, from the role pushed when it opened (:attr:`BucketRole.replicated`)."""
        return self.store.replicated

    def changes_mode(self, role: BucketRole) -> bool:
        """Whether ``role`` (not older than the one held) takes the bucket to the other mode (a one-replica
        bucket's move gives it a second replica, then takes it back to one)."""
        old = self.role
        newer = old is None or (role.leader_epoch, role.bucket_epoch) >= (old.leader_epoch, old.bucket_epoch)
        return newer and role.replicated != self.replicated

    def leadership(self) -> Leadership | None:
        """This replicated bucket's leadership (made now if needed: its store opens); None for a bucket with
        one replica. NotLeaderError if this server does not lead it."""
        if not self.replicated:
            return None
        lead = self.lead
        if lead is not None and not lead.ended:
            return lead
        with self.fetch_lock:
            if self.closed or not self.leads:
                raise errors.NotLeaderError(f"this tablet server does not lead {self.where}", **self.details)
            if self.lead is None or self.lead.ended:
                self.store.become_leader(self.role.leader_epoch)
                self.lead = Leadership(self.server_id, self.role, self.store, int(time.time() * 1000),
                                       on_commit=self.on_commit, on_isr_due=self.on_isr_due)
                log.info("%s: leads at leader epoch %d from log end %d (high watermark %d, ISR %s, leader epochs "
                         "start at %s)", self.tb, self.role.leader_epoch, self.lead.view.leader_log_end,
                         self.lead.high_watermark, sorted(self.lead.isr),
                         [(e.epoch, e.start_offset) for e in self.store.epochs.entries])
            return self.lead

    def take_role(self, role: BucketRole, now: float = 0.0) -> bool:
        """Take the coordinator's ``role`` (received at ``now``, monotonic s); whether this replica stopped
        leading (its scans must end). A newer schema of its table (``table alter``) is taken with it."""
        with self.fetch_lock:
            self.take_table(role.table)
            old = self.role
            if old is not None and (role.leader_epoch, role.bucket_epoch) < (old.leader_epoch, old.bucket_epoch):
                log.warning("%s: ignoring a push of leader epoch %d / bucket epoch %d older than the %d / %d held",
                            self.tb, role.leader_epoch, role.bucket_epoch, old.leader_epoch, old.bucket_epoch)
                return False
            self.role = role
            was_leading = old is None or old.leads(self.server_id)
            self.note_ready(old, role, now)
            if not self.replicated:
                self.leader_epoch = role.leader_epoch
                return False
            same_leadership = (was_leading and role.leads(self.server_id) and old is not None
                               and old.leader_epoch == role.leader_epoch)
            if same_leadership:
                if self.lead is not None:
                    self.lead.isr_pushed(role.isr, role.bucket_epoch)
                return False
            if self.lead is not None:
                self.lead.end()
                self.lead = None
            if role.leads(self.server_id):
                self.base_known = False  # the next snapshot id follows the committed ones of every leader
                self.fresh = False  # it leads with what it has: not rebuilt when it follows again
                return False
            if self.store.is_open:
                self.store.become_follower(role.leader_epoch)
            return was_leading

    def take_table(self, table: TableInfo) -> None:
        """Hold ``table``'s view (the same table, a later schema: docs/schemas.md) instead of the one held; an
        older schema (a push that a later one overtook) is ignored. Requests find it through the replica
        manager's held tables, and the store's writes and reads use it from now on (rows of earlier schemas are
        read through it: common/codec.py)."""
        if table.schema_id > self.table.schema_id and table.physical_id == self.table.physical_id:
            self.table = table
            if self.store is not None:
                self.store.take_table(table)

    def note_ready(self, old: BucketRole | None, role: BucketRole, now: float) -> None:
        """When a leadership of ``role`` may serve: ``lease_wait_ms`` after a leadership new to this server is
        heard of; a later push of the same leadership can only make it sooner (the old leader let go)."""
        if not role.leads(self.server_id):
            return
        ready = now + role.lease_wait_ms / 1000.0
        same = old is not None and old.leads(self.server_id) and old.leader_epoch == role.leader_epoch
        self.ready_at = min(self.ready_at, ready) if same else ready

    def check_ready(self, now: float) -> None:
        """LeaderNotAvailableError (retried) while an earlier leader's lease may last (see :attr:`ready_at`)."""
        if now < self.ready_at:
            raise errors.LeaderNotAvailableError(
                f"the new leader of {self.where} waits up to {self.ready_at - now:.1f} s more for the previous "
                f"leader's lease to end: retry in a moment", **self.details)

    def leads_epoch(self, epoch: int | None) -> bool:
        """Whether this replica still leads, under leader epoch ``epoch`` (its role's when the request began)."""
        role = self.role
        if self.closed or not self.leads or (role.leader_epoch if role is not None else None) != epoch:
            return False
        return self.lead is None or not self.lead.ended

    @property
    def leader_epoch(self) -> int:
        """The epoch of this server's leadership of the bucket: its store stamps it on every entry."""
        return self.store.leader_epoch

    @leader_epoch.setter
    def leader_epoch(self, epoch: int) -> None:
        self.store.leader_epoch = epoch

    @property
    def key(self) -> tuple[int, int]:
        """``(physical id, bucket)``: what the replica manager holds it by (a partition's bucket by the
        partition's id: ``common/tables.py``)."""
        return self.table.physical_id, self.bucket

    @property
    def tb(self) -> TableBucket:
        """The bucket, with its partition (what it is named by on the wire and in snapshots)."""
        return self.table.bucket(self.bucket)

    @property
    def where(self) -> str:
        """``bucket 0 of table shop.orders`` or ``bucket 0 of table shop.orders partition 20261127``, for
        messages."""
        return f"bucket {self.bucket} of {self.table.where}"

    @property
    def details(self) -> dict:
        """An error's details naming this bucket (:func:`bucket_details`)."""
        return bucket_details(self.table, self.bucket)

    def changed(self) -> bool:
        return self.store.high_watermark > max(self.snapshot_offset, 0)  # committed changes only
