"""What ``kvlease bench freshness`` times: a paced writer and the readers that see its writes, on one clock.

Every time here is this process's ``time.monotonic()``: the writer stamps each key when its write is
acknowledged (``TableClient.upsert`` returned: PutKv answered, at RF 3 once the in-sync replicas hold it),
a reader stamps each key when it sees it (:class:`Seen`); a key's freshness is the difference
(:func:`freshness`). Keys are ``0..n-1``, one row each, written in key order in small batches at a steady
rate (:class:`StampedWriter`). :class:`FeedReader` is the reader ``kvlease log --follow`` is: long-polling
``fetch_log_from`` of one bucket.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

COLUMNS_SQL = (("k", "BIGINT"), ("v", "STRING"))  # the table: primary key k
VALUE = "x" * 100
BATCH_INTERVAL_S = 0.01  # the writer sends a batch every 10 ms (rate / 100 rows)
IN_FLIGHT = 8  # writes in flight at most


class Seen:
    """When each key ``0..n-1`` was first seen (NaN: not yet); keys outside are counted as ``other``."""

    def __init__(self, n: int) -> None:
        self.times = np.full(n, np.nan)
        self.other = 0
        self._lock = threading.Lock()
        self._count = 0
        self._all = threading.Event()
        if n == 0:
            self._all.set()

    def mark(self, keys, now: float) -> None:
        with self._lock:
            for key in keys:
                if 0 <= key < len(self.times):
                    if np.isnan(self.times[key]):
                        self.times[key] = now
                        self._count += 1
                else:
                    self.other += 1
            if self._count == len(self.times):
                self._all.set()

    def wait_all(self, timeout_s: float) -> bool:
        return self._all.wait(timeout_s)


class StampedWriter:
    """Writes keys ``0..n-1`` (``n = rate * seconds``) at ``rate`` rows/s: ``rate / 100`` rows every 10 ms
    (at least one), each batch's keys stamped when its ``upsert`` returns. Batches are sent by up to
    :data:`IN_FLIGHT` threads, so a write that waits longer than the interval (at RF 3 the in-sync replicas'
    fetches) does not hold back the next: the rate is the one asked as long as the cluster can take it
    (reported as ``achieved_rate``)."""

    def __init__(self, client, rate: int, seconds: float) -> None:
        self.client = client
        self.per_batch = max(1, round(rate * BATCH_INTERVAL_S))
        self.interval_s = self.per_batch / rate
        self.n = max(self.per_batch, int(rate * seconds))
        self.acked = np.full(self.n, np.nan)
        self.achieved_rate = 0.0

    def run(self) -> None:
        t0 = time.monotonic()
        with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="freshness-writer") as pool:
            futures = []
            for i, start in enumerate(range(0, self.n, self.per_batch)):
                delay = t0 + i * self.interval_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(self._write, np.arange(start, min(start + self.per_batch, self.n))))
            for future in futures:
                future.result()
        self.achieved_rate = self.n / max(1e-9, float(np.nanmax(self.acked)) - t0)

    def _write(self, keys: np.ndarray) -> None:
        self.client.upsert(pa.record_batch({"k": pa.array(keys, pa.int64()), "v": pa.array([VALUE] * len(keys))}))
        self.acked[keys] = time.monotonic()


class FeedReader:
    """A thread reading bucket 0's changelog from ``position`` as ``kvlease log --follow`` does: long polls of
    ``wait_ms``; every +I record's key marked seen when its fetch answered (the records decoded)."""

    def __init__(self, client, position, seen: Seen, wait_ms: int) -> None:
        self.client = client
        self.position = position
        self.seen = seen
        self.wait_ms = wait_ms
        self.fetches = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freshness-reader", daemon=True)

    def start(self) -> "FeedReader":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                records, _end, self.position = self.client.fetch_log_from(0, self.position, max_wait_ms=self.wait_ms)
                now = time.monotonic()
                self.fetches += 1
                self.seen.mark([r["row"]["k"] for r in records if r["change_type"] == "+I"], now)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.wait_ms / 1000.0 + 30)
        if self.error is not None:
            raise RuntimeError(f"the changelog reader failed: {self.error}") from self.error


def freshness(acked: np.ndarray, seen: np.ndarray, warmup: int = 0) -> dict[str, float | int]:
    """p50 / p99 / max ms from each key's acknowledgement to its being seen, keys from ``warmup`` on. A key
    seen before the writer's ``upsert`` returned (the reader was told before the writer) counts 0 ms
    (``seen_before_ack`` of them); a key never seen is ``missing`` (and fails the run: see the caller)."""
    acked, seen = acked[warmup:], seen[warmup:]
    done = ~np.isnan(seen) & ~np.isnan(acked)
    delays_ms = (seen[done] - acked[done]) * 1000.0
    before = int((delays_ms < 0).sum())
    delays_ms = np.maximum(delays_ms, 0.0)
    if not len(delays_ms):
        return {"keys": 0, "missing": int(len(seen)), "seen_before_ack": 0, "p50_ms": float("nan"),
                "p99_ms": float("nan"), "max_ms": float("nan"), "mean_ms": float("nan")}
    return {"keys": int(len(delays_ms)), "missing": int((~done).sum()), "seen_before_ack": before,
            "p50_ms": float(np.percentile(delays_ms, 50)), "p99_ms": float(np.percentile(delays_ms, 99)),
            "max_ms": float(delays_ms.max()), "mean_ms": float(delays_ms.mean())}
