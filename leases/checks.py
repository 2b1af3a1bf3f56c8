"""The checks a lease request passes before it touches any lease, and the errors it answers with.

Pure functions of the request and the :class:`Catalog` (what the lease rules
know of tables and snapshots); :class:`~kvlease.leases.state.LeaseState`'s handlers
call them. The owner rules they encode are in :mod:`kvlease.leases.state`'s docstring.
"""

from __future__ import annotations

from typing import Mapping, Protocol

from kvlease.common import errors
from kvlease.common.model import Lease, TableBucket, lease_id_problem, lease_owner_problem


class Catalog(Protocol):
    """What the lease rules need to know of tables and snapshots (in memory)."""

    def buckets_of(self, tb: TableBucket) -> tuple[str, int]:
        """(where, bucket count) of the table or partition ``tb`` names (``where`` for messages: ``table
        db.t``, ``table db.t partition 20261127``); TableNotExistError, PartitionNotExistsError (a partition
        that is not there, or none of a partitioned table) or InvalidRequestError (a partition of an
        unpartitioned table) otherwise."""

    def has_snapshot(self, tb: TableBucket, snapshot_id: int) -> bool: ...



def expired(lease: Lease, now_ms: int) -> bool:
    """The lease's deadline has passed at ``now_ms`` (it is expired for every request)."""
    return lease.expiration_time <= now_ms


def owned_error(lease: Lease, owner: str | None) -> errors.LeaseOwnedError:
    holder = (f"the reader with owner token {errors.show(lease.owner)}" if lease.owner
              else "no owner (it was acquired without one)")
    asked = f"owner {errors.show(owner)}" if owner else "no owner"
    return errors.LeaseOwnedError(
        f"lease {errors.show(lease.lease_id)} belongs to {holder}, not to this request's ({asked}): a lease id names "
        f"one reader at a time; use another lease id, or if that reader is gone drop the lease (kvlease lease drop "
        f"{lease.lease_id}) or let it expire at {lease.expiration_time} ms", lease_id=lease.lease_id)


def foreign(lease: Lease, owner: str | None) -> bool:
    """``lease`` belongs to another reader than a request carrying ``owner`` (None: the request is an
    operator's, which may act on any lease)."""
    return owner is not None and lease.owner != owner


def not_found_error(lease_id: str, expired: Lease | None = None) -> errors.LeaseNotFoundError:
    why = f" (it expired at {expired.expiration_time} ms)" if expired is not None else ""
    return errors.LeaseNotFoundError(f"lease {errors.show(lease_id)} not found{why}", lease_id=lease_id)


def check_id(lease_id: str, owner: str | None = None) -> None:
    """Raise InvalidLeaseIdError if the lease id (or the owner token) is malformed."""
    problem = lease_id_problem(lease_id)
    if problem is None and owner is not None:
        problem = lease_owner_problem(owner)
    if problem is not None:
        raise errors.InvalidLeaseIdError(problem)


def check_duration(duration_ms: int, max_duration_ms: int) -> None:
    """Raise InvalidLeaseDurationError unless ``0 < duration_ms <= max_duration_ms``."""
    if duration_ms <= 0:
        raise errors.InvalidLeaseDurationError(f"lease duration must be positive, got {duration_ms} ms")
    if duration_ms > max_duration_ms:
        raise errors.InvalidLeaseDurationError(
            f"lease duration {duration_ms} ms exceeds kv.snapshot.lease.max-duration ({max_duration_ms} ms)")


def check_bucket(catalog: Catalog, tb: TableBucket, known: dict | None = None) -> None:
    """Raise TableNotExistError, PartitionNotExistsError, InvalidRequestError or BucketOutOfRangeError unless
    ``tb`` is a bucket of a table (of a partition of it, for a partitioned table). ``known``: what the catalog
    answered for earlier buckets of the same request (filled in here), so it is asked once per table or
    partition (an acquire of a 1,000-partition table names 4,000 buckets of 1,000 partitions)."""
    if known is None:
        return _check_range(tb, *catalog.buckets_of(tb))
    key = (tb.table_id, tb.partition_id)
    found = known.get(key)
    if found is None:
        found = known[key] = catalog.buckets_of(tb)
    if not 0 <= tb.bucket < found[1]:  # (the usual answer without a call: 4,000 buckets an acquire)
        _check_range(tb, *found)


def check_snapshots(catalog: Catalog, snapshots: Mapping[TableBucket, int]) -> None:
    """:func:`check_bucket` of each bucket of an acquire, and InvalidRequestError for a snapshot id below 0:
    the first bad one in order raises; the catalog is asked once per table or partition."""
    known: dict = {}
    for tb, sid in snapshots.items():
        check_bucket(catalog, tb, known)
        if sid < 0:
            raise errors.InvalidRequestError(f"bad snapshot id {sid} for bucket {tb}")


def _check_range(tb: TableBucket, where: str, count: int) -> None:
    if not 0 <= tb.bucket < count:
        raise errors.BucketOutOfRangeError(
            f"bucket {tb.bucket} out of range for {where} (id {tb.table_id}; buckets 0..{count - 1})")
