"""A drill workload's threads: started together, stopped together through one stop event.

Each workload (writers, readers, lease clients) runs ``target(*args)`` in a
few daemon threads, each with its own seeded ``random.Random``; the target
loops until :attr:`Crew.stop_event` is set (``while not crew.stop_event.wait(pause)``).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence


class Crew:
    """Daemon threads ``{name}-{i}`` running ``target(*args[i])``."""

    def __init__(self, name: str, target: Callable[..., None], args: Sequence[tuple]) -> None:
        self.stop_event = threading.Event()
        self._threads = [threading.Thread(target=target, args=a, name=f"{name}-{i}", daemon=True)
                         for i, a in enumerate(args)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float) -> list[str]:
        """Set the stop event and wait up to ``timeout_s`` for each started thread; the names of those
        still running."""
        self.stop_event.set()
        for thread in self._threads:
            if thread.ident is not None:
                thread.join(timeout=timeout_s)
        return [t.name for t in self._threads if t.is_alive()]
