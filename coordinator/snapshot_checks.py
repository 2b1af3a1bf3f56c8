"""What a ``CommitKvSnapshot`` must show before the coordinator stores it.

A committed snapshot's files are deleted when it is reclaimed, and its id and
log offset decide what "latest" is, so a commit is taken at its word only
when:

- every path it names (its files and its manifest) lies under its own
  bucket's ``kv/{table_id}/{bucket}/`` directory: relative, no ``..``, ``.``
  or empty segment (:func:`check_paths`, pure; the store runs it again);
- its manifest is at the snapshot's own path (``.../snap-{id}/_METADATA``),
  exists on remote storage and agrees with the commit: bucket, snapshot id,
  ``log_offset`` and files with their sizes (:func:`check_manifest`, a remote
  read: run in the gRPC handler's thread, never on the event loop);
- every one of its files exists on remote storage with its size
  (:func:`check_files`: one listing of the bucket's ``shared/`` directory and
  one of the snapshot's ``snap-{id}/``, in the same thread). A snapshot whose
  file went missing before its commit (deleted by hand, a lifecycle rule, a
  lost write) would be a snapshot no reader can open.

- its ``log_offset`` is not beyond the bucket's changelog end, as the bucket's
  leader answers ListOffsets (:class:`LeaderLogEnds`, one round trip per
  commit over a channel kept per leader, also in the handler's thread). A bucket with no live leader has no
  end to compare with; its commit is judged by its manifest alone.
- it is of the bucket's present leadership (:func:`check_epoch`, pure, on the
  loop): taken by one of its replicas, under a leader epoch no older than the
  bucket's current one (and so none older than its latest accepted data
  loss). A deposed leader still running (a zombie: paused past its session,
  cut off) would otherwise commit a snapshot the new leader never took, with
  the id the new leader takes next; after an unclean election or a restore
  it would even be a snapshot of the history the loss gave up. A snapshot of
  the leader's own epoch that a clean leader change overtook is refused too:
  the new leader takes the next one. A commit that does not say its epoch (an
  older tablet server) is taken as before.
- none of its files was deleted by the coordinator's orphan reclaim
  (:func:`check_not_reclaimed`, on the loop: ``coordinator/orphan_files.py``).
  The listing above ran before the commit reached the loop; a file the
  reclaim judged an orphan in between is gone (or going) all the same.
"""

from __future__ import annotations

import threading
from typing import Callable

import grpc

from kvlease.client.transport import Channels
from kvlease.common import errors
from kvlease.common.tls import TlsFiles
from kvlease.common.limits import GRPC_MESSAGE_OPTIONS
from kvlease.common.proto import tablet_pb2, tablet_pb2_grpc
from kvlease.common.wire import error_from_pb, raise_for
from kvlease.common.kvsnapshot import bucket_dir, manifest_path, missing_files, read_manifest
from kvlease.common.model import SnapshotHandle
from kvlease.coordinator.assignment import BucketAssignment
from kvlease.common.storage import RemoteStorage, StorageNotFound


def check_paths(handle: SnapshotHandle) -> None:
    """Raises InvalidSnapshotError naming the first path outside the bucket's own directory."""
    prefix = bucket_dir(handle.bucket) + "/"
    for path in [handle.metadata_path, *(f.path for f in handle.files)]:
        segments = path.split("/")
        if (not path.startswith(prefix) or "\\" in path
                or any(s in ("", ".", "..") for s in segments)):
            raise errors.InvalidSnapshotError(
                f"snapshot {handle.snapshot_id} of bucket {handle.bucket} names the file {path!r}: "
                f"every file of a snapshot must lie under its bucket's directory {prefix}", path=path)


def check_epoch(handle: SnapshotHandle, state: BucketAssignment, leader_epoch: int | None,
                server_id: int | None) -> None:
    """Raises FencedLeaderEpochError when ``server_id`` (None: not said) is not one of the bucket's replicas,
    or ``leader_epoch`` (the epoch the snapshot was taken under; None: not said) is older than the bucket's
    current leader epoch; the message names the latest accepted loss (``state.losses``) when the epoch is
    older than that too."""
    what = f"snapshot {handle.snapshot_id} of bucket {handle.bucket}"
    if server_id is not None and server_id not in state.replicas:
        raise errors.FencedLeaderEpochError(
            f"{what} is refused: tablet server {server_id} is not one of the bucket's replicas "
            f"{list(state.replicas)}", leader_epoch=state.leader_epoch)
    if leader_epoch is None or leader_epoch >= state.leader_epoch:
        return
    loss = max(state.losses, key=lambda lost: lost.leader_epoch, default=None)
    if loss is not None and leader_epoch < loss.leader_epoch:
        raise errors.FencedLeaderEpochError(
            f"{what} is refused: it was taken under leader epoch {leader_epoch}, before the bucket's data loss "
            f"at leader epoch {loss.leader_epoch} ({loss.describe()}): it holds a history the bucket no longer "
            f"has", leader_epoch=state.leader_epoch)
    raise errors.FencedLeaderEpochError(
        f"{what} is refused: it was taken under leader epoch {leader_epoch}, the bucket is led at epoch "
        f"{state.leader_epoch} now (by tablet server {state.leader}): a deposed leader's snapshot",
        leader_epoch=state.leader_epoch)


def check_not_reclaimed(handle: SnapshotHandle, deleted: Callable[[str], bool]) -> None:
    """Raises InvalidSnapshotError naming the first file of the snapshot the orphan reclaim deleted
    (``deleted(path)``), as :func:`check_files` names one that is missing."""
    for path in sorted(handle.file_paths()):
        if deleted(path):
            raise errors.InvalidSnapshotError(
                f"snapshot {handle.snapshot_id} of bucket {handle.bucket} is not committed: its file {path} "
                f"on remote storage was deleted as an orphan (older than kv.snapshot.orphan-grace, named by "
                f"no stored snapshot; the next snapshot uploads it again)", path=path)


def check_manifest(storage: RemoteStorage, handle: SnapshotHandle) -> None:
    """Raises InvalidSnapshotError unless the snapshot's manifest exists and agrees with the commit;
    StorageError if remote storage could not be read (retriable)."""
    check_paths(handle)
    what = f"snapshot {handle.snapshot_id} of bucket {handle.bucket}"
    expected = manifest_path(handle.bucket, handle.snapshot_id)
    if handle.metadata_path != expected:
        raise errors.InvalidSnapshotError(
            f"{what} names the manifest {handle.metadata_path!r}, not its own {expected!r}", path=handle.metadata_path)
    try:
        manifest = read_manifest(storage, expected)
    except StorageNotFound:
        raise errors.InvalidSnapshotError(f"{what}: its manifest {expected} does not exist on remote storage",
                                          path=expected) from None
    if (manifest.bucket, manifest.snapshot_id) != (handle.bucket, handle.snapshot_id):
        raise errors.InvalidSnapshotError(
            f"{what}: the manifest {expected} is of snapshot {manifest.snapshot_id} of bucket {manifest.bucket}")
    if handle.log_offset != manifest.log_offset:
        raise errors.InvalidSnapshotError(
            f"{what}: log offset {handle.log_offset} differs from its manifest's ({manifest.log_offset})")
    committed = sorted((f.path, f.size) for f in handle.files)
    listed = sorted((f.path, f.size) for f in manifest.files)
    if committed != listed:
        extra = sorted(set(committed) - set(listed))
        missing = sorted(set(listed) - set(committed))
        raise errors.InvalidSnapshotError(
            f"{what}: its files differ from its manifest's (not in the manifest: {extra[:3]}, "
            f"missing: {missing[:3]})")
    check_files(storage, handle)


def check_files(storage: RemoteStorage, handle: SnapshotHandle) -> None:
    """Raises InvalidSnapshotError naming the first file of the snapshot that is not on remote storage
    with its size; StorageError if remote storage could not be listed (retriable). One listing per
    directory the files are in (the bucket's ``shared/`` and the snapshot's ``snap-{id}/``)."""
    missing = missing_files(storage, handle.files)
    if missing:
        path, size, found = missing[0]
        what = "does not exist" if found is None else f"has {found} bytes, the manifest says {size}"
        raise errors.InvalidSnapshotError(
            f"snapshot {handle.snapshot_id} of bucket {handle.bucket} is not committed: its file {path} "
            f"on remote storage {what} (the next snapshot uploads it again)", path=path)


class LeaderLogEnds:
    """Asks buckets' leaders for their changelog end (:meth:`check`) over kept gRPC channels, one per
    leader address, with TLS and the cluster's own credentials as configured.

    The active coordinator's :class:`~kvlease.coordinator.controller.Controller` owns it
    and closes it when the coordinator steps down or stops; a check after that
    raises NotCoordinatorError and opens no channel.
    """

    def __init__(self, tls: TlsFiles | None = None, credentials: tuple[str, str] | None = None) -> None:
        self._channels = Channels(GRPC_MESSAGE_OPTIONS, tls=tls, credentials=credentials)
        self._lock = threading.Lock()
        self._closed = False

    def check(self, handle: SnapshotHandle, leader_address: str, timeout_s: float = 10.0) -> None:
        """Raises InvalidSnapshotError when ``handle.log_offset`` is beyond the changelog end the bucket's
        leader (at ``leader_address``) reports; the leader's own error (e.g. NOT_LEADER) if it has one;
        LeaderNotAvailableError when the leader cannot be reached."""
        bucket = handle.bucket  # a partition's bucket is asked of the partition (its partition_id)
        request = tablet_pb2.ListOffsetsRequest(table_id=bucket.table_id, partition_id=bucket.partition_id,
                                                buckets=[bucket.bucket])
        with self._lock:
            if self._closed:
                raise errors.NotCoordinatorError("the coordinator stepped down")
            stub = self._channels.stub(leader_address, tablet_pb2_grpc.TabletServiceStub)
        try:
            response = stub.ListOffsets(request, timeout=timeout_s)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel was closed meanwhile
            reason = exc.code().name if isinstance(exc, grpc.RpcError) else "the coordinator stepped down"
            raise errors.LeaderNotAvailableError(
                f"cannot ask the leader of bucket {handle.bucket} ({leader_address}) for its log end: "
                f"{reason}") from None
        raise_for(response.error)  # e.g. NOT_LEADER: the leader has not taken the push naming its partition yet
        if len(response.offsets) != 1:
            raise errors.LeaderNotAvailableError(
                f"the leader of bucket {handle.bucket} ({leader_address}) answered {len(response.offsets)} log ends "
                f"for one bucket")
        (offsets,) = response.offsets
        if offsets.error.code:
            raise error_from_pb(offsets.error)
        if handle.log_offset > offsets.latest:
            raise errors.InvalidSnapshotError(
                f"snapshot {handle.snapshot_id} of bucket {handle.bucket}: log offset {handle.log_offset} is "
                f"beyond the bucket's changelog end {offsets.latest}")

    @property
    def addresses(self) -> list[str]:
        """The leader addresses a channel is open to."""
        return self._channels.addresses()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._channels.close()
