"""The tablet's side of lost data: its data dir's identity, restores and unclean takeovers, log-end reports.

- **Data dir identity.** ``{tablet.data-dir}/server.json`` holds
  ``{server_id, dir_id}``, created with a new uuid when absent (a new or wiped
  disk). The server registers ``dir_id``; the coordinator takes a new one for
  the loss of every replica placed on this server (``coordinator/data_dirs.py``).
- **Restore** (``kvlease bucket restore --accept-data-loss``): the push names
  the bucket's newest loss, and tells each replica whether it still owes it
  (``restore_owed``: the coordinator keeps the replicas that have not
  confirmed it, ``owed_by``). A replica that owes it drops its local state for
  the bucket, and its leader installs the restored snapshot (none: empty at
  offset 0), before it serves or fetches (``LEADER_NOT_AVAILABLE``
  "restoring" meanwhile); then it confirms (``ConfirmRestore``, sent again
  each keeper round until answered) and serves. It owes it whatever epochs
  pass and whether its server restarts in between (a server that crashed
  after taking the restore comes back to a higher leader epoch and restores
  all the same). ``{bucket dir}/restore.json`` (``{"epoch", "done"}``) is
  written before anything is removed and marked done at the end: a restore
  done and not confirmed yet (a crash in between) is only confirmed, never
  repeated. A loss the coordinator does not track (recorded before it kept
  ``owed_by``): restored while the bucket's leader epoch is the restore's, or
  a restore of it was interrupted, or not carried out yet when a later push
  raised the epoch.
- **Unclean takeover** (``kvlease bucket elect --unclean``): the new leader
  reports its log end (the loss's ``from_offset``) before it serves.
- **Log ends**: every ``kv.snapshot.interval`` the led buckets whose
  committed end moved are reported, so a restore can say how many offsets it
  loses.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid

from kvlease.common import errors, kvsnapshot
from kvlease.common.data_loss import RESTORE, UNCLEAN
from kvlease.client.server_calls import LogEnd
from kvlease.tablet.bucket import damage as bucket_damage
from kvlease.tablet.log.segment_files import write_durably
from kvlease.tablet.replication.roles import BucketRole
from kvlease.tablet.store import snapshot_install

__all__ = ["CONFIRM", "RESTORE", "UNCLEAN", "LogEndReporter", "data_dir_id", "restore_files", "work_for"]

log = logging.getLogger(__name__)

CONFIRM = "confirm"  # work: a restore carried out, the coordinator not told yet (it serves once told)
SERVER_FILE = "server.json"
RESTORE_FILE = "restore.json"
DOWNLOAD_DIR = "restore-download"


def _write_json(path: str, value: dict) -> None:
    write_durably(path, json.dumps(value).encode())


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def data_dir_id(data_dir: str, server_id: int) -> str:
    """This data dir's id (``server.json``, created now if absent). InvalidRequestError if the dir
    belongs to another tablet server id."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, SERVER_FILE)
    try:
        node = _read_json(path)
    except ValueError:
        node = None  # a torn write of a first start: nothing was stored with it yet
    if node is not None and node.get("dir_id"):
        if int(node.get("server_id", server_id)) != server_id:
            raise errors.InvalidRequestError(f"data dir {data_dir} belongs to tablet server {node['server_id']}, "
                                             f"not {server_id} (tablet.id)")
        return str(node["dir_id"])
    dir_id = uuid.uuid4().hex
    _write_json(path, {"server_id": server_id, "dir_id": dir_id})
    log.warning("data dir %s has no %s: a new data dir (id %s)", data_dir, SERVER_FILE, dir_id)
    return dir_id


def work_for(role: BucketRole, bucket_dir: str, server_id: int, pending: str | None = None) -> str | None:
    """What must happen before this replica serves: RESTORE, CONFIRM (tell the coordinator the restore is
    carried out), UNCLEAN (report the log end) or None.

    A restore is the coordinator's to say (``role.restore_owed``): owed, it is carried out (CONFIRM only,
    if the marker says it was: never twice); not owed, nothing (this replica confirmed it, or joined
    after it). Unknown (a loss recorded before the coordinator kept track): restored while the leader
    epoch is the restore's, or its marker says it was interrupted, or ``pending`` (the work the replica
    has not carried out yet) is RESTORE: a later push raising the epoch before it ran does not undo it."""
    loss = role.latest_loss
    if loss is None:
        return None
    if loss.kind == RESTORE:
        marker = _read_json(os.path.join(bucket_dir, RESTORE_FILE)) or {}
        started = int(marker.get("epoch", -1)) == loss.leader_epoch
        done = started and bool(marker.get("done"))
        if role.restore_owed is not None:
            return (CONFIRM if done else RESTORE) if role.restore_owed else None
        if done:
            return None
        return RESTORE if role.leader_epoch == loss.leader_epoch or started or pending == RESTORE else None
    if loss.kind == UNCLEAN and not loss.resolved and role.leads(server_id) and role.leader_epoch == loss.leader_epoch:
        return UNCLEAN
    return None


def restore_files(bucket_dir: str, role: BucketRole, storage, admin, server_id: int, io_threads: int = 8) -> None:
    """Drop the bucket's local files (closed) and, on its leader, install the restored snapshot."""
    loss = role.latest_loss
    os.makedirs(bucket_dir, exist_ok=True)
    marker = os.path.join(bucket_dir, RESTORE_FILE)
    _write_json(marker, {"epoch": loss.leader_epoch, "done": False})
    for name in os.listdir(bucket_dir):
        if name not in (RESTORE_FILE, bucket_damage.DAMAGED):  # damaged files stay for inspection
            path = os.path.join(bucket_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    if role.leads(server_id) and loss.snapshot_id:
        tb = role.table.bucket(role.bucket)
        handle = next((info.handle for info in admin.list_kv_snapshots(role.table.table_id, role.table.partition_id)
                       if info.handle.bucket == tb and info.handle.snapshot_id == loss.snapshot_id), None)
        if handle is None:
            raise errors.SnapshotNotFoundError(f"snapshot {loss.snapshot_id} of bucket {role.bucket} of "
                                               f"{role.table.where} to restore is not kept any more")
        target = os.path.join(bucket_dir, DOWNLOAD_DIR)
        try:
            manifest = kvsnapshot.download(storage, handle, target, io_threads=io_threads)
            snapshot_install.install(bucket_dir, target, manifest.log_offset)
        finally:
            shutil.rmtree(target, ignore_errors=True)
    _write_json(marker, {"epoch": loss.leader_epoch, "done": True})
    log.warning("bucket %d of %s: local state dropped for the restore at leader epoch %d%s", role.bucket,
                role.table.where, loss.leader_epoch,
                f"; snapshot {loss.snapshot_id} installed (log offset {loss.from_offset})"
                if role.leads(server_id) and loss.snapshot_id else "")


class LogEndReporter:
    """Reports the led buckets' committed log ends that moved since the last report (all of them again to a
    new coordinator: it keeps them in memory only)."""

    def __init__(self, replicas, server_calls) -> None:
        self.replicas = replicas  # tablet.replicas.manager.ReplicaManager
        self.server_calls = server_calls  # client.server_calls.ServerCalls
        self._sent: dict[tuple[int, int], tuple[int, int]] = {}
        self._epoch = -1  # the coordinator epoch they were sent to

    def run_once(self) -> int:
        if self.replicas.coordinator_epoch != self._epoch:
            self._sent, self._epoch = {}, self.replicas.coordinator_epoch
        ends = []
        for replica in self.replicas.replicas():
            if not replica.store.files.known:
                continue
            end = (replica.role.leader_epoch if replica.role is not None else replica.leader_epoch,
                   replica.store.high_watermark)
            if self._sent.get(replica.key) != end:
                ends.append((replica, LogEnd(replica.table.table_id, replica.bucket, *end, replica.table.partition_id)))
        if not ends:
            return 0
        try:
            self.server_calls.report_log_ends(self.replicas.server_id, [end for _replica, end in ends])
        except errors.KvLeaseError as exc:  # the next round sends them again
            log.debug("cannot report log ends: %s", exc)
            return 0
        self._sent.update({replica.key: (end.leader_epoch, end.log_end) for replica, end in ends})
        return len(ends)
