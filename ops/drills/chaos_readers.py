"""The chaos drill's readers: threads looking up random keys of its row table while the faults go on.

Each of :data:`READERS` threads looks up :data:`KEYS_PER_LOOKUP` random keys
at a time, a mean :data:`THINK_S` apart, through a table client of its own
(the writers' settings): its routing is its own, so it may still name a
leader the writers have moved away from (a paused one), as another process's
client would; only its calls' own answers, and the re-routing of a call to a
paused leader (``client/leader_watch.py``), bring it up to date. Every key of every lookup is kept as a
:class:`~kvlease.ops.drills.read_checks.ReadOp`: the lookup's send and answer times
(``time.time()``, the clock of the writers' records), and the value read or
the typed error's name when the lookup failed. :mod:`kvlease.ops.drills.read_checks`
judges them against the writes.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Sequence

from kvlease.client.table import TableClient
from kvlease.ops.drills.crew import Crew
from kvlease.ops.drills.read_checks import ReadOp
from kvlease.ops.drills.workload import error_name

READERS = 3
KEYS_PER_LOOKUP = 4
THINK_S = 0.02


class Readers:
    """Threads looking up random ``keys`` of ``table``, each through a client of its own on ``admin``, until
    :meth:`stop` (which closes the clients); every key read kept."""

    def __init__(self, admin, table: str, keys: Sequence[int], seed: int, threads: int = READERS,
                 retry_total_s: float = 60.0, request_timeout_s: float = 5.0) -> None:
        self.keys = list(keys)
        self.reads: list[ReadOp] = []
        self.calls = 0
        self.failures: Counter = Counter()
        self._lock = threading.Lock()
        self.clients: list[TableClient] = []
        try:
            for _ in range(threads):
                self.clients.append(TableClient(admin, table, retry_total_s=retry_total_s,
                                                request_timeout_s=request_timeout_s))
        except BaseException:
            self.close()
            raise
        self._crew = Crew("drill-reader", self._run,
                          [(client, random.Random(seed * 100 + 50 + i)) for i, client in enumerate(self.clients)])
        self._stop = self._crew.stop_event

    def start(self) -> None:
        self._crew.start()

    def stop(self) -> None:
        self._crew.stop(90)
        self.close()

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def _run(self, client: TableClient, rng: random.Random) -> None:
        while not self._stop.wait(rng.uniform(0, 2 * THINK_S)):
            self.look(client, rng.sample(self.keys, KEYS_PER_LOOKUP))

    def look(self, client: TableClient, keys: list[int]) -> None:
        """One lookup of ``keys`` through ``client`` and its record."""
        t0 = time.time()
        try:
            rows = client.lookup(keys)
            error = ""
        except Exception as exc:  # recorded: a failed lookup shows nothing, so nothing stale
            rows, error = [None] * len(keys), error_name(exc)
        t1 = time.time()
        with self._lock:
            self.calls += 1
            if error:
                self.failures[error] += 1
            self.reads += [ReadOp(k, None if row is None else row["v"], t0, t1, error) for k, row in zip(keys, rows)]
