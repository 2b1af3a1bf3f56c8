"""The pure lease state machine: ``LeaseState.handle(*events) -> list[Instruction]``.

No ZooKeeper, storage, gRPC or clock inside: time arrives in the events.
Persist, then apply: a request that changes a lease yields a
:class:`PersistLease`; memory changes only when the shell feeds back
:class:`WriteDone` for it (``WriteFailed`` changes nothing and answers the
request with the error). One write per lease is in flight at a time; an event
for a lease with a write in flight yields :class:`Deferred` and the shell
hands it in again later.

The events and instructions are in :mod:`kvlease.leases.events` (re-exported
here); the checks a request passes first, and the errors it answers with, in
:mod:`kvlease.leases.checks`.

Built on :mod:`kvlease.common.statemachine`: each event carries an ``event_id`` (the
replies it causes name it) and has one registered handler. The lease requests
callers send (acquire, renew, release, drop) are these events themselves; a
caller may leave ``now_ms`` unset and the shell stamps its clock on hand-in.

Retry-safe rules (docs/architecture.md, "Leases"):

- A lease whose deadline has passed (``expiration_time <= now_ms``) is expired
  for every request, also before the expiry timer dropped it. A request that
  meets one drops it (persisted like an expiry) and then answers as for an
  unknown lease: renew is ``LEASE_NOT_FOUND``, release and drop answer
  false, and acquire starts a new lease (only its own buckets, a new
  deadline; one write replaces the expired lease).
- Release of buckets the lease does not hold, or of an unknown lease,
  succeeds and answers ``released=False``: a retried release finds nothing
  to do and says so. Buckets are still checked (unknown table, out of range).
- Failover (:class:`Restore`): a lease that expired while no coordinator was
  active gets the grace once; the new deadline is written back, marked
  ``graced``, so a later failover drops it instead of granting it again.
- Owners: a request may carry the ``owner`` token of the reader it comes
  from. Acquire of a live lease with another owner (an unowned lease counts
  as the owner None) is refused (``LEASE_OWNED``), changing nothing; a new or
  expired lease takes the acquire's owner. Renew with an owner is refused the
  same way; release and drop with an owner answer as for an unknown lease
  (the caller's lease is gone: a retry after another reader took the id
  changes nothing of theirs). Renew, release and drop without an owner act on
  any lease (an operator's commands).

Cost does not grow with idle leases: the deadlines are a heap
(:mod:`kvlease.leases.deadlines`), so an expiry tick with nothing due is a peek, and
the counts the metrics read (leases per table, leased snapshots) are kept up
to date as leases change (:meth:`LeaseState.lease_counts`). Every change of
``leases`` goes through ``_put`` / ``_pop``, which keep both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable

from kvlease.common import errors
from kvlease.common.model import Lease, TableBucket
from kvlease.common.statemachine import Event, StateMachine, on
from kvlease.leases import deadlines
from kvlease.leases.checks import (Catalog, check_bucket, check_duration, check_id, check_snapshots, expired, foreign,
                                   not_found_error, owned_error)
from kvlease.leases.deadlines import Deadlines
# the events, instructions and outcomes, re-exported: callers write ``ls.Acquire``, ``ls.Reply``
from kvlease.leases.events import (Acquire, AcquireOutcome, Deferred, Drop, Expire, LeasesExpired, PersistLease,
                                   Release, ReleaseOutcome, RemoveTable, Renew, Reply, Restore, RestoreOutcome,
                                   SnapshotsFreed, WriteDone, WriteFailed)
from kvlease.leases.refcount import RefcountIndex

__all__ = ["LeaseState", "Catalog", "Acquire", "Renew", "Release", "Drop", "Expire", "RemoveTable", "Restore",
           "WriteDone", "WriteFailed", "PersistLease", "Reply", "Deferred", "SnapshotsFreed", "LeasesExpired",
           "AcquireOutcome", "ReleaseOutcome", "RestoreOutcome"]

#: the reasons of writes that remove a lease because its deadline passed
_EXPIRING = ("expire", "reacquire")


@dataclass
class _Parent:
    remaining: int
    result: object
    error: errors.KvLeaseError | None = None


@dataclass
class LeaseState(StateMachine):
    catalog: Catalog
    max_duration_ms: int
    leases: dict[str, Lease] = field(default_factory=dict)
    refs: RefcountIndex = field(default_factory=RefcountIndex)
    _pending: dict[tuple[int, int], PersistLease] = field(default_factory=dict)
    _pending_leases: set[str] = field(default_factory=set)
    _parents: dict[int, _Parent] = field(default_factory=dict)
    _deadlines: Deadlines = field(default_factory=Deadlines)
    _table_leases: Counter[int] = field(default_factory=Counter)  # table -> leases holding a bucket of it
    _partition_leases: Counter[tuple[int, int]] = field(default_factory=Counter)  # (table, partition) -> leases

    # -- queries (the entry point is StateMachine.handle) ------------------------

    def busy(self, lease_id: str) -> bool:
        return lease_id in self._pending_leases

    def get(self, lease_id: str) -> Lease | None:
        """The lease as applied, also if its deadline passed (the expiry timer has not run yet)."""
        return self.leases.get(lease_id)

    def live(self, lease_id: str, now_ms: int) -> Lease | None:
        """The lease if it exists and its deadline has not passed at ``now_ms``."""
        lease = self.leases.get(lease_id)
        return None if lease is None or expired(lease, now_ms) else lease

    def lease_counts(self) -> tuple[int, dict[int, int]]:
        """How many leases there are, and per table how many hold a bucket of it (O(tables))."""
        return len(self.leases), dict(self._table_leases)

    def partition_lease_counts(self) -> dict[tuple[int, int], int]:
        """Per (table id, partition id), how many leases hold a bucket of the partition (O(partitions held))."""
        return dict(self._partition_leases)

    def live_leases(self, now_ms: int) -> list[Lease]:
        """Every lease whose deadline has not passed at ``now_ms``, by id."""
        return sorted((lease for lease in self.leases.values() if not expired(lease, now_ms)),
                      key=lambda lease: lease.lease_id)

    def is_protected(self, tb: TableBucket, snapshot_id: int) -> bool:
        """Leased, or about to be: held by a lease or by the ``after`` of a write in flight.

        Pass this (not ``refs.is_leased``) to ``SnapshotStore.reclaimable``: an
        acquire in flight has not reached ``refs`` yet, but its snapshot must not
        be deleted before its WriteDone arrives.
        """
        if self.refs.is_leased(tb, snapshot_id):
            return True
        return any(w.after is not None and w.after.buckets.get(tb) == snapshot_id
                   for w in self._pending.values())

    # -- requests -----------------------------------------------------------------

    def _now(self, ev: Event) -> int:
        now_ms = getattr(ev, "now_ms", None)
        if now_ms is None:
            raise ValueError(f"{type(ev).__name__} {ev.event_id} has no now_ms: the shell stamps it")
        return now_ms

    @on(Acquire)
    def _on_acquire(self, ev: Acquire) -> list[object]:
        try:
            check_id(ev.lease_id, ev.owner)
            if not ev.snapshots:
                raise errors.InvalidRequestError("acquire needs at least one bucket snapshot")
            check_duration(ev.duration_ms, self.max_duration_ms)
            check_snapshots(self.catalog, ev.snapshots)
        except errors.KvLeaseError as exc:
            return [Reply(ev.event_id, error=exc)]
        if self.busy(ev.lease_id):
            return [Deferred(ev)]
        now = self._now(ev)
        has_snapshot = self.catalog.has_snapshot
        acquired = {tb: sid for tb, sid in ev.snapshots.items() if has_snapshot(tb, sid)}
        unavailable = ({} if len(acquired) == len(ev.snapshots)
                       else {tb: sid for tb, sid in ev.snapshots.items() if tb not in acquired})
        before = self.leases.get(ev.lease_id)
        reason = "acquire"
        held = dict(before.buckets) if before else {}
        if before is not None and expired(before, now):  # a new lease replaces the expired one
            reason, held = "reacquire", {}
        elif before is not None and before.owner != ev.owner:  # another reader's: change nothing
            return [Reply(ev.event_id, error=owned_error(before, ev.owner))]
        if not held and not acquired:  # never an empty lease
            nothing = AcquireOutcome(0, {}, unavailable)
            if before is None:
                return [Reply(ev.event_id, nothing)]
            return self._persist(ev.event_id, [("expire", before, None)], nothing)
        expiration = now + ev.duration_ms
        after = Lease(ev.lease_id, expiration, {**held, **acquired}, owner=ev.owner)
        return self._persist(ev.event_id, [(reason, before, after)], AcquireOutcome(expiration, acquired, unavailable))

    @on(Renew)
    def _on_renew(self, ev: Renew) -> list[object]:
        try:
            check_id(ev.lease_id, ev.owner)
            check_duration(ev.duration_ms, self.max_duration_ms)
        except errors.KvLeaseError as exc:
            return [Reply(ev.event_id, error=exc)]
        if self.busy(ev.lease_id):
            return [Deferred(ev)]
        now = self._now(ev)
        before = self.leases.get(ev.lease_id)
        if before is None:
            return [Reply(ev.event_id, error=not_found_error(ev.lease_id))]
        if expired(before, now):  # not found, whether or not dropping it is written
            return self._persist(ev.event_id, [("expire", before, None)], None, not_found_error(ev.lease_id, before))
        if foreign(before, ev.owner):
            return [Reply(ev.event_id, error=owned_error(before, ev.owner))]
        after = replace(before, expiration_time=now + ev.duration_ms, graced=False)
        return self._persist(ev.event_id, [("renew", before, after)], after.expiration_time)

    @on(Release)
    def _on_release(self, ev: Release) -> list[object]:
        try:
            check_id(ev.lease_id, ev.owner)
            if not ev.buckets:
                raise errors.InvalidRequestError("release needs at least one bucket")
            known: dict = {}
            for tb in sorted(ev.buckets, key=TableBucket.sort_key):
                check_bucket(self.catalog, tb, known)
        except errors.KvLeaseError as exc:
            return [Reply(ev.event_id, error=exc)]
        if self.busy(ev.lease_id):
            return [Deferred(ev)]
        now = self._now(ev)
        before = self.leases.get(ev.lease_id)
        if before is None:
            return [Reply(ev.event_id, ReleaseOutcome(False, False))]  # a retry after the lease went
        if expired(before, now):
            return self._persist(ev.event_id, [("expire", before, None)], ReleaseOutcome(False, False))
        if foreign(before, ev.owner):  # the caller's lease is gone; this one is another reader's
            return [Reply(ev.event_id, ReleaseOutcome(False, False))]
        remaining = {tb: sid for tb, sid in before.buckets.items() if tb not in ev.buckets}
        if len(remaining) == len(before.buckets):
            return [Reply(ev.event_id, ReleaseOutcome(False, True))]  # none of them held: nothing to write
        after = replace(before, buckets=remaining) if remaining else None
        return self._persist(ev.event_id, [("release", before, after)], ReleaseOutcome(True, after is not None))

    @on(Drop)
    def _on_drop(self, ev: Drop) -> list[object]:
        try:
            check_id(ev.lease_id, ev.owner)
        except errors.KvLeaseError as exc:
            return [Reply(ev.event_id, error=exc)]
        if self.busy(ev.lease_id):
            return [Deferred(ev)]
        before = self.leases.get(ev.lease_id)
        if before is None:
            return [Reply(ev.event_id, False)]
        if expired(before, self._now(ev)):
            return self._persist(ev.event_id, [("expire", before, None)], False)
        if foreign(before, ev.owner):
            return [Reply(ev.event_id, False)]
        return self._persist(ev.event_id, [("drop", before, None)], True)

    @on(Expire)
    def _on_expire(self, ev: Expire) -> list[object]:
        """Drop the leases whose deadline passed, earliest first: O(what is due), not O(leases).

        A due lease with a write in flight is left for a later tick (its deadline goes
        back on the heap; the write may renew or remove it).
        """
        now = self._now(ev)
        due = []
        for lease_id in self._deadlines.pop_due(now, self._deadline_of):
            lease = self.leases[lease_id]
            if self.busy(lease_id):
                self._push_deadline(lease)
            else:
                due.append(lease)
        return self._persist(ev.event_id, [("expire", lease, None) for lease in due], None)

    @on(RemoveTable)
    def _on_removetable(self, ev: RemoveTable) -> list[object]:
        holders = [lease for lease in (self.leases[lease_id] for lease_id in
                                       sorted(self.refs.holders_of_table(ev.table_id)))
                   if any(ev.names(tb) for tb in lease.buckets)]
        if any(self.busy(lease.lease_id) for lease in holders) or any(
                w.after is not None and any(ev.names(tb) for tb in w.after.buckets) for w in self._pending.values()):
            return [Deferred(ev)]  # also wait for an acquire in flight that adds the table
        changes = []
        for before in holders:
            remaining = {tb: sid for tb, sid in before.buckets.items() if not ev.names(tb)}
            changes.append(("drop-table", before, replace(before, buckets=remaining) if remaining else None))
        return self._persist(ev.event_id, changes, None)

    @on(Restore)
    def _on_restore(self, ev: Restore) -> list[object]:
        """Load the persisted leases as they are; write back what the gap changed.

        A lease expired during the gap gets the grace once: the new deadline is
        persisted (and only then applied) with ``graced`` set. One that already
        had its grace is dropped. Until those writes are done the leases hold
        their stored deadlines and are busy, so nothing else touches them.
        """
        if self._pending:
            raise RuntimeError("restore with writes in flight")
        self._load(ev.leases, ev.refs)
        changes: list[tuple[str, Lease | None, Lease | None]] = []
        now = ev.now_ms
        for lease in sorted((lease for lease in self.leases.values() if lease.expiration_time <= now),
                            key=lambda lease: lease.lease_id):
            if lease.graced:
                changes.append(("expire", lease, None))
            else:
                changes.append(("grace", lease, replace(lease, expiration_time=ev.now_ms + ev.grace_ms, graced=True)))
        outcome = RestoreOutcome(len(self.leases), tuple(b.lease_id for r, b, _a in changes if r == "grace"),
                                 tuple(b.lease_id for r, b, _a in changes if r == "expire"))
        return self._persist(ev.event_id, changes, outcome)

    # -- persistence results -----------------------------------------------------------

    def _persist(self, event_id: int, changes: list[tuple[str, Lease | None, Lease | None]],
                 result: object, error: errors.KvLeaseError | None = None) -> list[object]:
        """Ask for one write per ``(reason, before, after)``; the reply waits for all of them.

        ``error``: the reply's error whatever the writes' outcome (else the first
        failed write's error, or ``result``).
        """
        if not changes:
            return [Reply(event_id, result, error)]
        out: list[object] = []
        self._parents[event_id] = _Parent(len(changes), result, error)
        for index, (reason, before, after) in enumerate(changes):
            write = PersistLease((event_id, index), reason, before, after, _changed_tables(before, after))
            self._pending[write.write_id] = write
            self._pending_leases.add(write.lease_id)
            out.append(write)
        return out

    def _finish(self, write: PersistLease, error: errors.KvLeaseError | None) -> list[object]:
        self._pending_leases.discard(write.lease_id)
        event_id = write.write_id[0]
        parent = self._parents[event_id]
        parent.remaining -= 1
        parent.error = parent.error or error
        if parent.remaining:
            return []
        del self._parents[event_id]
        if parent.error is not None:
            return [Reply(event_id, error=parent.error)]
        return [Reply(event_id, parent.result)]

    @on(WriteDone)
    def _on_writedone(self, ev: WriteDone) -> list[object]:
        write = self._pending.pop(ev.write_id)
        before, after = write.before, write.after
        old = dict(before.buckets) if before else {}
        new = dict(after.buckets) if after else {}
        freed = []
        for tb, sid in old.items():
            if new.get(tb) != sid and self.refs.remove(write.lease_id, tb, sid):
                freed.append((tb, sid))
        self.refs.add_all(write.lease_id, [(tb, sid) for tb, sid in new.items() if old.get(tb) != sid] if old
                          else new.items())
        if after is None:
            self._pop(write.lease_id)
        else:
            self._put(after)
        out: list[object] = []
        if write.reason in _EXPIRING:
            out.append(LeasesExpired((write.lease_id,)))
        if freed:
            out.append(SnapshotsFreed(tuple(freed)))
        out.extend(self._finish(write, None))
        return out

    @on(WriteFailed)
    def _on_writefailed(self, ev: WriteFailed) -> list[object]:
        write = self._pending.pop(ev.write_id)
        # snapshots only this write's ``after`` protected (see is_protected) are reclaimable now
        old = write.before.buckets if write.before else {}
        new = write.after.buckets if write.after else {}
        unpinned = tuple((tb, sid) for tb, sid in new.items()
                         if old.get(tb) != sid and not self.is_protected(tb, sid))
        lease = self.leases.get(write.lease_id)
        if lease is not None:  # an expiry tick took its deadline off the heap: it is still due
            self._push_deadline(lease)
        out: list[object] = [SnapshotsFreed(unpinned)] if unpinned else []
        return out + self._finish(write, ev.error)

    # -- the leases, with their deadlines and counts -------------------------------------

    def _deadline_of(self, lease_id: str) -> int | None:
        lease = self.leases.get(lease_id)
        return None if lease is None else lease.expiration_time

    def _load(self, leases: Iterable[Lease], refs: RefcountIndex | None = None) -> None:
        """Replace every lease (failover): index (unless given), heap and counts built in one pass each."""
        self.leases = {lease.lease_id: lease for lease in leases}
        self.refs = refs if refs is not None else RefcountIndex.from_leases(self.leases.values())
        self._deadlines = Deadlines([(lease.expiration_time, lease_id) for lease_id, lease in self.leases.items()])
        self._table_leases = self.refs.holder_counts_by_table()
        self._partition_leases = Counter(p for lease in self.leases.values() for p in lease.partitions())

    def _put(self, lease: Lease) -> None:
        before = self.leases.get(lease.lease_id)
        self.leases[lease.lease_id] = lease
        if before is None or before.expiration_time != lease.expiration_time:
            self._push_deadline(lease)  # the old entry goes stale
        self._count_tables(before, lease)

    def _pop(self, lease_id: str) -> None:
        before = self.leases.pop(lease_id, None)
        if before is not None:
            self._count_tables(before, None)
            self._deadlines.maybe_compact(len(self.leases), self._heap_entries)  # its entry went stale

    def _push_deadline(self, lease: Lease) -> None:
        self._deadlines.push(lease.expiration_time, lease.lease_id)
        self._deadlines.maybe_compact(len(self.leases), self._heap_entries)

    def _count_tables(self, before: Lease | None, after: Lease | None) -> None:
        """The leases per table and per partition, as ``before`` becomes ``after`` (a renew: unchanged)."""
        if before is not None and after is not None and before.buckets is after.buckets:
            return
        for counts, held in ((self._table_leases, Lease.tables), (self._partition_leases, Lease.partitions)):
            old = held(before) if before is not None else set()
            new = held(after) if after is not None else set()
            for key in new - old:
                counts[key] += 1
            for key in old - new:
                counts[key] -= 1
                if not counts[key]:
                    del counts[key]

    def _heap_entries(self) -> Iterable[tuple[int, str]]:
        return ((lease.expiration_time, lease_id) for lease_id, lease in self.leases.items())

    # -- invariants ----------------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if an invariant does not hold."""
        rebuilt = RefcountIndex.from_leases(self.leases.values())
        assert rebuilt == self.refs, "refcount index differs from the leases' contents"
        for lease_id, lease in self.leases.items():
            assert lease.lease_id == lease_id, f"lease stored under {lease_id!r} names {lease.lease_id!r}"
            assert lease.buckets, f"lease {lease_id!r} is empty"
        # an expiry tick takes a deadline off the heap when it asks to drop the lease: until that
        # write is done the lease has none (a failed write puts it back)
        removing = {w.lease_id for w in self._pending.values() if w.after is None}
        missing = set(self.leases) - self._deadlines.live_ids(self._deadline_of)
        assert missing <= removing, f"leases {sorted(missing)[:5]} have no deadline on the heap (never to expire)"
        assert len(self._deadlines) <= deadlines.SLACK * len(self.leases) + deadlines.FLOOR, \
            "stale deadlines were not compacted"
        tables = Counter(t for lease in self.leases.values() for t in lease.tables())
        assert tables == self._table_leases, "leases-per-table counts differ from the leases"
        partitions = Counter(p for lease in self.leases.values() for p in lease.partitions())
        assert partitions == self._partition_leases, "leases-per-partition counts differ from the leases"
        assert self.refs.recount() == (self.refs.leased_count(), self.refs.leased_count_by_table(),
                                       self.refs.leased_count_by_partition()), \
            "leased-snapshot counts differ from the refcount index"
        assert self._pending_leases == {w.lease_id for w in self._pending.values()}, "pending lease set drifted"
        assert len(self._pending_leases) == len(self._pending), "two writes in flight for one lease"


def _changed_tables(before: Lease | None, after: Lease | None) -> frozenset[int]:
    if after is None:
        return frozenset(before.tables()) if before else frozenset()
    tables = after.tables() | (before.tables() if before else set())
    return frozenset(t for t in tables
                     if before is None or before.table_buckets(t) != after.table_buckets(t))
