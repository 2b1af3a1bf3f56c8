"""The row traffic several drills share: writers that record every call, and a scan read on after a fault.

:class:`Writers` (threads, each owning its keys) upsert and delete through one
:class:`~kvlease.client.table.TableClient` and record every write per key
(:class:`~kvlease.ops.drills.row_checks.WriteOp`) and every call; :class:`AckedWriters`
also keep the offsets each acknowledged write was answered
(:class:`~kvlease.ops.drills.failover_checks.AckedWrite`). :func:`scan_after_kill`
reads a scanner opened before a fault to its end and records it
(:class:`~kvlease.ops.drills.row_checks.ScanRecord`). :func:`error_name` is the name
a failed call is counted under. Used by tablet-restart, tablet-failover,
chaos and the replica drills' load (:mod:`kvlease.ops.drills.replica_traffic`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops.drills.crew import Crew
from kvlease.ops.drills.failover_checks import AckedWrite
from kvlease.ops.drills.row_checks import ScanRecord, WriteOp
from kvlease.ops.wait import poll

WRITERS = 4
KEYS_PER_CALL = 16
THINK_S = 0.02
PAD = "p" * 600  # rows of ~650 bytes: a bucket is bigger than a gRPC stream's flow-control window


def error_name(exc: BaseException) -> str:
    """The name a failed call is recorded under: a typed error's class, else ``internal: ...`` with the message."""
    if isinstance(exc, errors.KvLeaseError):
        return type(exc).__name__
    return f"internal: {type(exc).__name__}: {exc}"


class Writers:
    """Threads upserting and deleting their own keys; every write recorded per key."""

    think_s = THINK_S  # a writer's mean pause between calls

    def __init__(self, client: TableClient, bucket_of: dict[int, int], seed: int) -> None:
        self.client = client
        self.bucket_of = bucket_of
        self.history: dict[int, list[WriteOp]] = {key: [] for key in bucket_of}
        self.calls: list[tuple[float, float, frozenset[int], bool]] = []  # t0, t1, buckets, acknowledged
        self.failures: Counter = Counter()
        self._lock = threading.Lock()
        self._crew = Crew("drill-writer", self._run, [(i, random.Random(seed * 100 + i)) for i in range(WRITERS)])
        self._stop = self._crew.stop_event

    def start(self) -> None:
        self._crew.start()

    def stop(self) -> None:
        self._crew.stop(90)

    def write(self, values: dict[int, int | None]) -> None:
        """One upsert call (or delete call when every value is None) and its record."""
        deletes = all(v is None for v in values.values())
        buckets = frozenset(self.bucket_of[k] for k in values)
        t0 = time.time()
        written: set[int] = set()
        try:
            if deletes:
                self.client.delete(list(values))
            else:
                self.client.upsert([{"id": k, "v": v, "pad": PAD} for k, v in values.items()])
            written = set(buckets)
        except Exception as exc:  # recorded: the checkers judge what may have happened
            written = set(getattr(exc, "details", {}).get("written", {}) or {})
            with self._lock:
                self.failures[error_name(exc)] += 1
        t1 = time.time()
        with self._lock:
            self.calls.append((t0, t1, buckets, written == set(buckets)))
        for key, value in values.items():
            self.history[key].append(WriteOp(key, value, t0, t1, self.bucket_of[key] in written))

    def _run(self, index: int, rng: random.Random) -> None:
        mine = [k for k in self.history if k % WRITERS == index]
        sequence = 0
        while not self._stop.wait(rng.uniform(0, 2 * self.think_s)):
            keys = rng.sample(mine, KEYS_PER_CALL)
            if rng.random() < 0.2:
                self.write({k: None for k in keys})
            else:
                sequence += 1
                self.write({k: (index + 1) * 10_000_000 + sequence for k in keys})

    def recovery_after(self, killed_at: float, buckets: set[int], timeout_s: float) -> float | None:
        """Seconds from the kill to the first acknowledged write to ``buckets`` sent after it."""
        def first_ack() -> float | None:
            with self._lock:
                return min((t1 for t0, t1, b, ok in self.calls if ok and t0 > killed_at and b & buckets), default=None)
        acked, found = poll(first_ack, timeout_s)
        return round(acked - killed_at, 3) if found else None


class AckedWriters(Writers):
    """:class:`Writers`, also keeping the offsets each acknowledged write was answered."""

    def __init__(self, client: TableClient, bucket_of: dict[int, int], seed: int) -> None:
        super().__init__(client, bucket_of, seed)
        self.acked: list[AckedWrite] = []

    def write(self, values: dict[int, int | None]) -> None:
        t0 = time.time()
        deletes = all(v is None for v in values.values())
        try:
            offsets = (self.client.delete(list(values)) if deletes else
                       self.client.upsert([{"id": k, "v": v, "pad": PAD} for k, v in values.items()]))
            error = None
        except Exception as exc:  # recorded: the checkers judge what may have happened
            offsets, error = dict(getattr(exc, "details", {}).get("written", {}) or {}), exc
        self._record(values, t0, offsets, error)

    def _record(self, values: dict[int, int | None], t0: float, offsets: dict, error: Exception | None) -> None:
        t1 = time.time()
        buckets = frozenset(self.bucket_of[k] for k in values)
        with self._lock:
            if error is not None:
                self.failures[error_name(error)] += 1
            self.calls.append((t0, t1, buckets, set(offsets) == set(buckets)))
            for bucket, (base, end) in offsets.items():
                rows = {k: v for k, v in values.items() if self.bucket_of[k] == bucket}
                self.acked.append(AckedWrite(bucket, base, end, rows))
        for key, value in values.items():
            self.history[key].append(WriteOp(key, value, t0, t1, self.bucket_of[key] in offsets))

    def successes(self) -> dict[int, list[tuple[float, float]]]:
        """bucket -> ``(sent, answered)`` times of the calls that wrote to it."""
        out: dict[int, list[tuple[float, float]]] = {}
        with self._lock:
            for t0, t1, buckets, ok in self.calls:
                for bucket in buckets if ok else ():
                    out.setdefault(bucket, []).append((t0, t1))
        return out


def scan_after_kill(scanner, name: str, bucket: int, resume: bool, t_open: float, first, out: list) -> None:
    """Read the scanner to its end (or error) and record it; ``first`` is the batch read before the kill."""
    rows = [(r["id"], r["v"]) for r in first.to_pylist()] if first is not None else []
    error = ""
    complete = first is None
    try:
        while not complete and (batch := scanner.poll()) is not None:
            rows += [(r["id"], r["v"]) for r in batch.to_pylist()]
        complete = True
    except Exception as exc:  # recorded and judged by scans_end_cleanly
        error = error_name(exc)
    finally:
        scanner.close()
    out.append(ScanRecord(name, bucket, t_open, time.time(), rows, complete, resume, scanner.resumed, error,
                          interrupted=bool(error) or scanner.resumed > 0))
