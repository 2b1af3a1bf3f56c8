"""What the lease state machine (:mod:`kvlease.leases.state`) takes in and gives out.

Events are the requests callers send (:class:`Acquire`, :class:`Renew`,
:class:`Release`, :class:`Drop`) and the shell's own (:class:`Expire`,
:class:`RemoveTable`, :class:`Restore`, and the write outcomes
:class:`WriteDone` / :class:`WriteFailed`). Instructions are what the shell
carries out (:class:`PersistLease`, :class:`Reply`, :class:`Deferred`,
:class:`SnapshotsFreed`, :class:`LeasesExpired`); the outcomes are the results
a :class:`Reply` carries. All are small frozen dataclasses; :mod:`kvlease.leases.state`
re-exports them, so ``from leases import state as ls; ls.Acquire(...)`` works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kvlease.common import errors
from kvlease.common.model import Lease, TableBucket
from kvlease.common.statemachine import Event, Instruction
from kvlease.leases.refcount import RefcountIndex


# --- events --------------------------------------------------------------------

@dataclass(frozen=True)
class Acquire(Event):
    lease_id: str
    snapshots: Mapping[TableBucket, int]
    duration_ms: int
    now_ms: int | None = None  # None: the shell stamps its clock before handing it in
    owner: str | None = None  # the requesting reader's token (see the module's docstring)


@dataclass(frozen=True)
class Renew(Event):
    lease_id: str
    duration_ms: int
    now_ms: int | None = None  # None: the shell stamps its clock before handing it in
    owner: str | None = None  # the requesting reader's token (see the module's docstring)


@dataclass(frozen=True)
class Release(Event):
    lease_id: str
    buckets: frozenset[TableBucket]
    now_ms: int | None = None  # None: the shell stamps its clock before handing it in
    owner: str | None = None  # the requesting reader's token (see the module's docstring)


@dataclass(frozen=True)
class Drop(Event):
    lease_id: str
    now_ms: int | None = None  # None: the shell stamps its clock before handing it in
    owner: str | None = None  # the requesting reader's token (see the module's docstring)


@dataclass(frozen=True)
class Expire(Event):
    """Drop the leases whose deadline passed (the shell's timer)."""

    now_ms: int | None = None


@dataclass(frozen=True)
class RemoveTable(Event):
    """A table is being dropped, or one of its partitions (``partition_id`` set): take it out of every lease."""

    table_id: int
    partition_id: int | None = None

    def names(self, tb: TableBucket) -> bool:
        """``tb`` is a bucket of what is being dropped."""
        return tb.table_id == self.table_id and (self.partition_id is None or tb.partition_id == self.partition_id)


@dataclass(frozen=True)
class Restore(Event):
    """Failover: the leases loaded from storage.

    An expired lease gets ``grace_ms`` once (written back, marked ``graced``);
    an expired lease that already had its grace is dropped.
    """

    leases: tuple[Lease, ...]
    now_ms: int
    grace_ms: int
    #: the refcount index of exactly these leases, if the caller has it (a standby's mirror keeps
    #: one as it reads them); None: built here. Taken over, not copied.
    refs: RefcountIndex | None = None


@dataclass(frozen=True)
class WriteDone(Event):
    write_id: tuple[int, int]


@dataclass(frozen=True)
class WriteFailed(Event):
    write_id: tuple[int, int]
    error: errors.KvLeaseError


# --- instructions ------------------------------------------------------------------

@dataclass(frozen=True)
class PersistLease(Instruction):
    """Write ``after`` (None: delete the lease); only ``changed_tables`` need new files.

    ``reason``: acquire, reacquire (a new lease replaces an expired one), renew,
    release, drop, expire (the deadline passed), drop-table, grace (failover).
    """

    write_id: tuple[int, int]
    reason: str
    before: Lease | None
    after: Lease | None
    changed_tables: frozenset[int]

    @property
    def lease_id(self) -> str:
        return (self.after or self.before).lease_id  # type: ignore[union-attr]


@dataclass(frozen=True)
class Reply(Instruction):
    event_id: int
    result: object = None
    error: errors.KvLeaseError | None = None


@dataclass(frozen=True)
class Deferred(Instruction):
    """The event touches a lease whose write is in flight: hand it in again later."""

    event: Event


@dataclass(frozen=True)
class SnapshotsFreed(Instruction):
    """These snapshots are no longer held by any lease."""

    snapshots: tuple[tuple[TableBucket, int], ...]


@dataclass(frozen=True)
class LeasesExpired(Instruction):
    lease_ids: tuple[str, ...]


@dataclass(frozen=True)
class AcquireOutcome:
    expiration_time: int
    acquired: dict[TableBucket, int]
    unavailable: dict[TableBucket, int]


@dataclass(frozen=True)
class ReleaseOutcome:
    released: bool  # the lease held at least one of the buckets, and now does not
    lease_remains: bool  # the lease still holds buckets (False: it is gone, or never was)


@dataclass(frozen=True)
class RestoreOutcome:
    leases: int  # how many were loaded
    graced: tuple[str, ...]  # expired during the gap: granted the grace (written back)
    expired: tuple[str, ...]  # expired during the gap after their grace: dropped
