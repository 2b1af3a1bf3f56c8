"""The shell of the lease state machine: it hands events in and carries out what comes out.

Runs on the event loop's thread. Lease events are gathered over a batch: the
writes they ask for (:class:`~leases.state.PersistLease`) wait for the end of
it, which writes their metadata files, sends their ZooKeeper operations
together (epoch-fenced multi-ops, each write succeeding or failing alone), and
only then feeds the outcomes back (``WriteDone`` / ``WriteFailed``): persist,
then apply. Callers are answered by the :class:`~leases.state.Reply` their
event causes.

Overlap (:meth:`LeaseShell.advance`): when more requests are queued, a batch
returns with its multi-ops in flight; the next batch writes its files
meanwhile and only then applies them. One write per lease stays in flight (the
state machine defers an event for a busy lease; the next batch applies the
write and the event is handed in again). :meth:`LeaseShell.flush` (barriers,
:meth:`LeaseShell.call`) leaves nothing in flight.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from common import errors
from common.model import Lease, TableBucket
from common.statemachine import Event, Shell, on
from coordinator.fencing import MAX_OPS_PER_MULTI, FencedWriter
from coordinator.loop import Item, settle
from leases import state as ls
from leases.store import LeaseStore, PreparedWrite

log = logging.getLogger(__name__)

MAX_BYTES_PER_MULTI = 256 * 1024  # well under ZooKeeper's default request limit (jute.maxbuffer, 1 MiB)
DELETE_RETRY_MS = 1_000  # lease files whose delete failed are tried again at most this often


@dataclass
class _Waiter:
    answer: Callable[[ls.Reply], None]
    requeue: Item | None  # handed back to the loop if the event is deferred (None: it must not be)


class LeaseShell(Shell):
    def __init__(self, state: ls.LeaseState, store: LeaseStore, *, clock_ms: Callable[[], int],
                 on_freed: Callable[[set[TableBucket]], None], metrics=None) -> None:
        self.state = state
        self.store = store
        self.clock_ms = clock_ms
        self.on_freed = on_freed  # reclaim: these buckets' snapshots may have lost their last lease
        self.metrics = metrics
        self.writer: FencedWriter | None = None
        self.deferred: list[Item] = []  # to hand in again with the next batch
        self._waiting: dict[int, _Waiter] = {}  # event id -> who waits for its reply
        self._batch: list[ls.PersistLease] = []
        self._freed: list[tuple[TableBucket, int]] = []
        self._next_delete_retry_ms = 0
        self._sent: list[tuple[list[PreparedWrite], object]] = []  # multi-ops in flight, in order sent

    def restore(self, loaded: Iterable[Lease], now_ms: int, grace_ms: int) -> ls.RestoreOutcome:
        """Failover: a new state machine holding the persisted leases.

        Expired ones get the grace once, or are dropped if they had it: those
        writes are persisted (and applied) before this returns. Raises what a
        failed write raises: the coordinator must not serve then.
        """
        self.state = ls.LeaseState(self.state.catalog, self.state.max_duration_ms)
        outcome = self.call(ls.Restore(tuple(loaded), now_ms, grace_ms))
        self.state.validate()
        return outcome

    # -- handing events in ------------------------------------------------------------

    def submit(self, request: Event, future: Future | None) -> None:
        """A lease request of the loop; ``future`` is answered once its writes are persisted."""
        self._hand_in(request, _Waiter(lambda reply: settle(future, reply.result, reply.error), (request, future)))

    def call(self, event: Event) -> object:
        """At a barrier (no write in flight): hand ``event`` in, persist what it asks, return its result.

        Raises the error its reply carries.
        """
        replies: list[ls.Reply] = []
        self._hand_in(event, _Waiter(replies.append, None))
        self.flush()
        (reply,) = replies
        if reply.error is not None:
            raise reply.error
        return reply.result

    def _hand_in(self, request: Event, waiter: _Waiter) -> None:
        event = self._stamped(request)
        if event.event_id in self._waiting:
            raise errors.InvalidRequestError(f"event {event.event_id} is already being handled")
        log.debug("lease event %s", event)
        self._waiting[event.event_id] = waiter
        self.execute(self.state.handle(event))

    def _stamped(self, event: Event) -> Event:
        """The event with this shell's clock as ``now_ms``, if its sender left that to the shell."""
        if getattr(event, "now_ms", 0) is None:
            return replace(event, now_ms=self.clock_ms())
        return event

    def fail_all(self, error: Exception) -> None:
        """The coordinator steps down: answer every request still waiting."""
        for event_id, waiter in self._waiting.items():
            waiter.answer(ls.Reply(event_id, error=error))
        for request, future in self.deferred:
            settle(future, error=error)
        self._waiting.clear()
        self.deferred = []
        self._batch = []
        self._sent = []  # in flight: their files stay (ZooKeeper may point at them; orphan cleanup)

    # -- carrying out instructions ---------------------------------------------------

    @on(ls.Reply)
    def _reply(self, ins: ls.Reply) -> None:
        self._waiting.pop(ins.event_id).answer(ins)

    @on(ls.PersistLease)
    def _persist(self, ins: ls.PersistLease) -> None:
        self._batch.append(ins)  # written by the next flush

    @on(ls.Deferred)
    def _defer(self, ins: ls.Deferred) -> None:
        waiter = self._waiting.pop(ins.event.event_id)
        if waiter.requeue is None:
            raise RuntimeError(f"{ins.event} was deferred at a barrier, where no write is in flight")
        self.deferred.append(waiter.requeue)

    @on(ls.SnapshotsFreed)
    def _freed_snapshots(self, ins: ls.SnapshotsFreed) -> None:
        self._freed.extend(ins.snapshots)  # reclaimed after the flush

    @on(ls.LeasesExpired)
    def _expired(self, ins: ls.LeasesExpired) -> None:
        log.info("leases expired: %s", ", ".join(ins.lease_ids))
        if self.metrics:
            self.metrics.leases_expired.inc(len(ins.lease_ids))

    # -- persisting ------------------------------------------------------------------

    def flush(self) -> None:
        """Persist every gathered lease write and every one in flight, then apply the results; then
        reclaim what they freed.

        Also (at most every DELETE_RETRY_MS) delete again the lease files whose delete failed.
        """
        self._write_batch(overlap=False)

    def advance(self, more_waiting: bool) -> None:
        """End of a loop batch: like :meth:`flush`, but if ``more_waiting`` (requests are queued
        for the next batch) return with this batch's multi-ops in flight: the next batch's files
        are written meanwhile, and its :meth:`advance` applies them."""
        self._write_batch(overlap=more_waiting)

    def _write_batch(self, overlap: bool) -> None:
        """Files of the gathered writes (while the multi-ops sent before are in flight), then the
        multi-ops sent before applied, then these writes' multi-ops sent (and applied, unless
        ``overlap``). Raises Fenced / OutcomeUnknownError after failing every write it held."""
        self._apply_sent(only_answered=True)  # answers already in: reply before writing files
        batch, self._batch = self._batch, []
        prepared: list[PreparedWrite] = []
        for write, result in zip(batch, self.store.prepare(batch) if batch else []):
            if isinstance(result, errors.StorageError):
                self.execute(self.state.handle(ls.WriteFailed(write.write_id, result)))
            else:
                prepared.append(result)
        try:
            self._apply_sent()
        except _STEP_DOWN as exc:
            for p in prepared:
                self.store.failed(p)  # never sent: nothing points at them
            for p in prepared:
                self.execute(self.state.handle(ls.WriteFailed(p.write.write_id, exc)))
            raise
        for chunk in _chunks(prepared):
            self._sent.append((chunk, self.writer.send([p.op for p in chunk])))
        if not overlap:
            self._apply_sent()
        if self._freed:
            freed, self._freed = self._freed, []
            self.on_freed({tb for tb, _sid in freed})
        if self.store.undeleted and self.clock_ms() >= self._next_delete_retry_ms:
            self._next_delete_retry_ms = self.clock_ms() + DELETE_RETRY_MS
            self.store.retry_deletes()  # remote storage was down: no orphans wait for the next failover

    def _apply_sent(self, only_answered: bool = False) -> None:
        """Apply the multi-ops in flight, in the order sent (``only_answered``: those answered
        already). After a fatal one, the others are applied too (each as its outcome says) before
        its error is raised."""
        while self._sent:
            chunk, pending = self._sent[0]
            if only_answered and not _answered(pending):
                return
            del self._sent[0]
            try:
                self._committed(chunk, pending)
            except _STEP_DOWN:
                rest, self._sent = self._sent, []
                for chunk, pending in rest:
                    try:
                        self._committed(chunk, pending)
                    except _STEP_DOWN:
                        pass
                raise

    def _committed(self, chunk: list[PreparedWrite], pending) -> None:
        """Apply a multi-op's outcome to its writes. A chunk ZooKeeper rejects (one bad op rolls
        back all of it) is sent again one write per multi-op, so each write succeeds or fails on
        its own. Raises Fenced / OutcomeUnknownError after failing the chunk's writes."""
        try:
            outcome = self.writer.outcome([p.op for p in chunk], pending)
            if outcome is None:
                outcomes: list[Exception | None] = [None] * len(chunk)
            elif len(chunk) == 1:
                outcomes = [outcome]
            else:
                outcomes = self.writer.commit_many([[p.op] for p in chunk])
        except errors.CoordinatorFencedError as exc:
            for p in chunk:
                self.store.failed(p)  # the epoch check failed: nothing points at them
            for p in chunk:
                self.execute(self.state.handle(ls.WriteFailed(p.write.write_id, exc)))
            raise
        except errors.OutcomeUnknownError as exc:  # keep the files: ZooKeeper may point at them
            for p in chunk:
                self.execute(self.state.handle(ls.WriteFailed(p.write.write_id, exc)))
            raise
        for p, outcome in zip(chunk, outcomes):
            if outcome is None:
                self.store.committed(p)
                self.execute(self.state.handle(ls.WriteDone(p.write.write_id)))
            else:
                self.store.failed(p)
                self.execute(self.state.handle(ls.WriteFailed(p.write.write_id, outcome)))


_STEP_DOWN = (errors.CoordinatorFencedError, errors.OutcomeUnknownError)


def _answered(pending) -> bool:
    """Whether what FencedWriter.send gave is in (an error it did not send, or ZooKeeper's answer)."""
    return isinstance(pending, Exception) or pending.ready()


def _chunks(writes: list[PreparedWrite], max_bytes: int = MAX_BYTES_PER_MULTI) -> list[list[PreparedWrite]]:
    """``writes`` in order, cut into multi-ops of at most MAX_OPS_PER_MULTI ops and about ``max_bytes``.

    Several writes share one fenced multi-op: one request, one epoch check and
    one ZooKeeper transaction instead of one per write, which more than halves
    the ZooKeeper client's and server's work per lease write.
    """
    chunks: list[list[PreparedWrite]] = []
    size = 0
    for write in writes:
        cost = len(write.op.path) + len(write.op.data) + 64
        if not chunks or len(chunks[-1]) >= MAX_OPS_PER_MULTI or size + cost > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(write)
        size += cost
    return chunks
