"""A replica's data found lost by its own tablet server: report it, then start over as an ordinary lost replica.

Two ways a tablet server finds one bucket's data lost while the rest of its
data dir is fine (a whole wiped data dir is caught by its id instead:
``tablet/replicas/lost_data.py``):

- **damaged files** at open (``tablet/bucket/damage.py``: RocksDB reports
  corruption, the changelog is damaged beyond a torn tail, or the two
  disagree) of a bucket it *leads* (replicated or with one replica). A
  follower's damaged files are rebuilt at once (``tablet/replication/rebuild.py``);
  a leader's hold writes no other copy may have, so the coordinator decides;
- **a missing bucket dir** the data dir says it had: :class:`HeldBuckets`
  keeps ``{tablet.data-dir}/held/{physical_id}-{bucket}``, an empty file made
  once the bucket's files first opened and removed with the bucket's
  directory (a dropped table, a completed move off the server).

Either way the replica neither serves nor fetches (``LEADER_NOT_AVAILABLE``
naming the reason) and the keeper reports it (``ReportReplicaLoss``, sent
again each round until the coordinator answered; idempotent there). The
coordinator takes it out of the ISR: another in-sync replica leads, or the
bucket is offline with the reason (none left, or one replica). Only once a
push shows it out of the ISR are its damaged files moved to
``{bucket dir}/damaged/`` (never before: an operator may want them while the
bucket is still this replica's) and the replica starts empty: a follower is
rebuilt from the remote snapshot, a one-replica bucket waits for
``kvlease bucket restore`` (which keeps ``damaged/``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from kvlease.common import config as cfg
from kvlease.common.storage import RemoteStorage
from kvlease.client.server_calls import LogEnd
from kvlease.tablet.bucket import damage as bucket_damage
from kvlease.tablet.replicas import lost_data
from kvlease.tablet.replicas.replica import Replica
from kvlease.tablet.replication.roles import BucketRole

log = logging.getLogger(__name__)

REPORT = "report"  # Replica.loss_work: report the replica lost, wait until it is out of the ISR
HELD = "held"
MAX_REASON = 300  # characters of an open failure kept in the reason (RocksDB's can be long)


def damaged_reason(damage: BaseException) -> str:
    text = " ".join(str(damage).split())
    return "its files are damaged: " + (text if len(text) <= MAX_REASON else text[:MAX_REASON] + "…")


def missing_reason(bucket_dir: str) -> str:
    return f"its bucket directory {bucket_dir} is gone"


def out_of_isr(role, server_id: int) -> bool:
    """Whether the coordinator took ``server_id``'s replica out of the ISR (``role``: its newest push)."""
    return role is not None and server_id not in role.isr and not role.leads(server_id)


def move_aside(bucket_dir: str, store) -> None:
    """Move a closed store's damaged files aside (nothing to move for a missing dir)."""
    damage = bucket_damage.damage_of(store)
    if damage is not None:
        bucket_damage.move_aside(bucket_dir, f"the coordinator took this replica out of the ISR; {damage}")


class HeldBuckets:
    """The buckets whose directory this tablet server made (see the module docstring). Thread-safe enough:
    each bucket is marked by one thread (the keeper) and forgotten under the replica manager's lock."""

    def __init__(self, data_dir: str) -> None:
        self.dir = os.path.join(data_dir, HELD)
        os.makedirs(self.dir, exist_ok=True)
        self._known = set(os.listdir(self.dir))

    @staticmethod
    def _name(table_id: int, bucket: int) -> str:
        return f"{table_id}-{bucket}"

    def mark(self, table_id: int, bucket: int) -> None:
        """Record that the bucket's directory exists (made by its first open). Cheap when already marked."""
        name = self._name(table_id, bucket)
        if name in self._known:
            return
        with open(os.path.join(self.dir, name), "a"):
            pass
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._known.add(name)

    def lost(self, table_id: int, bucket: int, bucket_dir: str) -> bool:
        """Whether the bucket's directory was made here and is gone now."""
        return self._name(table_id, bucket) in self._known and not os.path.isdir(bucket_dir)

    def forget(self, table_id: int, bucket: int | None = None) -> None:
        """The bucket's directory (``bucket`` None: every bucket of the table) is deleted on purpose."""
        prefix = f"{table_id}-"
        names = ([self._name(table_id, bucket)] if bucket is not None
                 else [n for n in list(self._known) if n.startswith(prefix)])
        for name in names:
            self._known.discard(name)
            try:
                os.unlink(os.path.join(self.dir, name))
            except FileNotFoundError:
                pass


def doing(replica) -> str:
    """What a replica with ``loss_work`` does before it serves, for LEADER_NOT_AVAILABLE."""
    if replica.loss_work in (lost_data.RESTORE, lost_data.CONFIRM):
        return "is restoring: it serves once done"
    if replica.loss_work == lost_data.UNCLEAN:
        return "is taking over after an unclean election: it serves once done"
    return (f"lost its data on tablet server {replica.server_id} ({replica.lost_reason}): the coordinator moves "
            "its leadership to another in-sync replica or marks it offline")


class ReplicaLosses:
    """The lost-data part of :class:`kvlease.tablet.replicas.manager.ReplicaManager`, which owns it: restores, unclean takeovers
    (``tablet/replicas/lost_data.py``) and the replicas this server finds lost (the module docstring).

    ``server_id``: this server's; ``bucket_dir(physical_id, bucket)``: a bucket's local dir; ``unsettled``: the
    manager's set of buckets the keeper has work for (a bucket with loss work is added); ``lock``: the
    manager's lock (a push changes the replicas' loss work under it); ``server_calls``: this server's
    coordinator calls (:class:`kvlease.client.server_calls.ServerCalls`: the reports); ``storage``, ``admin`` and
    ``config``: what a restore reads the snapshot with; ``start_over(replica, prepare)``: the manager closes
    ``replica``, runs ``prepare()`` on its closed files and holds a new replica over them in its place
    (:meth:`kvlease.tablet.replicas.manager.ReplicaManager.start_over`)."""

    def __init__(self, server_id: int, bucket_dir: Callable[[int, int], str], unsettled: set[tuple[int, int]],
                 lock: threading.Lock, server_calls, storage: RemoteStorage, admin, config: cfg.Config,
                 start_over: Callable[[Replica, Callable[[], None]], None]) -> None:
        self.server_id = server_id
        self.bucket_dir = bucket_dir
        self.unsettled = unsettled
        self._lock = lock
        self.server_calls = server_calls
        self.storage = storage
        self.admin = admin
        self.config = config
        self._start_over = start_over

    def note_loss(self, replica: Replica, role: BucketRole) -> None:
        """Mark a replica that must be restored or report its takeover before it serves (the keeper does it).
        A replica reported lost stays so until it is out of the ISR (a restore comes first). Hold the
        manager's lock."""
        work = lost_data.work_for(role, self.bucket_dir(*role.key), self.server_id, pending=replica.loss_work)
        if work is None and replica.loss_work == REPORT:
            work = REPORT
        replica.loss_work = work
        if work is not None:
            self.unsettled.add(role.key)

    def lose(self, replica: Replica, reason: str) -> None:
        """This server found ``replica``'s data lost (``reason``): it stops serving and fetching, and the
        keeper reports it (:meth:`settle_loss`)."""
        if replica.loss_work is not None:
            return
        replica.lost_reason, replica.loss_reported, replica.loss_work = reason, False, REPORT
        self.unsettled.add(replica.key)
        log.error("%s: this replica's data is lost (%s): reporting it to the coordinator", replica.tb, reason)

    def settle_loss(self, replica: Replica) -> None:
        """Carry out ``replica.loss_work`` (the keeper's thread): a restore replaces the replica by one over
        the restored files, which confirms it (the next round); an unclean takeover reports its log end; a
        lost replica is reported, then (once out of the ISR) started over empty. Raises on failure (tried
        again)."""
        tb = replica.tb
        if replica.loss_work == lost_data.CONFIRM:
            epoch = replica.role.latest_loss.leader_epoch
            self.server_calls.confirm_restore(self.server_id, tb.table_id, tb.bucket, epoch,
                                              partition_id=tb.partition_id)
            with self._lock:  # a push meanwhile may have brought a newer restore: that one stays
                if replica.loss_work == lost_data.CONFIRM:
                    replica.loss_work = None
            log.info("%s: the restore of leader epoch %d is carried out and confirmed: it serves", replica.tb, epoch)
            return
        if replica.loss_work == lost_data.UNCLEAN:
            with replica.store.files.use():
                end = replica.store.log_end_offset
            self.server_calls.report_log_ends(
                self.server_id, [LogEnd(tb.table_id, tb.bucket, replica.role.leader_epoch, end, tb.partition_id)],
                takeover=True)
            replica.loss_work = None
            log.warning("%s: took over after an unclean election with its log ending at offset %d", replica.tb, end)
            return
        if replica.loss_work == REPORT:
            if not replica.loss_reported:
                self.server_calls.report_replica_loss(self.server_id, tb.table_id, tb.bucket, replica.lost_reason,
                                                      partition_id=tb.partition_id)
                replica.loss_reported = True
            if not out_of_isr(replica.role, self.server_id):
                return  # the coordinator's push is on its way: the next round looks again
        self._start_over(replica, lambda: self._replace_files(replica))

    def _replace_files(self, replica: Replica) -> None:
        """The files of a lost (or restored) replica, closed: moved aside if damaged, then restored from
        the snapshot its restore names, or left to start empty."""
        bucket_dir = self.bucket_dir(*replica.key)
        move_aside(bucket_dir, replica.store)
        if replica.loss_work == lost_data.RESTORE:
            lost_data.restore_files(bucket_dir, replica.role, self.storage, self.admin,
                                    self.server_id, self.config[cfg.SNAPSHOT_UPLOAD_THREADS])
        else:
            log.warning("%s: out of the ISR after its loss (%s): it starts empty%s", replica.tb,
                        replica.lost_reason, ", rebuilt from the remote snapshot" if replica.replicated
                        else "; `kvlease bucket restore` brings it back")
