"""A token bucket bounding the bytes per second of a tablet server's replica rebuild downloads.

``replica.rebuild.max-bytes-per-s`` (0: unlimited) is shared by every
download of the server (:class:`Throttle` is one object, thread-safe). A
download takes the bytes of a file before fetching it (:meth:`Throttle.take`):
the bucket holds at most one second's worth; a file bigger than that waits for
a full bucket and leaves it in debt, which later takes wait for, so over any
span longer than a file the rate stays at or under the limit. The wait ends
early when ``stop`` is set (a stopping server does not wait for its bandwidth).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

POLL_S = 0.1  # a waiting take looks again this often (a stop, a new rate)


class Throttle:
    def __init__(self, bytes_per_s: int, stop: threading.Event, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if bytes_per_s < 0:
            raise ValueError(f"bytes per second must be >= 0, got {bytes_per_s}")
        self.rate = bytes_per_s
        self._stop = stop
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(bytes_per_s)  # full: one second's worth
        self._at = clock()

    def delay(self, n: int) -> float:
        """Take ``n`` bytes if the bucket has them (a take bigger than the bucket needs it full, and leaves
        it in debt): 0.0; else nothing is taken and the seconds until it may have them."""
        with self._lock:
            rate = self.rate
            if rate == 0:
                return 0.0
            now = self._clock()
            self._tokens = min(float(rate), self._tokens + (now - self._at) * rate)
            self._at = now
            need = min(n, rate)
            if self._tokens >= need:
                self._tokens -= n
                return 0.0
            return (need - self._tokens) / rate

    def take(self, n: int) -> bool:
        """Take ``n`` bytes, waiting as long as the limit asks (a change of :attr:`rate` is seen within
        :data:`POLL_S`); False if ``stop`` was set meanwhile."""
        while (wait := self.delay(n)) > 0:
            if self._stop.wait(min(wait, POLL_S)):
                return False
        return not self._stop.is_set()
