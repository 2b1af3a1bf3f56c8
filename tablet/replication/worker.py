"""Work queued per replica for one daemon thread of its own, started on first use.

The follower's applier (``tablet/replication/fetcher.py``) and rebuilder
(``tablet/replication/rebuild.py``) are such workers: the fetch thread queues
a replica (:meth:`ReplicaWorker._queue`, keyed by the replica: a newer item
for it merges with the one waiting) and goes on fetching; the worker's
thread takes what is due (:meth:`ReplicaWorker._take`) until the stop event
is set.
"""

from __future__ import annotations

import threading
from typing import Callable


class ReplicaWorker:
    name = "replica-worker"

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._due: dict[int, tuple[object, object]] = {}  # id(replica) -> (replica, item)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def stop(self) -> None:
        """End the thread (the stop event is set by the owner); work still queued is dropped: after a
        resume (:meth:`kvlease.tablet.replication.fetcher.Fetchers.resume`) the fetcher queues what is still due."""
        with self._cond:
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        with self._cond:
            self._dropped([replica for replica, _item in self._due.values()])
            self._due.clear()

    def _dropped(self, replicas: list) -> None:
        """Queued work of ``replicas`` was dropped at a stop. Hold the condition's lock."""

    def _queue(self, replica, item, merge: Callable[[object, object], object] = lambda old, new: new) -> bool:
        """Queue ``item`` for ``replica`` (merged with one waiting); False once stopping. Hold no lock."""
        with self._cond:
            if self._stop.is_set():
                return False
            if self._thread is None or not self._thread.is_alive():  # first use, or stopped and resumed
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            key = id(replica)
            self._due[key] = (replica, merge(self._due[key][1], item) if key in self._due else item)
            self._cond.notify()
            return True

    def _take(self, one: bool) -> list[tuple[object, object]] | None:
        """Wait for work: every ``(replica, item)`` due (or the oldest one only), None once stopping."""
        with self._cond:
            while not self._due and not self._stop.is_set():
                self._cond.wait(0.5)
            if self._stop.is_set():
                return None
            if one:
                key = next(iter(self._due))
                return [self._due.pop(key)]
            work, self._due = list(self._due.values()), {}
            return work

    def _run(self) -> None:
        raise NotImplementedError
