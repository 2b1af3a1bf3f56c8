"""The buckets a tablet server leads: their stores, snapshots and changelog retention.

The coordinator pushes the full set of led buckets (:meth:`ReplicaManager.
update_leadership`); buckets no longer led are closed (their data stays on
disk: with one replica per bucket they come back here), dropped tables'
data is deleted. ZooKeeper has the last word (``current_epoch`` and
``table_gone``, read through the tablet's own session): a push from a
coordinator epoch newer than the last one confirmed is taken only if it is
ZooKeeper's current epoch, and a table's data is deleted only once its
``/tables/{id}`` node is gone (also for tables dropped while this server was
down: :meth:`ReplicaManager.remove_dropped_tables`). A snapshot is: RocksDB checkpoint -> upload of the SST files
the last committed snapshot does not have + a manifest -> CommitKvSnapshot.

Thousands of buckets: taking a bucket opens no file (its store opens them on
first use, and the server's :class:`~tablet.open_buckets.OpenBuckets` parks
idle ones); the keeper (``tablet/bucket_keeper.py``) opens new buckets in the
background, learns their latest snapshot from the coordinator and reopens
failed ones. At most ``tablet.buckets.max`` buckets are led: a push naming more
(the coordinator places no more than that, so only one that did not know it)
leaves the newest ones refused, answered with a clear error and reported
unhealthy.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from common import config as cfg
from common import errors
from common.kvsnapshot import missing_files
from common.storage import RemoteStorage
from common.tables import TableInfo
from common.model import SnapshotHandle, TableBucket
from tablet.bucket import BucketStore
from tablet.open_buckets import OpenBuckets, open_capacity
from tablet.snapshot import SnapshotUploader, upload_and_commit

log = logging.getLogger(__name__)


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

    @property
    def leader_epoch(self) -> int:
        """The epoch of this server's leadership of the bucket: its store stamps it on every entry."""
        return self.store.leader_epoch

    @leader_epoch.setter
    def leader_epoch(self, epoch: int) -> None:
        self.store.leader_epoch = epoch

    @property
    def tb(self) -> TableBucket:
        return TableBucket(self.table.table_id, self.bucket)

    def changed(self) -> bool:
        return self.store.log_end_offset > max(self.snapshot_offset, 0)


class ReplicaManager:
    def __init__(self, data_dir: str, config: cfg.Config, storage: RemoteStorage, admin,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000), *,
                 current_epoch: Callable[[], int] | None = None,
                 table_gone: Callable[[int], bool] | None = None) -> None:
        """``current_epoch()``: the active coordinator's epoch as ZooKeeper has it now;
        ``table_gone(table_id)``: ZooKeeper has no ``/tables/{id}``. Both may raise
        RetriableError; None trusts the pushes (no ZooKeeper: unit tests)."""
        self.data_dir = data_dir
        self.current_epoch = current_epoch
        self.table_gone = table_gone
        self.config = config
        self.storage = storage
        self.admin = admin  # client.admin.AdminClient: snapshot commits and listings
        self.clock_ms = clock_ms
        self.coordinator_epoch = 0
        self._replicas: dict[tuple[int, int], Replica] = {}
        self._tables: dict[int, TableInfo] = {}  # the tables of the led buckets; replaced whole, read unlocked
        self._lock = threading.Lock()
        #: ``tablet.buckets.max``: the most buckets led; the rest of a push is refused (see the module docstring).
        self.max_buckets = config[cfg.TABLET_MAX_BUCKETS]
        #: The buckets led whose files are open (``tablet.buckets.max-open``).
        self.budget = OpenBuckets(open_capacity(config[cfg.TABLET_MAX_OPEN_BUCKETS]))
        #: Buckets a push named beyond ``max_buckets``: key -> table.
        self.refused: dict[tuple[int, int], TableInfo] = {}
        #: Buckets the keeper has work for (new, failed, snapshot base unknown); it removes them when done.
        self.unsettled: set[tuple[int, int]] = set()
        #: ``(table_id, bucket, dropped)`` callbacks run as a bucket stops being led (``dropped``: its
        #: table was dropped), after it left the map and before its store closes (live scans end their
        #: sessions there).
        self.close_listeners: list[Callable[[int, int, bool], None]] = []
        os.makedirs(data_dir, exist_ok=True)

    # -- leadership -----------------------------------------------------------------------

    def bucket_dir(self, table_id: int, bucket: int) -> str:
        return os.path.join(self.data_dir, str(table_id), str(bucket))

    def update_leadership(self, coordinator_epoch: int, led: list[tuple[TableInfo, int, int]],
                          dropped_tables: list[int]) -> None:
        """Lead exactly ``led`` ``(table, bucket, leader_epoch)``; delete dropped tables' data.

        Raises CoordinatorFencedError for an epoch older than the last one taken
        or than ZooKeeper's, InvalidRequestError for one newer than ZooKeeper's
        (not a coordinator's): nothing changes then. A dropped table whose node
        ZooKeeper still has keeps its data.
        """
        with self._lock:
            if coordinator_epoch < self.coordinator_epoch:
                raise errors.CoordinatorFencedError(
                    f"leadership from coordinator epoch {coordinator_epoch} < {self.coordinator_epoch}")
            if coordinator_epoch > self.coordinator_epoch:
                self._confirm_epoch(coordinator_epoch)
            wanted = {(t.table_id, b): (t, epoch) for t, b, epoch in led}
            gone = set()
            for table_id in set(dropped_tables) - {k[0] for k in wanted}:
                if self._gone(table_id):
                    gone.add(table_id)
                else:
                    log.warning("push of coordinator epoch %d drops table %d, which ZooKeeper still has: "
                                "its data stays", coordinator_epoch, table_id)
            self.coordinator_epoch = coordinator_epoch
            try:
                for key in [k for k in self._replicas if k not in wanted]:
                    self._close(key, dropped=key[0] in gone)
                self.refused = {}
                for key, (table, epoch) in sorted(wanted.items()):
                    replica = self._replicas.get(key)
                    if replica is not None:
                        replica.leader_epoch = epoch
                        continue
                    if len(self._replicas) >= self.max_buckets:
                        self.refused[key] = table
                        continue
                    replica = self._open(table, key[1], epoch)  # no file opened yet: see the module docstring
                    self._tables = {**self._tables, table.table_id: table}  # known before it serves a call
                    self._replicas[key] = replica
                    self.unsettled.add(key)
            finally:  # forget the tables no longer led (also when opening a bucket failed)
                self._tables = {r.table.table_id: r.table for r in self._replicas.values()}
            for table_id in sorted(gone):
                shutil.rmtree(os.path.join(self.data_dir, str(table_id)), ignore_errors=True)
        if self.refused:
            log.warning("asked to lead %d buckets, over this server's capacity of %d (tablet.buckets.max): %d "
                        "are not served", len(wanted), self.max_buckets, len(self.refused))
        log.info("leading %d buckets (coordinator epoch %d)", len(wanted) - len(self.refused), coordinator_epoch)

    def _confirm_epoch(self, coordinator_epoch: int) -> None:
        """Take a newer coordinator epoch only if it is ZooKeeper's current one. A confirmed
        epoch is kept (``self.coordinator_epoch``): pushes of the same epoch read nothing."""
        if self.current_epoch is None:
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

    def _gone(self, table_id: int) -> bool:
        return True if self.table_gone is None else self.table_gone(table_id)

    def remove_dropped_tables(self) -> list[int]:
        """Delete the local data of tables ZooKeeper no longer has (dropped while this server was
        down, or a drop push that did not arrive); returns their ids. Table ids are never reused."""
        removed = []
        with self._lock:
            led = {table_id for table_id, _bucket in self._replicas}
            try:
                names = os.listdir(self.data_dir)
            except FileNotFoundError:
                return []
            for name in sorted(names):
                if not name.isdigit() or int(name) in led:
                    continue
                if self._gone(int(name)):
                    shutil.rmtree(os.path.join(self.data_dir, name), ignore_errors=True)
                    removed.append(int(name))
        if removed:
            log.info("removed the local data of dropped tables %s", removed)
        return removed

    def _open(self, table: TableInfo, bucket: int, epoch: int) -> Replica:
        key = (table.table_id, bucket)
        store = BucketStore.from_config(self.bucket_dir(table.table_id, bucket), table, self.config,
                                        clock_ms=self.clock_ms, bucket=bucket, budget=self.budget, lazy=True,
                                        on_failure=lambda: self.unsettled.add(key))
        store.leader_epoch = epoch  # stamped on every changelog entry it appends
        tb = TableBucket(table.table_id, bucket)
        uploader = SnapshotUploader(self.storage, tb, io_threads=self.config[cfg.SNAPSHOT_UPLOAD_THREADS],
                                    clock_ms=self.clock_ms)
        return Replica(table, bucket, store, uploader)

    def learn_base(self, replica: Replica) -> None:
        """Learn the bucket's latest committed snapshot from the coordinator, once: the next snapshot
        id follows it and its SST files are not uploaded again. Raises the coordinator's error."""
        if replica.base_known:
            return
        latest = self.admin.get_latest_kv_snapshots(replica.table.table_id)
        info = latest.get(replica.tb)
        with replica.snapshot_lock:
            if replica.base_known:
                return
            if info is not None:
                replica.uploader.mark_committed(info.handle)
                replica.next_snapshot_id = max(replica.next_snapshot_id, info.handle.snapshot_id + 1)
                replica.snapshot_offset = info.handle.log_offset
            replica.base_known = True

    def _close(self, key: tuple[int, int], dropped: bool = False) -> None:
        replica = self._replicas.pop(key)
        self._tell_closing(key, dropped)
        with replica.snapshot_lock:
            replica.store.close()

    def end_scans(self, table_id: int, bucket: int) -> None:
        """End the live scan sessions of a bucket that stays led, as a leadership change does (their
        clients start the bucket again): its failed files can then be reopened."""
        self._tell_closing((table_id, bucket), False)

    def _tell_closing(self, key: tuple[int, int], dropped: bool) -> None:
        for listener in self.close_listeners:
            try:
                listener(*key, dropped)
            except Exception:  # the store closes anyway
                log.exception("close listener of bucket %s failed", key)

    def get(self, table_id: int, bucket: int) -> Replica:
        replica = self._replicas.get((table_id, bucket))
        if replica is None and (table_id, bucket) in self.refused:
            raise errors.LeaderNotAvailableError(
                f"bucket {bucket} of table {table_id} is assigned to this tablet server, which cannot serve it: "
                f"it leads its capacity of {self.max_buckets} buckets (tablet.buckets.max)",
                table_id=table_id, bucket=bucket)
        if replica is None:
            raise errors.NotLeaderError(f"this tablet server does not lead bucket {bucket} of table {table_id}",
                                        table_id=table_id, bucket=bucket)
        return replica

    def table(self, table_id: int) -> TableInfo | None:
        """The table ``table_id`` if this server leads a bucket of it, else None (no ZooKeeper read)."""
        return self._tables.get(table_id)

    def check_table(self, table_id: int) -> None:
        """TableNotExistError if no bucket of ``table_id`` is led here and ZooKeeper has no such table."""
        if any(key[0] == table_id for key in list(self._replicas)):
            return
        if self._gone(table_id):
            raise errors.TableNotExistError(f"table id {table_id} does not exist (never created, or dropped)",
                                            table_id=table_id)

    def replicas(self, table_id: int | None = None) -> list[Replica]:
        return sorted((r for r in list(self._replicas.values()) if table_id is None or r.table.table_id == table_id),
                      key=lambda r: (r.table.table_id, r.bucket))

    def close(self) -> None:
        with self._lock:
            for key in list(self._replicas):
                self._close(key)
            self._tables = {}
            self.refused = {}

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self, replica: Replica, force: bool = False) -> SnapshotHandle | None:
        """Checkpoint, upload and commit one bucket, then apply its changelog retention; None when
        it has not changed."""
        (result,) = self.snapshot_each([replica], force)
        if isinstance(result, Exception):
            raise result
        return result

    def snapshot_each(self, replicas: list[Replica], force: bool = False, verify: bool = False
                      ) -> list[SnapshotHandle | None | errors.KvLeaseError]:
        """:meth:`snapshot` of each bucket in turn, a failure answered in its place (the others go on),
        then the changelog retention of those that committed, asking the coordinator for the kept
        snapshots once per table. ``verify``: an unchanged bucket whose latest snapshot lost a file on
        remote storage is snapshotted anyway (one listing per bucket; an explicit trigger does this,
        the periodic round does not)."""
        results: list[SnapshotHandle | None | errors.KvLeaseError] = []
        for replica in replicas:
            try:
                results.append(self._snapshot(replica, force, verify))
            except errors.KvLeaseError as exc:
                results.append(exc)
            except Exception as exc:  # a bug or a local I/O failure: answered, the others go on
                log.exception("snapshot of %s failed", replica.tb)
                results.append(errors.UnknownServerError(f"snapshot of bucket {replica.bucket} failed: {exc}"))
        self.apply_retention([r for r, h in zip(replicas, results) if isinstance(h, SnapshotHandle)])
        return results

    def _snapshot(self, replica: Replica, force: bool, verify: bool = False) -> SnapshotHandle | None:
        self.learn_base(replica)  # the snapshot id must follow the committed ones
        with replica.snapshot_lock:
            if not force and not replica.changed() and not (verify and self._lost_files(replica)):
                return None
            snapshot_id = replica.next_snapshot_id
            work = os.path.join(self.bucket_dir(replica.table.table_id, replica.bucket), "checkpoints")
            os.makedirs(work, exist_ok=True)
            target = os.path.join(work, f"snap-{snapshot_id}")
            shutil.rmtree(target, ignore_errors=True)
            replica.next_snapshot_id = snapshot_id + 1  # never reused, even if this attempt fails
            try:
                log_offset = replica.store.checkpoint(target)
                handle = upload_and_commit(replica.uploader, self.admin.commit_kv_snapshot, target,
                                           snapshot_id, log_offset)
            finally:
                shutil.rmtree(target, ignore_errors=True)
            replica.snapshot_offset = log_offset
            log.info("snapshot %d of %s committed at log offset %d", snapshot_id, replica.tb, log_offset)
        return handle

    def _lost_files(self, replica: Replica) -> bool:
        """Whether the latest committed snapshot misses a file on remote storage (then a new one is due)."""
        base = replica.uploader.base
        if base is None:
            return False
        missing = missing_files(self.storage, base.files)
        if missing:
            log.warning("snapshot %d of %s lost %d files on remote storage (e.g. %s): taking a new one",
                        base.snapshot_id, replica.tb, len(missing), missing[0][0])
        return bool(missing)

    def snapshot_changed(self) -> int:
        """Snapshot every led bucket that changed since its last snapshot, then apply the changelog
        retention of those committed (one listing of kept snapshots per table); returns how many."""
        committed = []
        for replica in self.replicas():
            if not replica.store.files.known:
                continue  # not opened since this server started: the keeper opens it, the next round looks
            try:
                if self._snapshot(replica, force=False) is not None:
                    committed.append(replica)
            except Exception as exc:  # retried at the next interval
                log.warning("snapshot of %s failed: %s", replica.tb, exc)
        self.apply_retention(committed)
        return len(committed)

    # -- changelog retention ------------------------------------------------------------------

    def apply_retention(self, replicas: list[Replica]) -> int:
        """Delete changelog segments of each bucket below the lowest log offset of its kept
        snapshots (leased ones included) that are also older than ``log.retention``. Asks the
        coordinator for the kept snapshots once per table; returns how many segments went."""
        by_table: dict[int, list[Replica]] = {}
        for replica in replicas:
            by_table.setdefault(replica.table.table_id, []).append(replica)
        deleted = 0
        for table_id, group in sorted(by_table.items()):
            try:
                kept = self.admin.list_kv_snapshots(table_id)
            except errors.KvLeaseError as exc:
                log.warning("cannot learn the kept snapshots of table %d: %s", table_id, exc)
                continue
            for replica in group:
                deleted += self._truncate_log(replica, [s for s in kept if s.bucket == replica.tb])
        return deleted

    def _truncate_log(self, replica: Replica, kept: list) -> int:
        if not kept:
            return 0  # no snapshot: the changelog is the only copy
        keep_from = min(s.log_offset for s in kept)
        cutoff_s = time.time() - self.config[cfg.LOG_RETENTION] / 1000.0
        segments = replica.store.log_segments()
        old_enough = [s for s in segments if s.end_offset <= keep_from and s.mtime <= cutoff_s]
        if not old_enough:
            return 0
        return replica.store.truncate_log_before(max(s.end_offset for s in old_enough))
