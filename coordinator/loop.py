"""The coordinator's single-threaded event loop.

gRPC handlers only enqueue a request and wait on its future; the loop thread
takes everything queued (up to ``max_batch``) and hands it to the controller
in one batch, so many lease writes share one ZooKeeper round trip. The lease
expiry check is a timer event on the same thread.

The loop accounts its own thread's CPU time (``time.thread_time``) into
``kvlease_coordinator_loop_cpu_seconds_total`` after every batch and tick:
what an idle coordinator costs, and that it does not grow with the leases held.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable

from kvlease.common import errors
from kvlease.leases import state as ls

log = logging.getLogger(__name__)

#: A loop item: (request, future); the future is None for the loop's own timer events.
Item = tuple[object, "Future | None"]


def settle(future: Future | None, result: object = None, error: Exception | None = None) -> None:
    """Answer a caller's future, unless there is none or it was answered (or cancelled) already."""
    if future is None or future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class EventLoop:
    def __init__(self, controller, *, max_batch: int, tick_interval_ms: int,
                 on_fatal: Callable[[Exception], None], metrics=None,
                 monotonic: Callable[[], float] = time.monotonic,
                 thread_time: Callable[[], float] = time.thread_time) -> None:
        self.controller = controller
        self.max_batch = max_batch
        self.tick_s = tick_interval_ms / 1000.0
        self.on_fatal = on_fatal
        self.metrics = metrics
        self.monotonic = monotonic
        self.thread_time = thread_time
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="coordinator-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request) -> Future:
        future: Future = Future()
        with self._cv:
            if self._stopped:
                future.set_exception(errors.NotCoordinatorError("coordinator is stepping down"))
                return future
            self._queue.append((request, future))
            self._cv.notify()
        return future

    def stop(self, error: Exception | None = None) -> None:
        with self._cv:
            self._stopped = True
            queued = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        error = error or errors.NotCoordinatorError("coordinator is stepping down")
        for _request, future in queued:
            settle(future, error=error)
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(timeout=30)

    def depth(self) -> int:
        return len(self._queue)

    def _run(self) -> None:
        next_tick = self.monotonic() + self.tick_s
        deferred: list = []
        cpu_seen = self.thread_time()
        while True:
            if self.metrics:
                cpu_now = self.thread_time()
                self.metrics.loop_cpu.inc(cpu_now - cpu_seen)
                cpu_seen = cpu_now
            with self._cv:
                while not self._stopped and not self._queue and not deferred:
                    remaining = next_tick - self.monotonic()
                    if remaining <= 0:
                        break
                    self._cv.wait(remaining)
                if self._stopped:
                    break
                items = deferred
                while self._queue and len(items) < self.max_batch:
                    items.append(self._queue.popleft())
                if self.metrics:
                    self.metrics.queue_depth.set(len(self._queue))
            if self.monotonic() >= next_tick:
                items.append((ls.Expire(), None))  # now_ms: stamped by the lease shell
                next_tick = self.monotonic() + self.tick_s
            try:
                deferred = self.controller.process(items)
            except Exception as exc:  # fenced, connection lost, or a bug: step down
                if not isinstance(exc, errors.KvLeaseError):
                    log.exception("event loop failed")
                    exc = errors.NotCoordinatorError(f"coordinator failed: {exc}")
                for _request, future in items:
                    settle(future, error=exc)
                self.controller.fail_all(exc)
                self.stop(exc)
                self.on_fatal(exc)
                return
