"""The admin client: tables, snapshots, leases, users and ACLs, replica moves and data loss on the active
coordinator.

:class:`AdminClient` owns one :class:`kvlease.client.coordinator_caller.CoordinatorCaller`
(:attr:`AdminClient.caller`: the channels, finding and following the active
coordinator, retries, which calls are resent) and makes the table, snapshot
and lease calls itself. The other calls are parts built on that caller, each
in its own module, which :class:`AdminClient` owns and delegates to method by
method: users and ACLs (:class:`kvlease.client.security_admin.SecurityAdmin`), replica
moves (:class:`kvlease.client.moves_admin.MovesAdmin`), restores and elections
(:class:`kvlease.client.data_loss_admin.DataLossAdmin`) and the cluster's health
(:class:`kvlease.client.replication_admin.ReplicationAdmin`). The calls only tablet
servers make are not here: :class:`kvlease.client.server_calls.ServerCalls`.

The answer types are in :mod:`kvlease.client.admin_types`, and the bootstrap list is checked by
:mod:`kvlease.client.bootstrap` (both re-exported here, with the caller's :data:`READS` and :data:`IDEMPOTENT`).
Every failure is raised as a :mod:`kvlease.common.errors` exception.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import tenacity

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.client.admin_types import (AcquireResult, BucketLeader, BucketRef, ClusterHealth, CoordinatorInfo,
                                        ReleaseResult, SnapshotInfo, TabletServerInfo, bucket_leader)
from kvlease.client import lease_wire
from kvlease.client.bootstrap import parse_bootstrap
from kvlease.client.coalescing import BatchInterrupted, Coalescer
from kvlease.client.coordinator_caller import IDEMPOTENT, READS, RETRIABLE_IF_IDEMPOTENT, CoordinatorCaller
from kvlease.client.data_loss_admin import DataLossAdmin
from kvlease.client.moves_admin import MovesAdmin
from kvlease.client.partitions_admin import PartitionInfo, PartitionsAdmin, find_partition
from kvlease.client.replication_admin import ReplicationAdmin
from kvlease.client.schemas_admin import SchemasAdmin
from kvlease.client.security_admin import SecurityAdmin
from kvlease.client.tables_admin import TablesAdmin
from kvlease.client.transport import RETRIABLE, NotServedError, RetryPolicy, UnknownOutcomes, arguments
from kvlease.common.parts import delegate as _delegate, documented_by as _documented_by
from kvlease.common.security.acl import AclBinding, Operation, Resource
from kvlease.common.wire import (bucket_snapshots_from_pb, bucket_to_pb, error_from_pb, handle_from_pb, handle_to_pb,
                                 lease_from_pb, raise_for, table_from_pb)
from kvlease.common.tables import Column, TableInfo, parse_table_path
from kvlease.common.model import Lease, SnapshotHandle, TableBucket

#: re-exported: callers import the answer types and parse_bootstrap from here
__all__ = ["AdminClient", "wait_for_active", "parse_bootstrap", "READS", "IDEMPOTENT", "RETRIABLE_IF_IDEMPOTENT",
           "AcquireResult", "BucketLeader", "BucketRef", "ClusterHealth", "CoordinatorInfo", "ReleaseResult",
           "SnapshotInfo", "TabletServerInfo"]


#: The answer to an acquire of a batch refused as a whole: its caller sends it alone.
_SEND_ALONE = object()


def _buckets(buckets):
    """``buckets`` (a mapping or a list), if every bucket is a TableBucket; else TypeError naming one."""
    wrong = next((b for b in buckets if not isinstance(b, TableBucket)), None)
    if wrong is not None:
        raise TypeError(f"buckets are common.model.TableBucket(table_id, bucket), got {errors.show(wrong)}")
    return buckets


class AdminClient:
    """Thread-safe; one gRPC channel per coordinator address (its :attr:`caller`'s)."""

    def __init__(self, bootstrap: str | Sequence[str], config: cfg.Config | None = None, *,
                 request_timeout_s: float | None = None, retry_total_s: float | None = None,
                 locate: Callable[[], str] | None = None) -> None:
        """``bootstrap``: coordinator addresses, ``"host:port[,host:port…]"`` or a list (a cluster directory
        is refused: :func:`kvlease.client.connect.connect` takes one). ``config``: TLS and credentials
        (``security.*``), timeouts; ``locate`` (optional) names the active coordinator's address now
        (e.g. from ZooKeeper); it is asked whenever the current address is unreachable."""
        self._caller = CoordinatorCaller(bootstrap, config, request_timeout_s=request_timeout_s,
                                         retry_total_s=retry_total_s, locate=locate, owner="AdminClient")
        call = self._caller.call
        self._security = SecurityAdmin(call, tls=self._caller.tls is not None, bootstrap=self._caller.bootstrap)
        self._tables = TablesAdmin(call)
        self._moves = MovesAdmin(call, self.get_table)
        self._partitions = PartitionsAdmin(call)
        self._schemas = SchemasAdmin(call, self._partitions.alter_table)
        self._data_loss = DataLossAdmin(call, self.get_table, lambda table, name: find_partition(self, table, name))
        self._replication = ReplicationAdmin(call)
        #: acquires made by several threads at once travel in one call (client.coalescing), unless the
        #: coordinator turned out not to have that call
        self._acquires = Coalescer(lambda request: call("AcquireKvSnapshotLease", request), self._acquire_many)
        self._batch_acquires = True

    # -- the coordinator ----------------------------------------------------------

    @property
    def caller(self) -> CoordinatorCaller:
        """The :class:`~kvlease.client.coordinator_caller.CoordinatorCaller` every call of this client goes through
        (closed with it); a tablet server builds its :class:`~kvlease.client.server_calls.ServerCalls` on it."""
        return self._caller

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of its calls (:class:`kvlease.client.transport.RetryPolicy`)."""
        return self._caller.retry

    @property
    def tls(self):
        """The TLS files its channels use (:class:`kvlease.common.tls.TlsFiles`); None: plaintext."""
        return self._caller.tls

    @property
    def credentials(self) -> tuple[str, str] | None:
        """(username, password) sent on every call; None: security off, or the mutual-TLS certificate
        identifies this client."""
        return self._caller.credentials

    @property
    def bootstrap(self) -> list[str]:
        """The coordinator addresses this client was given."""
        return self._caller.bootstrap

    @property
    def address(self) -> str:
        """The coordinator address requests currently go to."""
        return self._caller.address

    def close(self) -> None:
        """Close its channels (idempotent); a call after it is InvalidRequestError."""
        self._caller.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def coordinator_info(self, address: str | None = None) -> CoordinatorInfo:
        """What ``address`` (default: the current one) says about itself; never retried."""
        return self._caller.coordinator_info(address)

    # -- tables -----------------------------------------------------------------

    @_documented_by(TablesAdmin.create_table)
    def create_table(self, path: str, columns: Sequence[Column], primary_key: Sequence[str], buckets: int,
                     ignore_if_exists: bool = False, **options) -> TableInfo:
        return self._tables.create_table(path, columns, primary_key, buckets, ignore_if_exists, **options)

    @_documented_by(TablesAdmin.drop_table)
    def drop_table(self, path: str, ignore_if_not_exists: bool = False) -> bool:
        return self._tables.drop_table(path, ignore_if_not_exists)

    def list_tables(self, database: str = "") -> list[TableInfo]:
        """Every table (of ``database`` only, if given)."""
        response = self._caller.call("ListTables", pb.ListTablesRequest(database=database))
        return [table_from_pb(t) for t in response.tables]

    def get_table(self, path: str) -> TableInfo:
        """The table ``DB.NAME``; TableNotExistError if there is none."""
        db, name = parse_table_path(path)
        return table_from_pb(self._caller.call("GetTable", pb.GetTableRequest(database=db, name=name)).table)

    def get_table_by_id(self, table_id: int) -> TableInfo:
        """The table with this id; TableNotExistError if there is none (e.g. it was dropped)."""
        return table_from_pb(self._caller.call("GetTable", pb.GetTableRequest(table_id=table_id)).table)

    def get_table_assignment(self, table_id: int, partition_id: int | None = None
                             ) -> tuple[TableInfo, dict[int, BucketLeader]]:
        """The table (a partition's view, given ``partition_id``) and each bucket's leader (address empty while
        its server is gone), replicas and ISR. A partitioned table's buckets are its partitions': without
        ``partition_id`` it is PartitionNotExistsError (:meth:`partition_assignments` has them all)."""
        table, by_partition = self._assignment(table_id, partition_id)
        if partition_id is None and table.partitioned:
            raise errors.PartitionNotExistsError(f"table {table.path} is partitioned: name one of its partitions",
                                                 table=table.path)
        return table, by_partition.get(partition_id, {})

    def partition_assignments(self, table_id: int) -> tuple[TableInfo, dict[int | None, dict[int, BucketLeader]]]:
        """The table and, per partition id (None: an unpartitioned table's own buckets), each bucket's leader."""
        return self._assignment(table_id, None)

    def _assignment(self, table_id: int, partition_id: int | None):
        response = self._caller.call("GetTableAssignment", pb.GetTableAssignmentRequest(
            table_id=table_id, partition_id=partition_id))
        by_partition: dict[int | None, dict[int, BucketLeader]] = {}
        for b in response.buckets:
            part = b.partition_id if b.HasField("partition_id") else None
            by_partition.setdefault(part, {})[b.bucket] = bucket_leader(b)
        return table_from_pb(response.table), by_partition

    def list_tablet_servers(self) -> list[TabletServerInfo]:
        """The live tablet servers: id, address, how many buckets each leads and how many replicas it holds."""
        return list(self.cluster_health().servers)

    # -- snapshots ----------------------------------------------------------------

    def commit_kv_snapshot(self, handle: SnapshotHandle, *, leader_epoch: int | None = None,
                           server_id: int | None = None) -> None:
        """Record an uploaded snapshot as its bucket's latest (a tablet server's call; with security on, it
        needs the cluster's own principal). Not retried after a lost answer: OutcomeUnknownError. ``leader_epoch``
        (taken under) and ``server_id`` (the caller): None is not checked; FencedLeaderEpochError (not retried)
        for an epoch older than the bucket's latest data loss or a server not among its replicas."""
        request = pb.CommitKvSnapshotRequest(snapshot=handle_to_pb(handle), leader_epoch=leader_epoch,
                                             server_id=server_id)
        response = self._caller.call("CommitKvSnapshot", request, answered=(errors.FencedLeaderEpochError,))
        raise_for(response.error)

    def get_latest_kv_snapshots(self, table_id: int, partition_id: int | None = None) -> dict[TableBucket, SnapshotInfo]:
        """The newest snapshot of each bucket that has one (lease them before reading:
        :meth:`acquire_lease`); of a partitioned table, every partition's buckets, or ``partition_id``'s."""
        response = self._caller.call("GetLatestKvSnapshots", pb.GetLatestKvSnapshotsRequest(
            table_id=table_id, partition_id=partition_id))
        return lease_wire.snapshot_infos(response.snapshots)

    def list_kv_snapshots(self, table_id: int, partition_id: int | None = None) -> list[SnapshotInfo]:
        """Every kept snapshot of every bucket (of every partition, or ``partition_id``'s), with the leases
        that hold each."""
        response = self._caller.call("ListKvSnapshots", pb.ListKvSnapshotsRequest(table_id=table_id,
                                                                                  partition_id=partition_id))
        return [SnapshotInfo(handle_from_pb(s), tuple(s.leased_by), s.retained) for s in response.snapshots]

    # -- leases -------------------------------------------------------------------

    def acquire_lease(self, lease_id: str, snapshots: Mapping[TableBucket, int], duration_ms: int, *,
                      owner: str | None = None) -> AcquireResult:
        """Create or update the lease; ``unavailable`` lists snapshots that do not exist.

        A lease past its deadline is not updated but replaced: the new one holds
        only these snapshots. ``owner``: this reader's token (lease id characters,
        e.g. a uuid's hex). A live lease whose owner is another (an unowned lease's
        owner is None) is not touched: LeaseOwnedError. A new or replaced lease
        belongs to ``owner``. Retrying with the same owner is safe.
        """
        with arguments("acquire_lease"):
            request = lease_wire.acquire_request(lease_id, _buckets(snapshots), duration_ms, owner or "")
        try:
            response = self._acquires.call(request) if self._batch_acquires else _SEND_ALONE
        except BatchInterrupted as exc:  # another thread was sending it and was stopped
            raise errors.OutcomeUnknownError(str(exc)) from None
        if response is _SEND_ALONE:
            response = self._caller.call("AcquireKvSnapshotLease", request)
        return AcquireResult(lease_id, response.expiration_time_ms, lease_wire.acquired(response, snapshots),
                             bucket_snapshots_from_pb(response.unavailable))

    def acquire_latest_lease(self, lease_id: str, table_id: int, duration_ms: int, *,
                             partition_id: int | None = None, owner: str | None = None) -> AcquireResult:
        """:meth:`acquire_lease` of the latest snapshot of each bucket of the table (of ``partition_id``'s, or of
        every partition's) that has one, chosen by the coordinator as it acquires them (docs/python-api.md):
        SnapshotNotFoundError if none has one; a retry acquires those latest at that moment."""
        with arguments("acquire_latest_lease"):
            request = pb.AcquireKvSnapshotLeaseRequest(lease_id=lease_id, duration_ms=duration_ms, owner=owner or "",
                                                       latest={"table_id": table_id, "partition_id": partition_id})
        response = self._caller.call("AcquireKvSnapshotLease", request)
        return AcquireResult(lease_id, response.expiration_time_ms, bucket_snapshots_from_pb(response.acquired), {})

    def _acquire_many(self, requests: list[pb.AcquireKvSnapshotLeaseRequest]) -> list:
        """Several threads' acquires in one call: per request its response, its error, or
        :data:`_SEND_ALONE`.

        An error a retry may cure (NOT_COORDINATOR, a fenced coordinator,
        OUTCOME_UNKNOWN, …) on the call or on any of its acquires sends the whole
        batch again, as the unary call would be sent again: acquiring the same
        snapshots again has the same outcome. Out of retries, each caller gets
        what the last attempt answered its own acquire. A call refused as a
        whole for another reason (an acquire that sets a ``partition_id``, a
        coordinator without the call) is answered :data:`_SEND_ALONE`: each
        caller sends its own acquire, at once, and gets its own answer; a
        coordinator without the call is not sent one again.
        """
        last: list = []  # the outcomes of the last attempt the coordinator answered
        unknown = UnknownOutcomes()  # the call's, as a whole
        unknown_each: dict[int, errors.OutcomeUnknownError] = {}  # one acquire's (answered REQUEST_TIMED_OUT)
        call_once = unknown.watch(self._caller.call_once)

        def attempt() -> list:
            last.clear()
            address = self._caller.address
            response = call_once("AcquireKvSnapshotLeases", pb.AcquireKvSnapshotLeasesRequest(requests=requests))
            if len(response.responses) != len(requests):
                raise errors.UnknownServerError(f"{len(response.responses)} answers to {len(requests)} acquires")
            outcomes = [error_from_pb(r.error) or r for r in response.responses]
            for i, outcome in enumerate(outcomes):
                if isinstance(outcome, (errors.NotCoordinatorError, errors.CoordinatorFencedError)):
                    self._caller.move_to(outcome, address)  # stepping down meanwhile: as the unary call is followed
                    outcomes[i] = errors.NotCoordinatorError(
                        outcome.message, active_address=getattr(outcome, "active_address", ""))
                elif isinstance(outcome, errors.OutcomeUnknownError):
                    unknown_each.setdefault(i, outcome)
            last[:] = outcomes
            again = next((o for o in outcomes if isinstance(o, RETRIABLE_IF_IDEMPOTENT)), None)
            if again is not None:
                raise again
            return outcomes

        try:
            return self._caller.retry.call(attempt, retry_on=RETRIABLE_IF_IDEMPOTENT)
        except RETRIABLE_IF_IDEMPOTENT as exc:
            if last:  # out of retries: each acquire's last answer, unless an earlier one's outcome was unknown
                return [unknown.given_up(o, unknown_each.get(i)) if isinstance(o, RETRIABLE) else o
                        for i, o in enumerate(last)]
            # the call itself never got through: every caller's outcome
            raise unknown.given_up(exc, next(iter(unknown_each.values()), None)) from None
        except errors.KvLeaseError as exc:
            if isinstance(exc, NotServedError):
                self._batch_acquires = False
            return [_SEND_ALONE] * len(requests)

    def renew_lease(self, lease_id: str, duration_ms: int, *, owner: str | None = None) -> int:
        """Move the lease's deadline to now + duration; returns it.

        LeaseNotFoundError if unknown or already past its deadline (never revived);
        with ``owner``, LeaseOwnedError if the lease belongs to another reader.
        """
        with arguments("renew_lease"):
            request = pb.RenewKvSnapshotLeaseRequest(lease_id=lease_id, duration_ms=duration_ms, owner=owner or "")
        return self._caller.call("RenewKvSnapshotLease", request).expiration_time_ms

    def release_lease(self, lease_id: str, buckets: Iterable[TableBucket], *,
                      owner: str | None = None) -> ReleaseResult:
        """Free these buckets; safe to retry.

        Buckets the lease does not hold, or an unknown (or expired) lease, are no
        error: ``released`` is False then; with ``owner``, so is a lease of
        another reader (which is left alone). A bucket of an unknown table or
        out of range is (TableNotExistError, BucketOutOfRangeError).
        """
        with arguments("release_lease"):
            request = pb.ReleaseKvSnapshotLeaseRequest(
                lease_id=lease_id, buckets=[bucket_to_pb(tb) for tb in _buckets(list(buckets))], owner=owner or "")
        response = self._caller.call("ReleaseKvSnapshotLease", request)
        return ReleaseResult(lease_id, response.released, response.lease_remains)

    def drop_lease(self, lease_id: str, *, owner: str | None = None) -> bool:
        """Free every bucket of the lease; returns False if there was no such (live) lease, or, with
        ``owner``, the lease belongs to another reader (left alone). Without ``owner``, any lease."""
        with arguments("drop_lease"):
            request = pb.DropKvSnapshotLeaseRequest(lease_id=lease_id, owner=owner or "")
        return self._caller.call("DropKvSnapshotLease", request).dropped

    def list_leases(self) -> list[Lease]:
        """Every live lease, with its deadline and snapshots."""
        response = self._caller.call("ListKvSnapshotLeases", pb.ListKvSnapshotLeasesRequest())
        return [lease_from_pb(lease) for lease in response.leases]

    def describe_lease(self, lease_id: str) -> Lease:
        """The lease ``lease_id``; LeaseNotFoundError if it is unknown or past its deadline."""
        response = self._caller.call("DescribeKvSnapshotLease", pb.DescribeKvSnapshotLeaseRequest(lease_id=lease_id))
        return lease_from_pb(response.lease)

    # -- the parts' calls: each delegated to its part, whose docstring it shows ------------------------------

    @_documented_by(SecurityAdmin.add_user)
    def add_user(self, name: str, password: str) -> bool:
        return self._security.add_user(name, password)

    @_documented_by(SecurityAdmin.remove_user)
    def remove_user(self, name: str) -> bool:
        return self._security.remove_user(name)

    @_documented_by(SecurityAdmin.list_users)
    def list_users(self) -> list[str]:
        return self._security.list_users()

    @_documented_by(SecurityAdmin.add_acl)
    def add_acl(self, resource: Resource, principal: str, operation: Operation | str) -> bool:
        return self._security.add_acl(resource, principal, operation)

    @_documented_by(SecurityAdmin.remove_acl)
    def remove_acl(self, resource: Resource, principal: str, operation: Operation | str) -> bool:
        return self._security.remove_acl(resource, principal, operation)

    @_documented_by(SecurityAdmin.list_acls)
    def list_acls(self, resource: Resource | None = None) -> list[AclBinding]:
        return self._security.list_acls(resource)

    @_documented_by(ReplicationAdmin.cluster_health)
    def cluster_health(self) -> ClusterHealth:
        return self._replication.cluster_health()

    @_documented_by(PartitionsAdmin.create_partition)
    def create_partition(self, path: str, partition: str, ignore_if_exists: bool = False
                         ) -> tuple[TableInfo, PartitionInfo]:
        return self._partitions.create_partition(path, partition, ignore_if_exists)

    @_documented_by(PartitionsAdmin.drop_partition)
    def drop_partition(self, path: str, partition: str, ignore_if_not_exists: bool = False) -> bool:
        return self._partitions.drop_partition(path, partition, ignore_if_not_exists)

    @_documented_by(PartitionsAdmin.list_partitions)
    def list_partitions(self, path: str | None = None, *, table_id: int | None = None
                        ) -> tuple[TableInfo, list[PartitionInfo]]:
        return self._partitions.list_partitions(path, table_id=table_id)

    alter_table = _delegate("_schemas", SchemasAdmin.alter_table)
    schema_history = _delegate("_schemas", SchemasAdmin.schema_history)

    @_documented_by(MovesAdmin.reassign_bucket)
    def reassign_bucket(self, path: str, bucket: int, replicas: Sequence[int], partition: str | None = None) -> dict:
        return self._moves.reassign_bucket(path, bucket, replicas, partition)

    @_documented_by(MovesAdmin.decommission_tablet)
    def decommission_tablet(self, tablet_id: int) -> list[dict]:
        return self._moves.decommission_tablet(tablet_id)

    @_documented_by(MovesAdmin.recommission_tablet)
    def recommission_tablet(self, tablet_id: int) -> bool:
        return self._moves.recommission_tablet(tablet_id)

    @_documented_by(MovesAdmin.rebalance)
    def rebalance(self, leaders_only: bool = False) -> list[dict]:
        return self._moves.rebalance(leaders_only)

    @_documented_by(MovesAdmin.list_reassignments)
    def list_reassignments(self) -> list[dict]:
        return self._moves.list_reassignments()

    @_documented_by(DataLossAdmin.restore_bucket)
    def restore_bucket(self, path: str, bucket: int, accept_data_loss: bool, tablet: int | None = None,
                       partition: str | None = None) -> dict:
        return self._data_loss.restore_bucket(path, bucket, accept_data_loss, tablet, partition)

    @_documented_by(DataLossAdmin.elect_leader)
    def elect_leader(self, path: str, bucket: int, unclean: bool, tablet: int | None = None,
                     partition: str | None = None) -> dict:
        return self._data_loss.elect_leader(path, bucket, unclean, tablet, partition)



def wait_for_active(client: AdminClient, timeout_s: float, sleep: Callable[[float], None] | None = None) -> CoordinatorInfo:
    """Block until some coordinator of the bootstrap list is active and serving."""
    def probe() -> CoordinatorInfo:
        for address in client.bootstrap:
            try:
                info = client.coordinator_info(address)
            except errors.KvLeaseError:
                continue
            if info.active:
                return info
        raise errors.CoordinatorNotReadyError("no active coordinator yet")

    policy = RetryPolicy(timeout_s, max_wait_s=0.1, sleep=sleep or tenacity.nap.sleep)
    return policy.call(probe, retry_on=(errors.KvLeaseError,))
