"""Concurrent calls of one kind, sent together: the group commit of a client shared by threads.

A :class:`Coalescer` adds no wait: a call made while fewer than
``max_in_flight`` (2) of its kind are in flight is sent at once, alone.
Calls made while that many are in flight queue up, and when one returns, the
first queued call sends every queued call (at most ``max_batch``) as one
batch; the others wait for their own answer. Under load the batches grow
with the load, so a server's and a client's cost per call (for gRPC in
Python ~0.3 ms each side, whatever the message) is paid once per batch.

Each call's outcome is its own: ``send_many`` answers each request of a batch
with its response or its exception. An exception ``send_many`` raises (the
batch as a whole failed, after its own retries) is every call's outcome.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Generic, Sequence, TypeVar

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class BatchInterrupted(RuntimeError):
    """The outcome of a call whose batch was being sent by a thread that was stopped meanwhile."""


class _Call:
    __slots__ = ("request", "outcome", "batch", "event")

    def __init__(self, request: Any) -> None:
        self.request = request
        self.outcome: Any = None  # the response, or the exception to raise
        self.batch: list[_Call] | None = None  # set on the call handed a batch to send (itself first)
        self.event = threading.Event()


class Coalescer(Generic[Req, Resp]):
    """``call(request)`` sends ``request`` alone (``send_one``) or with the calls queued meanwhile
    (``send_many``: a list of requests -> a list of, per request, its response or its exception).

    At most ``max_in_flight`` batches are in flight at once (a second caller is
    not kept waiting for the first's answer), each of at most ``max_batch`` calls.
    """

    def __init__(self, send_one: Callable[[Req], Resp],
                 send_many: Callable[[list[Req]], Sequence[Resp | BaseException]], max_batch: int = 64,
                 max_in_flight: int = 2) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._send_one = send_one
        self._send_many = send_many
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()
        #: calls waiting for a batch; only ever non-empty while max_in_flight batches are in flight
        self._queue: list[_Call] = []
        self._in_flight = 0

    def waiting(self) -> int:
        """Calls queued behind the batches in flight."""
        with self._lock:
            return len(self._queue)

    def call(self, request: Req) -> Resp:
        me = _Call(request)
        with self._lock:
            if self._in_flight < self.max_in_flight:
                self._in_flight += 1
                me.batch = [me]
            else:
                self._queue.append(me)
        interrupted: BaseException | None = None
        if me.batch is None:
            try:
                me.event.wait()  # answered, or handed a batch to send
            except BaseException as exc:  # e.g. KeyboardInterrupt in the main thread
                with self._lock:
                    if me in self._queue:  # not taken yet: leave
                        self._queue.remove(me)
                        raise
                interrupted = exc  # taken: send what was handed (the others wait for it), then leave
        batch = me.batch
        if batch is not None:
            try:
                self._send(batch)
            finally:
                try:
                    with self._lock:
                        if self._queue:  # the batch's slot goes to the calls waiting: the first sends them
                            successor, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
                            successor[0].batch = successor
                            successor[0].event.set()
                        else:
                            self._in_flight -= 1
                finally:  # (even if this thread is interrupted meanwhile)
                    for other in batch[1:]:
                        other.event.set()
        if interrupted is not None:
            raise interrupted
        if isinstance(me.outcome, BaseException):
            raise me.outcome
        return me.outcome

    def _send(self, batch: list[_Call]) -> None:
        try:
            if len(batch) == 1:
                outcomes: Sequence[Any] = [self._send_one(batch[0].request)]
            else:
                outcomes = self._send_many([c.request for c in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"{len(outcomes)} outcomes for a batch of {len(batch)}")
        except Exception as exc:  # the batch failed as a whole: every call's outcome
            outcomes = [exc] * len(batch)
        except BaseException as exc:  # the sending thread itself is stopped (KeyboardInterrupt, SystemExit)
            for c in batch[1:]:
                c.outcome = BatchInterrupted(f"the thread sending this call with {len(batch) - 1} other(s) "
                                             f"was stopped ({type(exc).__name__}): its outcome is unknown")
            raise
        for c, outcome in zip(batch, outcomes):
            c.outcome = outcome
