"""A tablet server's background rounds: :meth:`Periodic.run_once` every ``interval_s`` on a daemon thread,
or at once after :meth:`Periodic.wake`.

The bucket keeper (``tablet/replicas/keeper.py``) and the ISR keeper
(``tablet/replication/isr_changes.py``) are such rounds: a round that raises
is logged and the next one runs on time.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Periodic:
    """Subclasses define :meth:`run_once`; :meth:`start` and :meth:`stop` run and end the rounds."""

    name = "periodic"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self):
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        """Run the next round now (a round running already is followed by one more)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def run_once(self) -> int:
        raise NotImplementedError

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:  # keep going: the next round runs on time
                log.exception("%s round failed", self.name)
