"""The load the replica drills (rolling-restart, disk-loss, decommission) keep up while they move servers.

:class:`Load` runs, through one :class:`~kvlease.client.table.TableClient` with the
client's own retries, the tablet-failover drill's writers (threads owning
their keys, idempotent upserts and deletes, every acknowledged write kept
with the offsets the server answered), a reader looking up keys of every
bucket all along, and resuming live scans one after another (one bucket
each, in small batches, a short pause between batches so that a scan stays
open across the faults). Every call that failed after the client's retries
is counted per kind (``writes``, ``lookups``, ``scans``) and error: that is
what a user would have seen.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from kvlease.client.table import TableClient
from kvlease.ops.drills.failover_checks import Read
from kvlease.ops.drills.row_checks import ScanRecord
from kvlease.ops.drills.workload import AckedWriters, error_name

LOOKUP_KEYS = 4  # keys per lookup call, all of one bucket
LOOKUP_PAUSE_S = 0.02
SCAN_BATCH_BYTES = 1024
SCAN_PAUSE_S = 0.05  # between a scan's batches: a scan of a bucket stays open for a few seconds
WRITE_THINK_S = 0.15  # a writer's mean pause between calls: a few hundred writes in a drill, judged in seconds


class Reader(threading.Thread):
    """Lookups of ``LOOKUP_KEYS`` keys of one bucket after another; every value seen kept as a :class:`Read`."""

    def __init__(self, client: TableClient, bucket_of: dict[int, int], stop: threading.Event) -> None:
        super().__init__(name="drill-reader", daemon=True)
        self.client = client
        self.keys_of: dict[int, list[int]] = {}
        for key, bucket in sorted(bucket_of.items()):
            self.keys_of.setdefault(bucket, []).append(key)
        self.stop = stop
        self.reads: list[Read] = []
        self.calls = 0
        self.failures: Counter = Counter()

    def run(self) -> None:
        turn = 0
        while not self.stop.wait(LOOKUP_PAUSE_S):
            for bucket, keys in self.keys_of.items():
                start = (turn * LOOKUP_KEYS) % len(keys)
                self._look((keys + keys)[start:start + LOOKUP_KEYS])
            turn += 1

    def _look(self, keys: list[int]) -> None:
        self.calls += 1
        try:
            rows = self.client.lookup(keys)
        except Exception as exc:  # counted: a lookup that failed after the client's retries
            self.failures[error_name(exc)] += 1
            return
        at = time.time()
        self.reads += [Read("lookup", k, None if r is None else r["v"], at) for k, r in zip(keys, rows)]


class Scans(threading.Thread):
    """Resuming live scans (``resume=True``) of one bucket after another until stopped; each recorded as a
    :class:`~kvlease.ops.drills.row_checks.ScanRecord`."""

    def __init__(self, client: TableClient, buckets: list[int], stop: threading.Event) -> None:
        super().__init__(name="drill-scans", daemon=True)
        self.client = client
        self.buckets = buckets
        self.stop = stop
        self.records: list[ScanRecord] = []
        self.failures: Counter = Counter()

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            self._scan(f"scan {number + 1}", self.buckets[number % len(self.buckets)])
            number += 1

    def _scan(self, name: str, bucket: int) -> None:
        rows: list[tuple[int, int]] = []
        error, complete = "", False
        t_open = time.time()
        scanner = self.client.scanner(bucket, resume=True, batch_size_bytes=SCAN_BATCH_BYTES)
        try:
            while (batch := scanner.poll()) is not None:
                rows += [(r["id"], r["v"]) for r in batch.to_pylist()]
                self.stop.wait(SCAN_PAUSE_S)  # once the load stops, the scan is read to its end at once
            complete = True
        except Exception as exc:  # counted and judged: a resuming scan must read to its end
            error = error_name(exc)
            self.failures[error] += 1
        finally:
            scanner.close()
        self.records.append(ScanRecord(name, bucket, t_open, time.time(), rows, complete, True, scanner.resumed,
                                       error, interrupted=bool(error) or scanner.resumed > 0))


class Load:
    """Writers, a reader and scans on ``client``'s table while the drill runs (``with``); ``bucket_of``: the
    drill's keys and their buckets, every key written once first."""

    def __init__(self, client: TableClient, bucket_of: dict[int, int], seed: int) -> None:
        self.writers = AckedWriters(client, bucket_of, seed)
        self.writers.think_s = WRITE_THINK_S
        self.writers.write({k: k for k in bucket_of})
        self._stop = threading.Event()
        self.reader = Reader(client, bucket_of, self._stop)
        self.scans = Scans(client, sorted(set(bucket_of.values())), self._stop)

    def __enter__(self) -> "Load":
        self.writers.start()
        self.reader.start()
        self.scans.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.writers.stop()
        for thread in (self.reader, self.scans):
            thread.join(timeout=90)

    def failures(self) -> dict[str, dict[str, int]]:
        """kind (writes, lookups, scans) -> error name -> calls that failed after the client's retries."""
        return {"writes": dict(self.writers.failures), "lookups": dict(self.reader.failures),
                "scans": dict(self.scans.failures)}

    def calls(self) -> dict[str, int]:
        return {"writes": len(self.writers.calls), "lookups": self.reader.calls, "scans": len(self.scans.records)}

