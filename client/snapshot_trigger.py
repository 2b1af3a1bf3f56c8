"""``TriggerSnapshot`` of a whole table, with what became of each bucket.

:func:`trigger_snapshots` sends each leader one request for its buckets, the
leaders in parallel (a tablet server snapshots its buckets in turn, and asks
the coordinator for the kept snapshots once per table). Each bucket ends in
one of four states:

- ``committed``: this trigger committed a new snapshot of it;
- ``unchanged``: nothing was written since its latest committed snapshot
  (maybe one the periodic snapshot took a moment before): that snapshot
  holds the bucket as of the trigger;
- ``empty``: nothing ever written, and no snapshot;
- ``failed``: not committed; the error says why.

A leader answers each bucket's failure on its own (``bucket_errors``), so one
bucket's failure never hides what its leader committed. A bucket that failed
with a retriable error (no live leader, an unreachable server, leadership
moved) is tried again with fresh routing within the client's retry budget;
once that is spent it is ``failed`` with its last error, and the other
buckets keep their outcome. Every request is idempotent: a bucket sent again
is snapshotted again only if it changed meanwhile.

Progress (``on_outcome``): each bucket's outcome as it is known. While the
leaders work, the coordinator's latest snapshots are polled every
``poll_s``: a bucket whose latest snapshot is newer than when the trigger
began is reported committed at once; the answers then report the rest.
"""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple

from kvlease.client.routing import REROUTE
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.wire import error_from_pb

COMMITTED, UNCHANGED, EMPTY, FAILED = "committed", "unchanged", "empty", "failed"


class CommittedSnapshot(NamedTuple):
    bucket: int
    snapshot_id: int
    log_offset: int


class BucketOutcome(NamedTuple):
    bucket: int
    state: str  # COMMITTED, UNCHANGED, EMPTY or FAILED
    snapshot: CommittedSnapshot | None = None  # COMMITTED: the new one (None without wait); UNCHANGED: the latest
    error: errors.KvLeaseError | None = None  # FAILED: why


#: ``on_outcome(outcome, done, total)``: a bucket's outcome became known; ``done`` of the ``total``
#: buckets are committed, unchanged or empty so far. Called from worker threads, one call at a time,
#: at most once per bucket and outcome.
OnOutcome = Callable[[BucketOutcome, int, int], None]


def trigger_snapshots(table, *, wait: bool = True, on_outcome: OnOutcome | None = None,
                      poll_s: float = 1.0) -> list[BucketOutcome]:
    """Snapshot every changed bucket of ``table`` (a :class:`kvlease.client.table.TableClient`) now; the outcome of
    each bucket, in bucket order. Without ``wait`` the leaders return no snapshots: a bucket that did not
    fail is ``committed`` with no ``snapshot``. Raises only what keeps the table from being routed at all
    (e.g. TableNotExistError)."""
    return _Trigger(table, wait, on_outcome, poll_s).run()


def raise_failed(outcomes: list[BucketOutcome], table_path: str) -> None:
    """Raise when a bucket failed: its own error if every bucket failed, else an error of the first
    failure's class naming every bucket not committed (``details["buckets"]``)."""
    failed = [o for o in outcomes if o.state == FAILED]
    if not failed:
        return
    first = failed[0]
    if len(failed) == len(outcomes):
        raise first.error
    names = ", ".join(str(o.bucket) for o in failed)
    raise type(first.error)(
        f"{table_path}: bucket{'s' if len(failed) > 1 else ''} {names} not committed "
        f"({len(outcomes) - len(failed)} of {len(outcomes)} done; first error: {first.error.message})",
        buckets=[o.bucket for o in failed])


class _Trigger:
    def __init__(self, table, wait: bool, on_outcome: OnOutcome | None, poll_s: float) -> None:
        self.table = table
        self.wait = wait
        self.on_outcome = on_outcome
        self.poll_s = poll_s
        self.total = table.table.buckets
        self.outcomes: dict[int, BucketOutcome] = {}  # final
        self.last_error: dict[int, errors.KvLeaseError] = {}  # the pending buckets' retriable errors
        self._reported: dict[int, BucketOutcome] = {}
        self._lock = threading.Lock()

    def run(self) -> list[BucketOutcome]:
        poller = _Poller(self, self.poll_s) if self.on_outcome is not None and self.wait else None
        try:
            self.table.retry.call(self._round)
        except errors.RETRIABLE as exc:  # the budget is spent: what is pending fails with its last error
            for bucket in range(self.total):
                if bucket not in self.outcomes:
                    self._finish(BucketOutcome(bucket, FAILED, error=self.last_error.get(bucket, exc)))
        finally:
            if poller is not None:
                poller.stop()
        for outcome in sorted(self.outcomes.values()):
            self._report(outcome)
        return [self.outcomes[b] for b in sorted(self.outcomes)]

    def _round(self) -> None:
        """One request per leader for its pending buckets; raises a retriable error if some are to be
        tried again."""
        router = self.table.physical
        routing = router.routing()
        groups: dict[str, list[int]] = {}
        for bucket in range(self.total):
            if bucket in self.outcomes:
                continue
            try:
                groups.setdefault(router.leader(routing, bucket), []).append(bucket)
            except errors.LeaderNotAvailableError as exc:
                self.last_error[bucket] = exc
        self.table.map_parallel(lambda group: self._leader(routing, *group), list(groups.items()))
        retry = [self.last_error[b] for b in range(self.total) if b not in self.outcomes]
        if retry:
            raise retry[0]

    def _leader(self, routing, address: str, buckets: list[int]) -> None:
        request = pb.TriggerSnapshotRequest(table_id=self.table.table.table_id, buckets=buckets, wait=self.wait,
                                            partition_id=self.table.table.partition_id, bucket_errors=True)
        try:
            response = self.table.send(routing, address, "TriggerSnapshot", request, idempotent=True,
                                       timeout_s=self.table.snapshot_timeout_s)
        except errors.KvLeaseError as exc:
            for bucket in buckets:
                self._failed(bucket, exc)
            return
        answered: dict[int, BucketOutcome] = {}
        for state, snapshots in ((COMMITTED, response.snapshots), (UNCHANGED, response.unchanged)):
            for s in snapshots:
                answered[s.bucket.bucket] = BucketOutcome(s.bucket.bucket, state,
                                                          CommittedSnapshot(s.bucket.bucket, s.snapshot_id,
                                                                            s.log_offset))
        failures = {f.bucket: error_from_pb(f.error) for f in response.failed}
        if any(isinstance(e, REROUTE) for e in failures.values()):
            self.table.physical.stale(routing)
        for bucket in buckets:
            if bucket in failures:
                self._failed(bucket, failures[bucket])
            else:
                self._finish(answered.get(bucket, BucketOutcome(bucket, COMMITTED if not self.wait else EMPTY)))

    def _failed(self, bucket: int, error: errors.KvLeaseError) -> None:
        if isinstance(error, errors.RETRIABLE):
            self.last_error[bucket] = error  # tried again in the next round
        else:
            self._finish(BucketOutcome(bucket, FAILED, error=error))

    def _finish(self, outcome: BucketOutcome) -> None:
        with self._lock:
            self.outcomes[outcome.bucket] = outcome

    def _report(self, outcome: BucketOutcome) -> None:
        """``on_outcome``, once per bucket and outcome (the poller may have reported it already)."""
        with self._lock:
            if self.on_outcome is None or self._reported.get(outcome.bucket) == outcome:
                return
            self._reported[outcome.bucket] = outcome
            done = sum(o.state != FAILED for o in self._reported.values())
            self.on_outcome(outcome, done, self.total)


class _Poller:
    """Reports a bucket committed as soon as the coordinator's latest snapshot of it is newer than the
    one it had when the trigger began; a failed poll is skipped (progress only)."""

    def __init__(self, trigger: _Trigger, interval_s: float) -> None:
        self.trigger = trigger
        self.interval_s = interval_s
        self.admin = trigger.table.admin
        self.table_id = trigger.table.table.table_id
        self._stopped = threading.Event()
        try:
            self.before = self._latest()
        except errors.KvLeaseError:
            self.before = None  # no progress before the answers
            return
        self._thread = threading.Thread(target=self._run, name="snapshot-trigger-progress", daemon=True)
        self._thread.start()

    def _latest(self) -> dict[int, CommittedSnapshot]:
        return {tb.bucket: CommittedSnapshot(tb.bucket, info.snapshot_id, info.log_offset)
                for tb, info in self.admin.get_latest_kv_snapshots(self.table_id).items()}

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                latest = self._latest()
            except errors.KvLeaseError:
                continue
            for bucket, snapshot in sorted(latest.items()):
                before = self.before.get(bucket)
                if (before is None or snapshot.snapshot_id > before.snapshot_id) and not self._stopped.is_set():
                    self.trigger._report(BucketOutcome(bucket, COMMITTED, snapshot))

    def stop(self) -> None:
        self._stopped.set()
        if self.before is not None:
            self._thread.join()
