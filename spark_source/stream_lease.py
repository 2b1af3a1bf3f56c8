"""A streaming query's lease while it bootstraps: made sure of when a bootstrap is planned, renewed until committed.

A streaming read leases the snapshots it bootstraps buckets from (every bucket
at its start; a partitioned table's new partitions when they are found) under
the query's one lease id and owner token, kept in its offsets
(``spark_source/stream_offsets.py``). :func:`ensure_lease` renews it, or
takes the same snapshots again under the same id after it expired;
:class:`Renewer` renews it every third of ``lease.duration`` until the
bootstrap is committed (``StreamReader.commit`` stops it).
"""

from __future__ import annotations

import logging
import threading
from typing import Mapping

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.common.tables import TableInfo
from kvlease.spark_source.partitions import BucketKey, describe, key_of, partition_of, table_bucket
from kvlease.spark_source.stream_offsets import LeaseRef

log = logging.getLogger(__name__)


class LeaseLostError(errors.SnapshotNotFoundError):
    """A streaming query's lease expired and the snapshots it was bootstrapping from were reclaimed."""


def ensure_lease(admin: AdminClient, table: TableInfo, lease: LeaseRef, snapshots: Mapping[BucketKey, int],
                 duration_ms: int) -> None:
    """Renew ``lease``; if it expired, acquire the same snapshots under the same id again (those of
    partitions dropped meanwhile left out: their part of the read ends). Raises :class:`LeaseLostError`
    naming the lease if any of them is gone, LeaseOwnedError if another reader took the lease id meanwhile."""
    try:
        admin.renew_lease(lease.lease_id, duration_ms, owner=lease.owner)
        return
    except errors.LeaseNotFoundError:
        pass
    wanted = dict(snapshots)
    try:
        result = admin.acquire_lease(lease.lease_id, {table_bucket(table.table_id, k): s for k, s in wanted.items()},
                                     duration_ms, owner=lease.owner)
    except errors.PartitionNotExistsError:
        _table, partitions = admin.list_partitions(table_id=table.table_id)
        there = {p.partition_id for p in partitions}
        wanted = {k: s for k, s in wanted.items() if partition_of(k) in there}
        if not wanted:
            return
        result = admin.acquire_lease(lease.lease_id, {table_bucket(table.table_id, k): s for k, s in wanted.items()},
                                     duration_ms, owner=lease.owner)
    if result.unavailable:
        if result.acquired:  # a bootstrap missing some snapshots cannot resume: hold nothing
            admin.release_lease(lease.lease_id, list(result.acquired), owner=lease.owner)
        gone = ", ".join(f"{describe(key_of(tb.partition_id, tb.bucket))} snapshot {s}" for tb, s in sorted(
            result.unavailable.items(), key=lambda item: item[0].sort_key()))
        raise LeaseLostError(
            f"table {table.path}: lease {lease.lease_id} of this streaming query expired and its snapshots were "
            f"reclaimed ({gone}); the bootstrap cannot resume: start the query again with a new checkpoint location",
            lease_id=lease.lease_id, table=table.path)


class Renewer:
    """A daemon thread renewing a lease every third of its duration until stopped."""

    def __init__(self, admin: AdminClient, lease: LeaseRef, duration_ms: int) -> None:
        self.lease = lease
        self.lost: errors.KvLeaseError | None = None
        self._admin = admin
        self._duration_ms = duration_ms
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvlease-renew-{lease.lease_id}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._duration_ms / 3000.0):
            try:
                self._admin.renew_lease(self.lease.lease_id, self._duration_ms, owner=self.lease.owner)
            except (errors.LeaseNotFoundError, errors.LeaseOwnedError) as exc:
                self.lost = exc
                log.error("lease %s expired before its bootstrap was committed: %s", self.lease.lease_id, exc)
                return
            except errors.KvLeaseError as exc:  # transient: try again next period
                log.warning("renewing lease %s failed, trying again: %s", self.lease.lease_id, exc)
