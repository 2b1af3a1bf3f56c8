"""Tier 1: random operation sequences against LeaseState + SnapshotStore.

The test plays the shell: it holds the writes in flight and settles them in a
random order (randomly failing some), hands deferred events back in, commits
snapshots, reclaims what becomes reclaimable, drops tables. A reference model
(plain dicts, changed only by acknowledged results) must equal
``state.leases`` after every step, and no protected snapshot may ever leave
the store.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlease.common import errors
from kvlease.coordinator.snapshots import SnapshotStore
from kvlease.common.model import Lease, SnapshotFile, SnapshotHandle, TableBucket
from kvlease.leases.state import (Acquire, AcquireOutcome, Deferred, Drop, Expire, LeasesExpired, LeaseState,
                                  PersistLease, Release, ReleaseOutcome, RemoveTable, Renew, Reply, Restore,
                                  RestoreOutcome, SnapshotsFreed, WriteDone, WriteFailed)
from tests.support.lease_harness import FakeCatalog, changed_tables_model

pytestmark = pytest.mark.unit

MAX_MS = 5_000
TICK = 1_000  # times move in ticks so that "expires exactly now" happens often
DURATIONS = st.integers(1, MAX_MS // TICK).map(lambda n: n * TICK)
LEASE_IDS = ("a", "b", "c")
FIRST_TABLES = {1: 3, 2: 2}


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = SnapshotStore(num_retained=2)
        self.catalog = FakeCatalog(self.store, dict(FIRST_TABLES))
        self.state = LeaseState(self.catalog, max_duration_ms=MAX_MS)
        self.model: dict[str, Lease] = {}   # acknowledged leases only
        self.now = 0
        self.next_event = 0
        self.next_table = max(FIRST_TABLES) + 1
        self.known_tables = set(FIRST_TABLES)  # including dropped ones, for requests that must fail
        self.dropping: set[int] = set()        # out of the catalog, RemoveTable not yet acknowledged
        self.inflight: dict[tuple[int, int], PersistLease] = {}
        self.deferred: list[object] = []
        # per event in progress: what the model expects once it is acknowledged
        self.expect: dict[int, dict] = {}
        self.injected: list[errors.KvLeaseError] = []  # the errors we made writes fail with
        self.settling: PersistLease | None = None  # the write whose WriteDone is being handled
        for table, count in FIRST_TABLES.items():
            for bucket in range(count):
                for sid in (0, 1):
                    self.store.add(self.handle_for(TableBucket(table, bucket), sid, sid))

    @initialize(num_retained=st.integers(1, 2))
    def retention(self, num_retained: int) -> None:
        self.store.num_retained = num_retained
        for handle in list(self.store.all()):
            self.reclaim(handle.bucket)

    # -- helpers --------------------------------------------------------------------------

    def event_id(self) -> int:
        self.next_event += 1
        return self.next_event

    @staticmethod
    def handle_for(tb: TableBucket, sid: int, offset: int) -> SnapshotHandle:
        return SnapshotHandle(tb, sid, offset, f"{tb}/{sid}.meta",
                              (SnapshotFile(f"{tb}/shared.sst", 1), SnapshotFile(f"{tb}/{sid}.sst", 1)))

    def busy(self, lease_id: str) -> bool:
        return any(w.lease_id == lease_id for w in self.inflight.values())

    def reclaim(self, tb: TableBucket) -> None:
        for handle in self.store.reclaimable(tb, self.state.is_protected):
            assert not self.state.refs.is_leased(tb, handle.snapshot_id)
            self.store.remove(handle)

    def done(self, write: PersistLease) -> None:
        """``write`` succeeded (already taken out of ``inflight``)."""
        self.settling = write
        self.feed(WriteDone(write.write_id))
        self.settling = None

    def feed(self, *events: object) -> None:
        out = self.state.handle(*events)
        self.state.validate()
        for instruction in out:
            self.process(instruction)

    def process(self, ins: object) -> None:
        if isinstance(ins, PersistLease):
            assert ins.write_id not in self.inflight
            assert not self.busy(ins.lease_id), "two writes in flight for one lease"
            self.inflight[ins.write_id] = ins
            exp = self.expect[ins.write_id[0]]
            want = exp["writes"].pop(ins.lease_id)
            assert (ins.before, ins.after) == (self.model.get(ins.lease_id), want)
            assert ins.changed_tables == changed_tables_model(ins.before, ins.after)
        elif isinstance(ins, Deferred):
            assert self.expect.pop(getattr(ins.event, "event_id")).get("deferred"), ins
            self.deferred.append(ins.event)
        elif isinstance(ins, SnapshotsFreed):
            for tb, sid in ins.snapshots:
                assert not self.state.refs.is_leased(tb, sid), "a held snapshot was reported freed"
                assert not any(lease.buckets.get(tb) == sid for lease in self.state.leases.values())
            for tb in {tb for tb, _ in ins.snapshots}:
                self.reclaim(tb)
        elif isinstance(ins, LeasesExpired):  # the write just done removed an expired lease (or replaced it)
            assert self.settling is not None and self.settling.reason in ("expire", "reacquire"), ins
            assert ins.lease_ids == (self.settling.lease_id,)
            assert self.state.leases.get(self.settling.lease_id) == self.settling.after
        elif isinstance(ins, Reply):
            self.on_reply(ins)
        else:
            raise AssertionError(f"unexpected instruction {ins!r}")

    def on_reply(self, reply: Reply) -> None:
        exp = self.expect.pop(reply.event_id)
        assert not exp.get("deferred"), f"expected the event to be deferred, got {reply}"
        assert not exp["writes"], "a write the model expected was not asked for"
        if exp.get("error"):
            assert isinstance(reply.error, exp["error"]), reply
            return
        if reply.error is not None:
            assert any(reply.error is e for e in self.injected), reply.error  # only failed writes fail requests
            if exp.get("table") is not None:  # the shell retries a table drop
                self.deferred.append(RemoveTable(exp["table"], event_id=self.event_id()))
            return
        assert reply.result == exp["result"], (reply, exp["result"])
        for lease_id, after in exp.get("apply", {}).items():
            self.set_model(lease_id, after)
        if exp.get("table") is not None:
            table = exp["table"]
            assert all(table not in lease.tables() for lease in self.state.leases.values())
            assert all(w.after is None or table not in w.after.tables() for w in self.inflight.values())
            handles, _ = self.store.remove_table(table)
            for handle in handles:
                assert not self.state.is_protected(handle.bucket, handle.snapshot_id)
            self.dropping.discard(table)

    def set_model(self, lease_id: str, after: Lease | None) -> None:
        if after is None:
            self.model.pop(lease_id, None)
        else:
            self.model[lease_id] = after

    def send(self, event: object, exp: dict) -> None:
        exp.setdefault("writes", {})  # lease_id -> the ``after`` its PersistLease must carry
        self.expect[event.event_id] = exp
        self.feed(event)

    # -- client requests --------------------------------------------------------------------

    def bucket_error(self, tb: TableBucket) -> type | None:
        count = self.catalog.tables.get(tb.table_id)
        if count is None:
            return errors.TableNotExistError
        if not 0 <= tb.bucket < count:
            return errors.BucketOutOfRangeError
        return None

    @rule(data=st.data(), lease_id=st.sampled_from(LEASE_IDS), duration=DURATIONS)
    def acquire(self, data, lease_id: str, duration: int) -> None:
        live = [TableBucket(t, b) for t, n in sorted(self.catalog.tables.items()) for b in range(n)]
        bad = [TableBucket(t, 3) for t in sorted(self.known_tables)]  # dropped tables, buckets out of range
        bad += [TableBucket(t, 0) for t in sorted(self.known_tables - set(self.catalog.tables))]
        pick = st.sampled_from(live) if live else st.sampled_from(bad)
        if data.draw(st.integers(0, 9)) == 0:
            pick = st.sampled_from(bad)
        snaps = {}
        for tb in data.draw(st.lists(pick, min_size=1, max_size=3, unique=True)):
            stored = [h.snapshot_id for h in self.store.bucket_snapshots(tb)]
            latest = max(stored, default=-1)
            # mostly a stored snapshot; sometimes one never committed or already deleted
            snaps[tb] = data.draw(st.sampled_from(stored * 3 + [latest + 1, 0]))
        event = Acquire(lease_id, snaps, duration, self.now, event_id=self.event_id())
        self.send(event, self.expect_acquire(lease_id, snaps, duration, self.now))
        if data.draw(st.integers(0, 2)) == 0:  # a quick write: it succeeds before anything else happens
            for write_id in [w for w in self.inflight if w[0] == event.event_id]:
                self.done(self.inflight.pop(write_id))

    @rule(data=st.data(), lease_id=st.sampled_from(LEASE_IDS), duration=DURATIONS)
    def acquire_again(self, data, lease_id: str, duration: int) -> None:
        """Acquire twice as often as anything else: most other requests need a lease."""
        self.acquire(data, lease_id, duration)

    def some_lease(self, data) -> str:
        """Mostly a lease the model knows; sometimes any id (maybe unknown)."""
        if self.model and data.draw(st.integers(0, 4)):
            return data.draw(st.sampled_from(sorted(self.model)))
        return data.draw(st.sampled_from(LEASE_IDS))

    def expect_acquire(self, lease_id: str, snaps: dict, duration: int, now: int) -> dict:
        for tb in snaps:
            error = self.bucket_error(tb)
            if error:
                return {"error": error}
        if self.busy(lease_id):
            return {"deferred": True}
        acquired = {tb: sid for tb, sid in snaps.items() if self.store.has_snapshot(tb, sid)}
        unavailable = {tb: sid for tb, sid in snaps.items() if tb not in acquired}
        before = self.model.get(lease_id)
        held = {} if before is None or before.expiration_time <= now else dict(before.buckets)  # expired: anew
        if not held and not acquired:
            if before is None:
                return {"result": AcquireOutcome(0, {}, unavailable)}
            return {"result": AcquireOutcome(0, {}, unavailable), "writes": {lease_id: None},
                    "apply": {lease_id: None}}
        after = Lease(lease_id, now + duration, {**held, **acquired})
        return {"result": AcquireOutcome(now + duration, acquired, unavailable),
                "writes": {lease_id: after}, "apply": {lease_id: after}}

    @rule(data=st.data(), duration=DURATIONS)
    def renew(self, data, duration: int) -> None:
        lease_id = self.some_lease(data)
        self.send(Renew(lease_id, duration, self.now, event_id=self.event_id()),
                  self.expect_renew(lease_id, duration, self.now))

    def expect_renew(self, lease_id: str, duration: int, now: int) -> dict:
        if self.busy(lease_id):
            return {"deferred": True}
        if lease_id not in self.model:
            return {"error": errors.LeaseNotFoundError}
        if self.model[lease_id].expiration_time <= now:  # not found; dropped if that write succeeds
            return {"error": errors.LeaseNotFoundError, "writes": {lease_id: None}, "per_write": True}
        after = replace(self.model[lease_id], expiration_time=now + duration, graced=False)
        return {"result": now + duration, "writes": {lease_id: after}, "apply": {lease_id: after}}

    @rule(data=st.data())
    def release(self, data) -> None:
        lease_id = self.some_lease(data)
        held = sorted(self.model[lease_id].buckets, key=TableBucket.sort_key) if lease_id in self.model else []
        pool = held + [TableBucket(t, b) for t in sorted(self.known_tables) for b in range(2)]
        buckets = frozenset(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))
        self.send(Release(lease_id, buckets, self.now, event_id=self.event_id()),
                  self.expect_release(lease_id, buckets, self.now))

    def expect_release(self, lease_id: str, buckets: frozenset, now: int) -> dict:
        for tb in sorted(buckets, key=TableBucket.sort_key):
            error = self.bucket_error(tb)
            if error:
                return {"error": error}
        if self.busy(lease_id):
            return {"deferred": True}
        if lease_id not in self.model:
            return {"result": ReleaseOutcome(False, False)}
        before = self.model[lease_id]
        if before.expiration_time <= now:
            return {"result": ReleaseOutcome(False, False), "writes": {lease_id: None}, "apply": {lease_id: None}}
        remaining = {tb: sid for tb, sid in before.buckets.items() if tb not in buckets}
        if len(remaining) == len(before.buckets):
            return {"result": ReleaseOutcome(False, True)}
        after = replace(before, buckets=remaining) if remaining else None
        return {"result": ReleaseOutcome(True, after is not None), "writes": {lease_id: after},
                "apply": {lease_id: after}}

    @rule(data=st.data())
    def drop(self, data) -> None:
        lease_id = self.some_lease(data)
        self.send(Drop(lease_id, self.now, event_id=self.event_id()), self.expect_drop(lease_id, self.now))

    def expect_drop(self, lease_id: str, now: int) -> dict:
        if self.busy(lease_id):
            return {"deferred": True}
        if lease_id not in self.model:
            return {"result": False}
        live = self.model[lease_id].expiration_time > now
        return {"result": live, "writes": {lease_id: None}, "apply": {lease_id: None}}

    # -- timer, tables, snapshots ------------------------------------------------------------

    @rule(ticks=st.integers(0, 3))
    def advance_clock(self, ticks: int) -> None:
        self.now += ticks * TICK

    @rule()
    def expire(self) -> None:
        expired = {lid: None for lid, lease in self.model.items()
                   if lease.expiration_time <= self.now and not self.busy(lid)}
        # expiry is system-initiated: each lease's removal is acknowledged by its own WriteDone
        self.send(Expire(self.now, event_id=self.event_id()),
                  {"result": None, "writes": dict(expired), "per_write": True})

    @rule(data=st.data())
    def commit_snapshot(self, data) -> None:
        live = sorted(self.catalog.tables.items())
        if not live:
            return
        # often a bucket an acquire in flight is about to lease: the race with reclaiming
        racing = sorted({tb for w in self.inflight.values() if w.after for tb in w.after.buckets
                         if tb.table_id in self.catalog.tables}, key=TableBucket.sort_key)
        if racing and data.draw(st.booleans()):
            tb = data.draw(st.sampled_from(racing))
        else:
            table, count = data.draw(st.sampled_from(live))
            tb = TableBucket(table, data.draw(st.integers(0, count - 1)))
        for _ in range(data.draw(st.integers(1, 2))):  # sometimes two in a row: enough to pass retention
            latest = self.store.latest(tb)
            sid = (latest.snapshot_id if latest else -1) + data.draw(st.integers(1, 2))
            offset = (latest.log_offset if latest else 0) + data.draw(st.integers(0, 5))
            handle = self.handle_for(tb, sid, offset)
            assert self.store.check_commit(handle)
            self.store.add(handle)
            assert self.store.check_commit(handle) is False  # a retried commit is a no-op
            self.reclaim(tb)

    @precondition(lambda self: len(self.catalog.tables) < 2)
    @rule()
    def create_table(self) -> None:
        table = self.next_table
        self.next_table += 1
        self.catalog.tables[table] = 1 + table % 3
        self.known_tables.add(table)

    @rule(data=st.data())
    def drop_table(self, data) -> None:
        live = sorted(self.catalog.tables)
        if not live or data.draw(st.integers(0, 2)):  # rarer than the rest: most steps want live tables
            return
        # often a table an acquire in flight is about to add to a lease
        racing = sorted({t for w in self.inflight.values() if w.after for t in w.after.tables()} & set(live))
        table = data.draw(st.sampled_from(racing if racing and data.draw(st.booleans()) else live))
        del self.catalog.tables[table]  # no new acquires from now on; then take it out of the leases
        self.dropping.add(table)
        self.send(RemoveTable(table, event_id=self.event_id()), self.expect_remove_table(table))

    def expect_remove_table(self, table: int) -> dict:
        holders = [lease for lease in self.model.values() if table in lease.tables()]
        if any(self.busy(lease.lease_id) for lease in holders) or any(
                w.after is not None and table in w.after.tables() for w in self.inflight.values()):
            return {"deferred": True}
        writes = {}
        for lease in holders:
            remaining = {tb: sid for tb, sid in lease.buckets.items() if tb.table_id != table}
            writes[lease.lease_id] = replace(lease, buckets=remaining) if remaining else None
        return {"result": None, "writes": writes, "per_write": True, "table": table}

    # -- the shell's side: settle writes, hand deferred events back, failover --------------------

    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), fail=st.integers(0, 2))
    def settle_write(self, data, fail: int) -> None:
        ok = fail != 0  # one write in three fails
        write_id = data.draw(st.sampled_from(sorted(self.inflight)))
        write = self.inflight.pop(write_id)
        exp = self.expect[write_id[0]]
        if ok:
            if exp.get("per_write"):
                self.set_model(write.lease_id, write.after)
            self.done(write)
        else:
            error = errors.StorageError("injected")
            self.injected.append(error)
            self.feed(WriteFailed(write_id, error))

    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), fail=st.integers(0, 2))
    def settle_write_again(self, data, fail: int) -> None:
        """Settling is as common as sending: most interleavings need writes to finish."""
        self.settle_write(data, fail)

    @precondition(lambda self: self.inflight)
    @rule()
    def settle_all_writes(self) -> None:
        """A quiet moment: every write in flight succeeds, oldest first."""
        for write_id in sorted(self.inflight):
            write = self.inflight.pop(write_id)
            if self.expect[write_id[0]].get("per_write"):
                self.set_model(write.lease_id, write.after)
            self.done(write)

    @precondition(lambda self: self.deferred)
    @rule(data=st.data())
    def hand_back_deferred(self, data) -> None:
        event = self.deferred.pop(data.draw(st.integers(0, len(self.deferred) - 1)))
        if isinstance(event, Acquire):
            exp = self.expect_acquire(event.lease_id, event.snapshots, event.duration_ms, event.now_ms)
        elif isinstance(event, Renew):
            exp = self.expect_renew(event.lease_id, event.duration_ms, event.now_ms)
        elif isinstance(event, Release):
            exp = self.expect_release(event.lease_id, event.buckets, event.now_ms)
        elif isinstance(event, Drop):
            exp = self.expect_drop(event.lease_id, event.now_ms)
        else:
            exp = self.expect_remove_table(event.table_id)
        self.send(event, exp)

    @precondition(lambda self: not self.inflight)
    @rule(grace=st.integers(0, 3).map(lambda n: n * TICK))
    def failover(self, grace: int) -> None:
        """A new coordinator loads the acknowledged leases; deferred requests die with the old one.

        Expired leases get the grace once (written back), or are dropped if they
        had it; the shell persists those writes before it serves.
        """
        self.deferred = [e for e in self.deferred if isinstance(e, RemoveTable)]  # table drops resume
        self.expect = {}
        loaded = tuple(self.model.values())
        self.state = LeaseState(self.catalog, max_duration_ms=MAX_MS)
        writes: dict[str, Lease | None] = {}
        for lid, lease in sorted(self.model.items()):
            if lease.expiration_time <= self.now:
                writes[lid] = None if lease.graced else replace(lease, expiration_time=self.now + grace, graced=True)
        outcome = RestoreOutcome(len(loaded), tuple(lid for lid, w in writes.items() if w is not None),
                                 tuple(lid for lid, w in writes.items() if w is None))
        eid = self.event_id()
        self.send(Restore(loaded, self.now, grace, event_id=eid),
                  {"result": outcome, "writes": dict(writes), "per_write": True})
        for write_id in sorted(self.inflight):
            write = self.inflight.pop(write_id)
            self.set_model(write.lease_id, write.after)
            self.done(write)
        assert eid not in self.expect, "restore did not reply once its writes were done"

    # -- invariants --------------------------------------------------------------------------------

    @invariant()
    def model_matches(self) -> None:
        assert self.state.leases == self.model

    @invariant()
    def store_keeps_every_protected_snapshot(self) -> None:
        in_flight = [(tb, sid) for w in self.inflight.values() if w.after for tb, sid in w.after.buckets.items()]
        self.store.validate(is_leased=self.state.is_protected,
                            leased=list(self.state.refs.leased()) + in_flight)

    @invariant()
    def leases_name_no_dropped_table(self) -> None:
        gone = self.known_tables - set(self.catalog.tables) - self.dropping
        assert all(not (lease.tables() & gone) for lease in self.state.leases.values())


TestLeaseStateRandom = LeaseMachine.TestCase
TestLeaseStateRandom.settings = settings(max_examples=200, stateful_step_count=30, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
