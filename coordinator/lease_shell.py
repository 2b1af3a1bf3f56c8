"""The shell of the lease state machine: it hands events in and carries out what comes out.

Runs on the event loop's thread. Lease events are gathered over a batch: the
writes they ask for (:class:`~kvlease.leases.state.PersistLease`) wait for
:meth:`LeaseShell.flush`, which writes their metadata files (one per table the
batch changes, shared by its writes), sends their ZooKeeper operations
together (epoch-fenced multi-ops, each write succeeding or failing alone), and
only then feeds the outcomes back (``WriteDone`` / ``WriteFailed``): persist,
then apply. Callers are answered
by the :class:`~kvlease.leases.state.Reply` their event causes.

Lease files whose delete failed (remote storage down) are deleted again on a
worker thread, one attempt in flight at a time: a slow or unreachable remote
storage never stalls the loop.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from kvlease.common import errors
from kvlease.common.model import Lease, TableBucket
from kvlease.common.statemachine import Event, Shell, on
from kvlease.common.zk import ZkOp
from kvlease.coordinator.fencing import FencedWriter, chunks
from kvlease.coordinator.loop import Item, settle
from kvlease.leases import state as ls
from kvlease.leases.refcount import RefcountIndex
from kvlease.leases.store import LeaseStore, PreparedWrite

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
        self._delete_retry: Future | None = None  # store.retry_deletes on the worker: the paths it deleted
        self._deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-delete-retry")

    def close(self) -> None:
        """Stop the delete-retry worker (an attempt under way finishes on its own)."""
        self._deleter.shutdown(wait=False, cancel_futures=True)

    def restore(self, loaded: Iterable[Lease], now_ms: int, grace_ms: int,
                refs: RefcountIndex | None = None) -> ls.RestoreOutcome:
        """Failover: a new state machine holding the persisted leases.

        Expired ones get the grace once, or are dropped if they had it: those
        writes are persisted (and applied) before this returns. Raises what a
        failed write raises: the coordinator must not serve then.
        """
        self.state = ls.LeaseState(self.state.catalog, self.state.max_duration_ms)
        # no validate() here: it re-derives every index from the leases (over a second at 100,000,
        # inside the failover's budget); the tests call it after restoring
        return self.call(ls.Restore(tuple(loaded), now_ms, grace_ms, refs))

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
        """Persist every gathered lease write, then apply the results; then reclaim what they freed.

        Also (at most every DELETE_RETRY_MS) delete again the lease files whose delete failed.
        """
        batch, self._batch = self._batch, []
        if batch:
            prepared: list[PreparedWrite] = []
            for write, result in zip(batch, self.store.prepare(batch)):
                if isinstance(result, errors.StorageError):
                    self.execute(self.state.handle(ls.WriteFailed(write.write_id, result)))
                else:
                    prepared.append(result)
            try:
                outcomes = self._commit_lease_ops([p.op for p in prepared])
            except errors.CoordinatorFencedError as exc:
                self.store.settle()  # the epoch check failed: nothing points at the batch's files
                for p in prepared:
                    self.execute(self.state.handle(ls.WriteFailed(p.write.write_id, exc)))
                raise
            except errors.OutcomeUnknownError as exc:  # keep the files: ZooKeeper may point at them
                self.store.settle(keep_fresh=True)
                for p in prepared:
                    self.execute(self.state.handle(ls.WriteFailed(p.write.write_id, exc)))
                raise
            except BaseException:
                self.store.settle(keep_fresh=True)  # not known what ZooKeeper did: as above
                raise
            for p, outcome in zip(prepared, outcomes):
                if outcome is None:
                    self.store.committed(p)
            self.store.settle()  # before the replies: a file no write took is gone when they arrive
            for p, outcome in zip(prepared, outcomes):
                if outcome is None:
                    self.execute(self.state.handle(ls.WriteDone(p.write.write_id)))
                else:
                    self.execute(self.state.handle(ls.WriteFailed(p.write.write_id, outcome)))
        if self._freed:
            freed, self._freed = self._freed, []
            self.on_freed({tb for tb, _sid in freed})
        self._retry_deletes()

    def _retry_deletes(self) -> None:
        """Take in the last delete retry's outcome; start the next (at most every DELETE_RETRY_MS).

        Remote storage was down: the files no lease points at are deleted now, not left as orphans
        for the next failover. The worker gets a copy of the paths and returns those it deleted;
        ``store.undeleted`` is only changed here, on the loop's thread.
        """
        retry = self._delete_retry
        if retry is not None:
            if not retry.done():
                return
            self._delete_retry = None
            if retry.exception() is not None:  # not a storage error (those stop the attempt): a bug
                log.error("retrying lease file deletes failed", exc_info=retry.exception())
            deleted = [] if retry.exception() is not None else retry.result()
            self.store.undeleted.difference_update(deleted)
            if deleted and not self.store.undeleted:
                log.info("lease files left by failed deletes are deleted now")
        if self.store.undeleted and self.clock_ms() >= self._next_delete_retry_ms:
            self._next_delete_retry_ms = self.clock_ms() + DELETE_RETRY_MS
            self._delete_retry = self._deleter.submit(self.store.retry_deletes, sorted(self.store.undeleted))

    def settle_deletes(self, timeout_s: float) -> None:
        """Wait for the delete retry under way and take in its outcome (tests, shutdown)."""
        if self._delete_retry is not None:
            self._delete_retry.result(timeout=timeout_s)
            self._retry_deletes()

    def _commit_lease_ops(self, ops: list[ZkOp]) -> list[Exception | None]:
        """Commit lease writes (one op each, distinct leases); None per success.

        Several writes share one fenced multi-op (chunks pipelined): one request,
        one epoch check and one ZooKeeper transaction instead of one per write,
        which more than halves the ZooKeeper client's and server's work per
        lease write. A chunk ZooKeeper rejects (one bad op rolls back all of it)
        is sent again one write per multi-op, so each write still succeeds or
        fails on its own. Raises what :meth:`FencedWriter.commit_many` raises.
        """
        batches = chunks(ops, MAX_BYTES_PER_MULTI)
        outcomes: list[Exception | None] = []
        for chunk, outcome in zip(batches, self.writer.commit_many(batches)):
            if outcome is None:
                outcomes.extend([None] * len(chunk))
            elif len(chunk) == 1:
                outcomes.append(outcome)
            else:
                outcomes.extend(self.writer.commit_many([[op] for op in chunk]))
        return outcomes
