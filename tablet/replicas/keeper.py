"""The tablet server's background care of its buckets: open new ones, learn their snapshots, reopen failed ones.

Taking a bucket opens no file (``tablet/replicas/manager.py``), so a server told it
leads 10,000 buckets answers the push at once. The keeper then, one bucket at
a time, for each bucket in :attr:`ReplicaManager.unsettled`:

- opens its files if they never were (recovering it: replaying the changelog
  into RocksDB; the open-bucket budget parks it again later), so its offsets
  are known and the snapshot timer sees whether it changed;
- asks the coordinator for its latest committed snapshot (the next snapshot id
  follows it);
- reopens it if it failed (a full disk, too many open files) and its backoff
  passed: a bucket recovers without a request, and without a restart; a led
  bucket whose files are damaged beyond a reopen is reported lost instead
  (``tablet/replicas/loss.py``), and an opened one is recorded as held. Live
  scan sessions of a failed bucket are ended first, as a leadership change
  ends them (their clients start the bucket again): their snapshots would
  keep the failed files open.

A round takes each bucket off the set before it looks at its replica and puts
it back unless it is open or parked without a failure and its snapshot base is
known, so what a push (loss work, a reopened replica) or a failure adds
meanwhile is kept for the next round. A request for a bucket the keeper has
not reached yet opens it itself.
"""

from __future__ import annotations

import logging

from kvlease.common import errors
from kvlease.tablet.bucket import damage as bucket_damage
from kvlease.tablet.periodic import Periodic
from kvlease.tablet.replicas import loss as replica_loss
from kvlease.tablet.replicas.manager import ReplicaManager

log = logging.getLogger(__name__)


class BucketKeeper(Periodic):
    """Runs :meth:`run_once` every ``interval_s`` on a daemon thread (:meth:`start`, :meth:`stop`)."""

    name = "bucket-keeper"

    def __init__(self, replicas: ReplicaManager, interval_s: float = 0.5) -> None:
        super().__init__(interval_s)
        self.replicas = replicas

    def run_once(self) -> int:
        """One round over the unsettled buckets; returns how many it settled."""
        settled = 0
        for key in sorted(list(self.replicas.unsettled)):
            if self._stop.is_set():
                break
            # taken off before its replica is looked at: a push (loss work, a reopened replica) or a failure
            # adding it meanwhile keeps it for the next round, instead of being undone by a discard at the end
            self.replicas.unsettled.discard(key)
            try:
                replica = self.replicas.replica(*key)
            except errors.KvLeaseError:  # no longer held here
                continue
            if self._settle(replica):
                settled += 1
            else:
                self.replicas.unsettled.add(key)
        return settled

    def _settle(self, replica) -> bool:
        """Carry out what ``replica`` needs; whether it is settled (else it stays unsettled)."""
        if replica.loss_work is not None:
            try:
                self.replicas.settle_loss(replica)
            except Exception as exc:  # the coordinator or remote storage is away: next round
                log.warning("%s: cannot %s yet: %s", replica.tb, replica.loss_work, exc)
            return False  # a restored bucket's fresh replica is unsettled: the next round opens it
        files = replica.store.files
        if files.failure is not None and not files.retry_in() and files.held_by_snapshots():
            self.replicas.end_scans(replica)  # scan sessions keep the failed files open
        files.repair()
        damage = bucket_damage.damage_of(replica.store)
        if damage is not None and replica.leads:  # a reopen cannot cure it: the coordinator decides
            self.replicas.lose(replica, replica_loss.damaged_reason(damage))
            return False
        if files.failure is not None or not files.known:
            return False  # the open failed: tried again after its backoff
        self.replicas.held.mark(*replica.key)  # its dir exists now: were it gone later, the replica is lost
        try:
            if replica.leads:
                self.replicas.snapshots.learn_base(replica)
        except errors.KvLeaseError as exc:  # the coordinator is away: next round
            log.debug("cannot learn the latest snapshot of %s yet: %s", replica.tb, exc)
            return False
        return files.failure is None  # failed meanwhile: its failure may have been told before the key was taken
