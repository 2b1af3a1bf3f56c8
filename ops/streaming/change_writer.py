"""The writer of ``kvlease demo`` and the ``spark-failover`` drill: loads a table, then makes inserts, updates
and deletes in rounds, and remembers every write it was acknowledged.

The table is ``(id BIGINT primary key, customer STRING, amount DOUBLE,
version INT)``. :meth:`ChangeWriter.load` inserts ids ``0..rows-1``;
each round of :meth:`ChangeWriter.run` then updates half of its size in
live rows (``version`` + 1), inserts a quarter as new ids and deletes a
quarter of the live rows (random, seeded), one upsert and one delete request
per round. ``expected`` is the table the acknowledged writes make, the
:func:`kvlease.ops.streaming.feed_check.check_written` reference.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np
import pyarrow as pa

from kvlease.common.tables import Column

COLUMNS = (Column("id", "BIGINT"), Column("customer", "STRING"), Column("amount", "DOUBLE"),
           Column("version", "INT"))
KEY = ("id",)
VALUES = ("customer", "amount", "version")
LOAD_BATCH = 20_000
SCHEMA = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("version", pa.int32())])


def make_rows(ids: np.ndarray, versions: np.ndarray) -> pa.RecordBatch:
    """The rows of ``ids`` in their ``versions`` (every value follows from id and version)."""
    ids = np.asarray(ids, dtype=np.int64)
    versions = np.asarray(versions, dtype=np.int32)
    customers = pa.array([f"customer-{i % 1000:03d}" for i in ids.tolist()], pa.string())
    amounts = ((ids * 37 + versions.astype(np.int64) * 101) % 100_000) / 100.0
    return pa.RecordBatch.from_arrays([pa.array(ids), customers, pa.array(amounts), pa.array(versions)],
                                      schema=SCHEMA)


class ChangeWriter:
    """Writes through a :class:`kvlease.client.table.TableClient`; not thread-safe (one writer thread)."""

    def __init__(self, client, seed: int = 7) -> None:
        self.client = client
        self.rng = np.random.default_rng(seed)
        self.expected: dict[tuple, tuple] = {}  # (id,) -> (customer, amount, version)
        self.loaded = 0
        self.changes = 0  # rows inserted, updated or deleted after the load
        self.records = 0  # changelog records the acknowledged writes made (an update makes two)
        self.longest_round_s = 0.0  # the slowest round of run(), its waits for a failover included
        self.rounds_done = 0
        self._next_id = 0

    # -- the load ----------------------------------------------------------------------------------

    def load(self, rows: int, progress: Callable[[int], None] = lambda done: None) -> None:
        """Insert ids ``0..rows-1`` (version 0) in batches; ``progress(rows so far)`` after each."""
        for start in range(0, rows, LOAD_BATCH):
            ids = np.arange(start, min(rows, start + LOAD_BATCH), dtype=np.int64)
            self._upsert(make_rows(ids, np.zeros(len(ids), dtype=np.int32)))
            self.loaded += len(ids)
            self.records += len(ids)
            progress(self.loaded)
        self._next_id = max(self._next_id, rows)

    # -- changes -----------------------------------------------------------------------------------

    def change_round(self, size: int) -> None:
        """One round of ``size`` changes: half updates, a quarter inserts, a quarter deletes."""
        live = np.fromiter((k[0] for k in self.expected), dtype=np.int64, count=len(self.expected))
        updates_n, deletes_n = size // 2, size // 4
        picked = self.rng.choice(live, min(len(live), updates_n + deletes_n), replace=False)
        updates, deletes = np.sort(picked[:updates_n]), np.sort(picked[updates_n:])
        inserts = np.arange(self._next_id, self._next_id + size - updates_n - deletes_n, dtype=np.int64)
        self._next_id += len(inserts)
        versions = np.array([self.expected[(int(i),)][2] + 1 for i in updates.tolist()] + [0] * len(inserts),
                            dtype=np.int32)
        self._upsert(make_rows(np.concatenate([updates, inserts]), versions))
        if len(deletes):
            self.client.delete(deletes.tolist())
            for i in deletes.tolist():
                del self.expected[(i,)]
        self.changes += len(updates) + len(inserts) + len(deletes)
        self.records += 2 * len(updates) + len(inserts) + len(deletes)
        self.rounds_done += 1

    def run(self, rounds: int, size: int, interval_s: float, stop: threading.Event, *,
            snapshot_every: int = 0, on_round: Callable[["ChangeWriter"], None] = lambda writer: None) -> None:
        """``rounds`` rounds of ``size`` changes, one every ``interval_s``, until done or ``stop`` is set; every
        ``snapshot_every`` rounds it asks for a snapshot of every changed bucket (without waiting for it)."""
        for number in range(1, rounds + 1):
            started = time.monotonic()
            self.change_round(size)
            if snapshot_every and number % snapshot_every == 0:
                self.client.trigger_snapshot(wait=False)
            self.longest_round_s = max(self.longest_round_s, time.monotonic() - started)
            on_round(self)
            if number < rounds and stop.wait(max(0.0, interval_s - (time.monotonic() - started))):
                return

    def _upsert(self, batch: pa.RecordBatch) -> None:
        self.client.upsert(batch)
        cols = batch.to_pydict()
        for i, customer, amount, version in zip(cols["id"], cols["customer"], cols["amount"], cols["version"]):
            self.expected[(i,)] = (customer, amount, version)
