"""The buckets a tablet server holds a replica of: their stores, roles, snapshots and changelog retention.

The coordinator pushes the full set of buckets held, each with its role
(:meth:`ReplicaManager.update_leadership`, :class:`~kvlease.tablet.replication.roles.BucketRole`):
led, or followed (fetching from the leader it names: ``tablet/replication/fetcher.py``).
Only a leader serves clients (:meth:`ReplicaManager.get`); a replicated
bucket's leader keeps a :class:`~kvlease.tablet.replication.leader.Leadership` (HW,
ISR, writes waiting), made on first use. A leader that becomes a follower
ends its leadership (writes waiting are answered NOT_LEADER) and its scans.
A bucket is replicated while it has more than one replica (its table's, or a
one-replica bucket being moved): a push changing that opens the replica again
in the other mode (a request on the closed store is answered NOT_LEADER).
Buckets no longer held are closed (their data stays on disk), dropped tables'
data is deleted, and so is a bucket's the push says a completed move took off
this server (``removed``). ZooKeeper has the last word (``current_epoch`` and
``table_gone``, read through the tablet's own session): a push from a
coordinator epoch newer than the last one confirmed is taken only if it is
ZooKeeper's current epoch, and a table's data is deleted only once its
``/tables/{id}`` node is gone (also for tables dropped while this server was
down: :meth:`ReplicaManager.remove_dropped_tables`; and the copies of buckets moved off it while it was down
or cut off from ZooKeeper, after the first push of each registration:
:meth:`ReplicaManager.remove_stray_copies`). A snapshot is: RocksDB checkpoint -> upload of the SST files
the last committed snapshot does not have + a manifest -> CommitKvSnapshot.

Buckets are held by physical id (``common/tables.py``; a partition's in ``{data dir}/{partition id}/{bucket}``, its
node at ``/tables/{partition id}``: the checks above hold); a push dropping a partitioned table drops its partitions.

The manager owns four parts, each given what it uses (none reaches into the manager): the views of the
physical tables held, which say which one a request names (``tablet/replicas/held_tables.py``), its snapshots
and changelog retention (``tablet/replicas/snapshots.py``), the replicas whose data is lost or restored
(``tablet/replicas/loss.py``: the manager starts such a replica over, :meth:`ReplicaManager.start_over`)
and the local copies of buckets it no longer holds (``tablet/replicas/local_copies.py``).

Thousands of buckets: taking a bucket opens no file (its store opens them on first use, and the server's
:class:`~kvlease.tablet.bucket.open_buckets.OpenBuckets` parks idle ones); the keeper (``tablet/replicas/keeper.py``)
opens new buckets in the background, learns their latest snapshot from the coordinator and reopens failed ones.
A push's bucket whose role is taken already is skipped. At most ``tablet.buckets.max`` buckets are led: a push naming
more (only a coordinator that did not know it) leaves the newest refused with a clear error, reported unhealthy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Callable, Iterator

from kvlease.common import config as cfg, errors
from kvlease.common.storage import RemoteStorage
from kvlease.common.tables import TableInfo
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.parts import documented_by
from kvlease.client.server_calls import ServerCalls
from kvlease.tablet.bucket.open_buckets import OpenBuckets, open_capacity
from kvlease.tablet.bucket.store import BucketStore
from kvlease.tablet.replicas import loss as replica_loss, stray_copies
from kvlease.tablet.replicas.held_tables import HeldTables
from kvlease.tablet.replicas.local_copies import LocalCopies
from kvlease.tablet.replicas.loss import ReplicaLosses
from kvlease.tablet.replicas.replica import Replica, bucket_details
from kvlease.tablet.replicas.snapshots import ReplicaSnapshots
from kvlease.tablet.replication.leader import Leadership
from kvlease.tablet.replication.leader_lease import LeaderLease, LeaseBasis
from kvlease.tablet.replication.roles import NO_LEADER, BucketRole
from kvlease.tablet.store.snapshot import SnapshotUploader

log = logging.getLogger(__name__)

#: How long an answer waits for the leader lease to be renewed when it finds it lapsed, before NOT_LEADER.
LEASE_WAIT_S = 0.5


class ReplicaManager:
    """The replicas a tablet server holds (see the module docstring). It owns two parts and calls them from
    methods of the same names: :attr:`snapshots` (:class:`~kvlease.tablet.replicas.snapshots.ReplicaSnapshots`:
    snapshots and changelog retention) and :attr:`losses` (:class:`~kvlease.tablet.replicas.loss.ReplicaLosses`:
    restores, unclean takeovers, replicas found lost)."""

    def __init__(self, data_dir: str, config: cfg.Config, storage: RemoteStorage, admin,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000), *,
                 current_epoch: Callable[[], int] | None = None,
                 table_gone: Callable[[int], bool] | None = None, server_id: int = 0,
                 lease: LeaderLease | None = None, monotonic: Callable[[], float] = time.monotonic,
                 server_calls: ServerCalls | None = None,
                 partition_table: Callable[[int], int | None] | None = None) -> None:
        """``current_epoch()``: the active coordinator's epoch as ZooKeeper has it now;
        ``table_gone(physical_id)``: ZooKeeper has no ``/tables/{id}``; ``partition_table(partition_id)``: the
        table ZooKeeper has that partition of (None: no such partition). Each may raise
        RetriableError; None trusts the pushes (no ZooKeeper: unit tests). ``lease``: the server's leader
        lease, which every answer of a bucket led here is checked against (None: always valid, no
        ZooKeeper). ``admin``: a :class:`kvlease.client.admin.AdminClient` (snapshot commits and listings);
        ``server_calls``: this server's own coordinator calls (:class:`kvlease.client.server_calls.ServerCalls`: the
        loss reports; None: no coordinator, unit tests)."""
        self.data_dir = data_dir
        self.server_id = server_id
        self.lease = lease if lease is not None else LeaderLease.unbounded()
        self.monotonic = monotonic
        self.dir_id = ""  # this data dir's id (tablet/replicas/lost_data.py); a push for another one is refused
        #: Run after every push that changed roles (the follower fetchers start and stop there).
        self.role_listeners: list[Callable[[], None]] = []
        #: Run after a leader's HW moved (waiting follower fetches answer).
        self.on_commit: Callable[[], None] = lambda: None
        #: Run when a led bucket's follower is due to join its ISR (the ISR keeper runs at once).
        self.on_isr_due: Callable[[], None] = lambda: None
        self.current_epoch = current_epoch
        self.config = config
        self.storage = storage
        self.server_calls = server_calls  # client.server_calls.ServerCalls: the loss reports
        self.clock_ms = clock_ms
        self.coordinator_epoch = 0
        self._replicas: dict[tuple[int, int], Replica] = {}  # by (physical id, bucket)
        #: The views of the physical tables of the buckets held (and refused), and which one a request names.
        self.tables = HeldTables(partition_table)
        self._lock = threading.Lock()
        #: ``tablet.buckets.max``: the most buckets led; the rest of a push is refused (see the module docstring).
        self.max_buckets = config[cfg.TABLET_MAX_BUCKETS]
        #: The buckets led whose files are open (``tablet.buckets.max-open``).
        self.budget = OpenBuckets(open_capacity(config[cfg.TABLET_MAX_OPEN_BUCKETS]))
        #: Buckets a push named beyond ``max_buckets``: key -> table.
        self.refused: dict[tuple[int, int], TableInfo] = {}
        #: Buckets the keeper has work for (new, failed, snapshot base unknown); it removes them when done.
        self.unsettled: set[tuple[int, int]] = set()
        #: ``(bucket, dropped)`` callbacks (a TableBucket, with its partition) run as a bucket stops being led
        #: (``dropped``: its table was dropped), after it left the map and before its store closes (live scans
        #: end their sessions there).
        self.close_listeners: list[Callable[[TableBucket, bool], None]] = []
        os.makedirs(data_dir, exist_ok=True)
        #: The bucket dirs made here: a missing one is a lost replica (tablet/replicas/loss.py).
        self.held = replica_loss.HeldBuckets(data_dir)
        #: The local copies of buckets not held: dropped tables', moved off, strays (tablet/replicas/local_copies.py).
        self.copies = LocalCopies(data_dir, self.bucket_dir, self.held, table_gone)
        self.snapshots = ReplicaSnapshots(admin, storage, config, self.lease, server_id, self.bucket_dir)
        self.losses = ReplicaLosses(server_id, self.bucket_dir, self.unsettled, self._lock, server_calls, storage,
                                    admin, config, self.start_over)

    @property
    def admin(self):
        """The :class:`kvlease.client.admin.AdminClient` of snapshot commits and listings and of restores (setting
        it sets its parts')."""
        return self.snapshots.admin

    @admin.setter
    def admin(self, admin) -> None:
        self.snapshots.admin = self.losses.admin = admin

    # -- leadership -----------------------------------------------------------------------

    def bucket_dir(self, physical_id: int, bucket: int) -> str:
        return os.path.join(self.data_dir, str(physical_id), str(bucket))

    def update_leadership(self, coordinator_epoch: int, held: list[BucketRole | tuple[TableInfo, int, int]],
                          dropped_tables: list[int], basis: LeaseBasis | None = None) -> None:
        """Hold exactly ``held`` (roles, or ``(table, bucket, leader_epoch)`` of buckets led alone); delete
        dropped tables' data (physical ids: the module docstring). ``basis``: what the leader lease rests on from
        now on, taken once the roles are (a renewal that finds the demotions a push reports must not serve a
        leadership the push ended).

        Raises CoordinatorFencedError for an epoch older than the last one taken
        or than ZooKeeper's, InvalidRequestError for one newer than ZooKeeper's
        (not a coordinator's): nothing changes then. A dropped table whose node
        ZooKeeper still has keeps its data.
        """
        now = self.monotonic()
        roles = [r if isinstance(r, BucketRole) else BucketRole.led(*r, self.server_id) for r in held]
        removed, roles = {r.key for r in roles if r.removed}, [r for r in roles if not r.removed]
        stopped_leading: list[Replica] = []
        with self._lock:
            self._confirm_epoch(coordinator_epoch)
            wanted = {role.key: role for role in roles}
            gone = self.copies.dropped(self.tables.dropped(dropped_tables) - {k[0] for k in wanted}, coordinator_epoch)
            self.coordinator_epoch = coordinator_epoch
            try:
                for key in [k for k in self._replicas if k not in wanted]:
                    self._close(key, dropped=key[0] in gone)
                self.refused = {}
                for key, role in sorted(wanted.items()):
                    if self._take(key, role, now):
                        stopped_leading.append(self._replicas[key])
            finally:  # forget the tables no longer held (also when opening a bucket failed)
                self.tables.keep([*(r.table for r in self._replicas.values()), *self.refused.values()])
            self.copies.delete_tables(gone)
            self.copies.delete_moved_off(removed - set(wanted))
        if basis is not None:
            self.lease.take(basis)
        for replica in stopped_leading:  # scans of a bucket no longer led end: their clients go to the new leader
            self._tell_closing(replica, False)
        for listener in self.role_listeners:
            listener()
        if self.refused:
            log.warning("asked to hold %d buckets, over this server's capacity of %d (tablet.buckets.max): %d "
                        "are not served", len(wanted), self.max_buckets, len(self.refused))
        led = sum(1 for r in roles if r.leads(self.server_id))
        log.info("holding %d buckets, leading %d (coordinator epoch %d)", len(wanted) - len(self.refused), led,
                 coordinator_epoch)

    def _take(self, key: tuple[int, int], role: BucketRole, now: float) -> bool:
        """Hold ``key`` in a push's ``role`` (received at ``now``): whether its replica stopped leading. The role it
        took (the same object: ``PushedRoles``), if it names no loss, is skipped. Hold the lock."""
        replica = self._replicas.get(key)
        if replica is not None and replica.role is role and role.latest_loss is None:
            return False
        # A replica's loss work is known before a reader (unlocked) can see it with its role:
        # a bucket to restore never answers from the data it is to replace.
        replica = self._held(key, role)
        if replica is not None:
            self.losses.note_loss(replica, role)
            return replica.take_role(role, now)
        if len(self._replicas) >= self.max_buckets:
            self.refused[key] = role.table
            return False
        replica = self._open(role, now)  # no file opened yet: see the module docstring
        self.tables.add(role.table)  # known before it serves
        self.unsettled.add(key)
        self.losses.note_loss(replica, role)
        if self.held.lost(*key, replica.store.dir):
            self.lose(replica, replica_loss.missing_reason(replica.store.dir))
        self._replicas[key] = replica
        return False

    def _held(self, key: tuple[int, int], role: BucketRole) -> Replica | None:
        """The replica held of ``key`` (None: none), closed and opened again in the other mode (the same files;
        a new store, uploader and leadership) if ``role`` changes it. Hold the lock."""
        replica = self._replicas.get(key)
        if replica is None or not replica.changes_mode(role):
            return replica
        self._close(key)  # writes in flight finish first, live scans end
        replica = self._replicas[key] = self._open(role, self.monotonic())
        self.unsettled.add(key)  # the keeper learns its snapshot base again
        log.info("bucket %d of %s is %s now (replicas %s, leader %d, leader epoch %d)", role.bucket,
                 role.table.where, "replicated" if role.replicated else "one replica", list(role.replicas),
                 role.leader, role.leader_epoch)
        return replica

    def _confirm_epoch(self, coordinator_epoch: int) -> None:
        """Refuse a push of a coordinator epoch older than the last one taken; take a newer one only if it is
        ZooKeeper's current one. A confirmed epoch is kept (``self.coordinator_epoch``): pushes of the same
        epoch read nothing. Hold the lock."""
        if coordinator_epoch < self.coordinator_epoch:
            raise errors.CoordinatorFencedError(
                f"leadership from coordinator epoch {coordinator_epoch} < {self.coordinator_epoch}")
        if coordinator_epoch == self.coordinator_epoch or self.current_epoch is None:
            return
        current = self.current_epoch()
        if coordinator_epoch < current:
            raise errors.CoordinatorFencedError(
                f"leadership from coordinator epoch {coordinator_epoch}, but ZooKeeper's current coordinator "
                f"epoch is {current}: that coordinator was deposed")
        if coordinator_epoch > current:
            raise errors.InvalidRequestError(
                f"leadership from coordinator epoch {coordinator_epoch}, but ZooKeeper's current coordinator "
                f"epoch is {current}: not sent by the active coordinator, refused")

    def remove_dropped_tables(self) -> list[int]:
        """Delete the local data of physical tables ZooKeeper no longer has (dropped while this server was
        down, or a drop push that did not arrive); returns their ids. Table and partition ids are never reused."""
        with self._lock:
            return self.copies.remove_dropped({physical_id for physical_id, _bucket in self._replicas})

    def remove_stray_copies(self) -> stray_copies.StrayChoice | None:
        """Delete the bucket dirs of existing tables the last push neither holds nor refused: copies a
        move took off this server while it was down or cut off from ZooKeeper (tablet/replicas/stray_copies.py).
        None (nothing done) before a push was taken. Run after the first push of each ZooKeeper session the
        server registered in (see tablet/server.py)."""
        with self._lock:
            if self.coordinator_epoch == 0:
                return None
            return self.copies.remove_strays(set(self._replicas) | set(self.refused))

    def _open(self, role: BucketRole, now: float) -> Replica:
        table, bucket = role.table, role.bucket
        key = role.key
        store = BucketStore.from_config(self.bucket_dir(*key), table, self.config,
                                        clock_ms=self.clock_ms, bucket=bucket, budget=self.budget, lazy=True,
                                        on_failure=lambda: self.unsettled.add(key), replicated=role.replicated)
        if not role.replicated:
            store.leader_epoch = role.leader_epoch  # stamped on every changelog entry it appends
        uploader = SnapshotUploader(self.storage, table.bucket(bucket),  # a partition's: its files name it
                                    io_threads=self.config[cfg.SNAPSHOT_UPLOAD_THREADS], clock_ms=self.clock_ms)
        # a follower without files rebuilds from a snapshot; a leader's missing files are a new bucket (or a
        # lost disk: tablet/replicas/lost_data.py), never a reason to rebuild later when it follows
        fresh = (role.replicated and not role.leads(self.server_id)
                 and not os.path.exists(os.path.join(store.dir, "log")))
        replica = Replica(table, bucket, store, uploader, role=role, server_id=self.server_id,
                          on_commit=lambda: self.on_commit(), on_isr_due=lambda: self.on_isr_due(), fresh=fresh)
        replica.note_ready(None, role, now)  # when it may serve, if it leads
        return replica

    def _close(self, key: tuple[int, int], dropped: bool = False) -> None:
        replica = self._replicas.pop(key)
        with replica.fetch_lock:
            replica.closed = True
            if replica.lead is not None:
                replica.lead.end()
        self._tell_closing(replica, dropped)
        with replica.snapshot_lock:
            replica.store.close()

    def start_over(self, replica: Replica, prepare: Callable[[], None]) -> None:
        """Replace ``replica``, if it is still the one held of its bucket, by a new one over its files (the
        same role; it may serve when the old one could): the old one is closed (its leadership and live scans
        end) and ``prepare()`` runs on its closed files, its fetches and snapshot held off; then the role
        listeners run. For a replica whose data was lost (:meth:`ReplicaLosses.settle_loss`)."""
        key = replica.key
        with self._lock:
            if self._replicas.get(key) is not replica:
                return
            with replica.fetch_lock, replica.snapshot_lock:
                replica.closed = True
                if replica.lead is not None:
                    replica.lead.end()
                self._tell_closing(replica, False)
                replica.store.close()
                prepare()
            fresh = self._open(replica.role, self.monotonic())
            fresh.ready_at = replica.ready_at  # the same leadership: it may serve when the old one could
            self._replicas[key] = fresh
            self.unsettled.add(key)
            self.losses.note_loss(fresh, replica.role)  # a restore carried out is confirmed before it serves
        for listener in self.role_listeners:
            listener()

    def end_scans(self, replica: Replica) -> None:
        """End the live scan sessions of a bucket that stays led, as a leadership change does (their
        clients start the bucket again): its failed files can then be reopened."""
        self._tell_closing(replica, False)

    def _tell_closing(self, replica: Replica, dropped: bool) -> None:
        for listener in self.close_listeners:
            try:
                listener(replica.tb, dropped)
            except Exception:  # the store closes anyway
                log.exception("close listener of bucket %s failed", replica.tb)

    def get(self, physical_id: int, bucket: int) -> Replica:
        """The replica of a bucket this server leads; NotLeaderError (LeaderNotAvailableError: the bucket has
        no leader now) otherwise."""
        replica = self.replica(physical_id, bucket)
        if not replica.leads:
            if replica.role.leader == NO_LEADER:
                why = replica.role.offline_reason or "it has no live in-sync replica to lead it"
                raise errors.LeaderNotAvailableError(f"{replica.where} is offline: {why}", **replica.details)
            raise errors.NotLeaderError(f"this tablet server follows {replica.where}; tablet server "
                                        f"{replica.role.leader} leads it", **replica.details)
        if replica.loss_work is not None:
            raise errors.LeaderNotAvailableError(f"{replica.where} {replica_loss.doing(replica)}", **replica.details)
        replica.check_ready(self.monotonic())  # an earlier leader's lease is over
        if replica.replicated:
            replica.leadership().check_read()  # a new leader serves once it has every committed write
        return replica

    @contextlib.contextmanager
    def leading(self, physical_id: int, bucket: int) -> Iterator[Replica]:
        """The replica of a bucket led here (:meth:`get`) for a request; its answer, an error too, is confirmed once
        the body is done (:meth:`confirm`): a leadership that ended or whose lease lapsed meanwhile answers NOT_LEADER
        instead, never what its stale state says (docs/architecture.md, "Leader leases")."""
        replica = self.get(physical_id, bucket)
        epoch = replica.role.leader_epoch if replica.role is not None else None
        try:
            yield replica
        finally:
            self.confirm(replica, epoch)

    def confirm(self, replica: Replica, epoch: int | None) -> None:
        """Raise NotLeaderError unless ``replica`` still leads under leader ``epoch`` (its role's when the
        request began) and the leader lease is valid now, after the request read what it answers: then no
        other leader acknowledged a write before now, and the answer is at least as new as any write
        acknowledged before the request was sent. A lapsed lease is waited for briefly (a renewal in
        flight), then refused."""
        # leased, then leading, then still leased: a push that ended the leadership is taken before its lease
        # basis, so a lease renewed on that basis never covers the leadership it ended
        leased = self.lease.wait_valid(LEASE_WAIT_S)
        if not replica.leads_epoch(epoch):
            raise errors.NotLeaderError(f"this tablet server stopped leading {replica.where} (leader epoch {epoch}) "
                                        f"while the request ran: retry it on its leader", **replica.details)
        if not leased or not self.lease.valid():
            raise errors.NotLeaderError(f"this tablet server cannot answer for {replica.where}: its leader lease "
                                        f"lapsed (it could not confirm with ZooKeeper that it still leads): retry it "
                                        f"on the bucket's leader", **replica.details)

    def replica(self, physical_id: int, bucket: int) -> Replica:
        """The replica of a bucket held here, led or followed; NotLeaderError if none."""
        replica = self._replicas.get((physical_id, bucket))
        if replica is not None:
            return replica
        view = self.tables.get(physical_id)
        where = f"bucket {bucket} of " + (view.where if view is not None else f"table {physical_id}")
        details = bucket_details(view, bucket) if view is not None else {"table_id": physical_id, "bucket": bucket}
        if (physical_id, bucket) in self.refused:
            raise errors.LeaderNotAvailableError(
                f"{where} is assigned to this tablet server, which cannot serve it: it leads its capacity of "
                f"{self.max_buckets} buckets (tablet.buckets.max)", **details)
        raise errors.NotLeaderError(f"this tablet server does not lead {where}", **details)

    def table(self, physical_id: int) -> TableInfo | None:
        """The view of physical table ``physical_id`` if a bucket of it is held here, else None (no ZooKeeper read)."""
        return self.tables.get(physical_id)

    def check_table(self, physical_id: int) -> None:
        """TableNotExistError if no bucket of ``physical_id`` is held here and ZooKeeper has no such table."""
        if any(key[0] == physical_id for key in list(self._replicas)):
            return
        if self.copies.gone(physical_id):
            raise errors.TableNotExistError(f"table id {physical_id} does not exist (never created, or dropped)",
                                            table_id=physical_id)

    def replicas(self, physical_id: int | None = None) -> list[Replica]:
        """The replicas this server leads (of ``physical_id``), by physical table and bucket."""
        return [r for r in self.all_replicas(physical_id) if r.leads and r.loss_work is None]

    def followed(self) -> list[Replica]:
        """The replicas this server follows a live leader of."""
        return [r for r in self.all_replicas()
                if not r.leads and r.role.leader != NO_LEADER and not r.closed and r.loss_work is None]

    def leaderships(self) -> list[Leadership]:
        return [r.lead for r in self.all_replicas() if r.lead is not None and not r.lead.ended]

    def all_replicas(self, physical_id: int | None = None) -> list[Replica]:
        """Every replica held here, led or followed (of ``physical_id``)."""
        return sorted((r for r in list(self._replicas.values()) if physical_id is None or r.key[0] == physical_id),
                      key=lambda r: r.key)

    def close(self) -> None:
        with self._lock:
            for key in list(self._replicas):
                self._close(key)
            self.tables.keep(())
            self.refused = {}

    # -- the parts' calls -------------------------------------------------------------------

    @documented_by(ReplicaSnapshots.snapshot)
    def snapshot(self, replica: Replica, force: bool = False) -> SnapshotHandle | None:
        return self.snapshots.snapshot(replica, force)

    def snapshot_changed(self) -> int:
        """Snapshot every led bucket that changed since its last snapshot, then apply the changelog
        retention of those committed (of every bucket held, once every ``log.retention.check-interval``);
        returns how many were snapshotted."""
        return self.snapshots.snapshot_changed(self.replicas, self.followed)

    @documented_by(ReplicaLosses.lose)
    def lose(self, replica: Replica, reason: str) -> None:
        self.losses.lose(replica, reason)

    @documented_by(ReplicaLosses.settle_loss)
    def settle_loss(self, replica: Replica) -> None:
        self.losses.settle_loss(replica)
