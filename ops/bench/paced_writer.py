"""A writer loading a table's leader at a steady rate while a benchmark measures something else.

``with paced_writer(admin, table, ids, rows_per_s) as writer:`` upserts rows of
:func:`kvlease.ops.bench.writes.make_batch` (ids ``0 .. ids-1`` in turn: the
table's size does not change, each write is an update with a changelog
record pair) in batches of at most :data:`BATCH_ROWS`, spaced so that the
rows per second stay at ``rows_per_s`` (a batch that takes longer delays the
next; none is skipped). The block's end stops it; ``writer.rows`` and
``writer.seconds`` say what it wrote, and a write that failed is raised there.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

import numpy as np

from kvlease.ops.bench.writes import make_batch

BATCH_ROWS = 1_000


class PacedWriter:
    def __init__(self, client, ids: int, rows_per_s: int) -> None:
        if ids <= 0 or rows_per_s <= 0:
            raise ValueError(f"ids and rows_per_s must be positive, got {ids} and {rows_per_s}")
        self.client, self.ids, self.rows_per_s = client, ids, rows_per_s
        self.batch = min(BATCH_ROWS, ids, rows_per_s)
        self.rows = 0
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-paced-writer")

    def start(self) -> "PacedWriter":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the batch in flight; raises the error of a write that failed."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the writer loading the leader failed: {self.error}") from self.error

    def _run(self) -> None:
        t0 = time.perf_counter()
        start, salt = 0, 1_000
        try:
            while not self._stop.is_set():
                ids = np.arange(start, start + self.batch) % self.ids
                self.client.upsert(make_batch(ids, salt=salt))
                self.rows += len(ids)
                start, salt = (start + self.batch) % self.ids, salt + 1
                due = t0 + self.rows / self.rows_per_s  # when the next batch keeps the rate
                self._stop.wait(max(0.0, due - time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001 - raised by stop()
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - t0


@contextlib.contextmanager
def paced_writer(admin, table: str, ids: int, rows_per_s: int) -> Iterator[PacedWriter]:
    """A :class:`PacedWriter` on ``table`` (its own client), running for the block."""
    from kvlease.client.table import TableClient

    with TableClient(admin, table, retry_total_s=60) as client:
        writer = PacedWriter(client, ids, rows_per_s).start()
        try:
            yield writer
        except BaseException:
            writer._stop.set()  # the block's error, not the writer's, is raised
            writer._thread.join()
            raise
        writer.stop()
