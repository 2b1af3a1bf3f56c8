"""Long polls of log readers: one at the committed end of a bucket's log waits for news, not for a poll.

Clients' ``FetchLog`` (below) and followers' ``ReplicaFetch`` (``tablet/replication/fetch_service.py``,
without a bound on the calls waiting: one per follower) wait the same way, each with a :class:`LogWaits` of
its own.

A ``FetchLog`` request with ``max_wait_ms`` > 0 that finds no entry (the
reader is at the high watermark) waits up to that long (at most
:data:`MAX_WAIT_MS`, and ending before the call's own deadline) and asks
again each time :meth:`LogWaits.notify` says the committed end of some log
here may have moved: a write published to a bucket of one replica, a high
watermark advance of a replicated one (``Leadership.on_commit``), a
row-TTL expiry round's deletes. The answer is then what a plain ``FetchLog``
asked at that moment answers (the same fetch, the same checks): waiting
never changes what a reader sees, only when it is told. Once
:meth:`LogWaits.close` was called (the server stops) every call answers at
once.

One condition for the whole server: a notify wakes every waiting reader, each
of which fetches again (a read of its bucket's committed end, nothing when
nothing is new) and waits again. A waiting call holds one of the server's RPC
threads (``tablet.rpc.threads``), so at most ``max_waiting`` calls wait at once
(the server gives half its RPC threads): one more answers at once, as a plain
FetchLog, and writes always find a thread. Readers keep waits short
(``kvlease log --follow`` waits its poll interval, and sleeps after an answer
that came far sooner).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

#: The longest a FetchLog call waits for news, whatever it asks.
MAX_WAIT_MS = 30_000
#: What a wait leaves of the call's own deadline to answer in.
DEADLINE_MARGIN_S = 0.2

T = TypeVar("T")


def wait_seconds(max_wait_ms: int, time_remaining_s: float | None) -> float:
    """How long a call asking ``max_wait_ms`` may wait: capped at :data:`MAX_WAIT_MS` and ending
    :data:`DEADLINE_MARGIN_S` before its deadline (``time_remaining_s``; None: none)."""
    wait_s = min(max(max_wait_ms, 0), MAX_WAIT_MS) / 1000.0
    if time_remaining_s is not None:
        wait_s = min(wait_s, max(0.0, time_remaining_s - DEADLINE_MARGIN_S))
    return wait_s


class LogWaits:
    def __init__(self, max_waiting: int | None = 16) -> None:
        """``max_waiting``: the most calls that may wait at once (None: no bound; the leader's answers to its
        followers' ``ReplicaFetch`` long polls, ``tablet/replication/fetch_service.py``, wait the same way)."""
        self._news = threading.Condition()
        self._version = 0
        self._closed = False
        self.max_waiting = max_waiting
        self.waiting = 0  # calls in poll() that may wait

    def notify(self) -> None:
        """The committed end of a log here may have moved: waiting readers fetch again."""
        with self._news:
            self._version += 1
            self._news.notify_all()

    def close(self) -> None:
        """The server stops: waiting calls answer what they have now, later ones do not wait."""
        with self._news:
            self._closed = True
            self._news.notify_all()

    def poll(self, fetch: Callable[[], T], ready: Callable[[T], bool], wait_s: float) -> T:
        """``fetch()`` until ``ready`` of its answer, for up to ``wait_s``; the last answer. Each fetch after
        the first follows a :meth:`notify` (the version is read before fetching, so news that comes while
        it fetches is not missed). An exception of ``fetch`` is raised at once. With ``max_waiting`` calls
        waiting already, the first answer is returned whatever it is."""
        with self._news:
            may_wait = wait_s > 0 and (self.max_waiting is None or self.waiting < self.max_waiting)
            self.waiting += may_wait
        try:
            return self._poll(fetch, ready, wait_s if may_wait else 0.0)
        finally:
            if may_wait:
                with self._news:
                    self.waiting -= 1

    def _poll(self, fetch: Callable[[], T], ready: Callable[[T], bool], wait_s: float) -> T:
        deadline = time.monotonic() + wait_s
        while True:
            with self._news:
                version = self._version
            answer = fetch()
            remaining = deadline - time.monotonic()
            if ready(answer) or remaining <= 0 or self._closed:
                return answer
            with self._news:
                if self._version == version and not self._closed:
                    self._news.wait(remaining)
