"""A token bucket bounding the bytes per second of a tablet server's replica rebuild downloads.

``replica.rebuild.max-bytes-per-s`` (0: unlimited) is shared by every
download of the server (:class:`Throttle` is one object, thread-safe). A
download takes the bytes of a file before fetching it (:meth:`Throttle.take`):
the bucket holds at most one second's worth, and a take that leaves it in
debt waits until the debt is paid back, so over any span longer than a file
the rate stays at or under the limit. The wait ends early when ``stop`` is
set (a stopping server does not wait for its bandwidth).
"""

from __future__ import annotations

import threading
import time
from typing import Callable


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
        """Take ``n`` bytes; returns how long the caller must wait before using them (0: at once)."""
        if self.rate == 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate) - n
            self._at = now
            return max(0.0, -self._tokens / self.rate)

    def take(self, n: int) -> bool:
        """Take ``n`` bytes, waiting as long as the limit asks; False if ``stop`` was set meanwhile."""
        wait = self.delay(n)
        if wait > 0:
            return not self._stop.wait(wait)
        return not self._stop.is_set()
