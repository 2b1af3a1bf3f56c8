"""The traffic of the partitions drill: writer threads upserting into the current second's partition, and a
watch of the table's partition list.

:class:`Writers` keeps what was acknowledged (row ids per partition name, ack times) and every error, sorted
into retriable ones (counted) and the others (one line each). :class:`PartitionWatch` lists the partitions
every 0.3 s and keeps, per partition id, when it was first and last listed and when it was first missing
(:class:`~kvlease.ops.drills.partition_checks.Seen`); a listing that fails (a failover) is skipped.
"""

from __future__ import annotations

import threading
import time

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops.drills.partition_checks import Seen

BATCH = 20
PACE_S = 0.02


def second_of(at: float) -> str:
    """The SECOND partition name of ``at`` (UTC): ``yyyyMMddHHmmss``."""
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(at))


class Writers:
    """``count`` threads, each with its own TableClient, upserting BATCH rows a call into the current second's
    partition until :meth:`stop`."""

    def __init__(self, admin, path: str, count: int, retention_s: float | None = None) -> None:
        """``retention_s``: the table's retention; a write whose partition is dropped by it before the write
        gets through (its retries outlasted it, e.g. across a coordinator failover) is counted as expired,
        not as an error: its row is past retention either way."""
        self.admin, self.path, self.retention_s = admin, path, retention_s
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.acked: dict[str, list[int]] = {}
        self.ack_times: list[float] = []
        self.errors: list[str] = []
        self.calls = self.rows = self.retriable = self.expired = 0
        self.threads = [threading.Thread(target=self._write, args=(w,), name=f"drill-writer-{w}", daemon=True)
                        for w in range(count)]

    def __enter__(self) -> "Writers":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)

    def _write(self, writer: int) -> None:
        next_id = writer * 1_000_000_000
        with TableClient(self.admin, self.path) as client:
            while not self.stopping.is_set():
                started = time.time()
                name = second_of(started)
                ids = list(range(next_id, next_id + BATCH))
                next_id += BATCH
                try:
                    client.upsert([{"ts": name, "id": i, "v": i} for i in ids])
                except (errors.RetriableError, errors.OutcomeUnknownError):
                    with self.lock:
                        self.calls += 1
                        self.retriable += 1
                    continue
                except errors.KvLeaseError as exc:
                    expired = (isinstance(exc, errors.PartitionNotExistsError) and self.retention_s is not None
                               and time.time() - started >= self.retention_s)
                    with self.lock:
                        self.calls += 1
                        if expired:
                            self.expired += 1
                        else:
                            self.errors.append(f"{time.strftime('%H:%M:%S')} write into {name}: "
                                               f"{type(exc).__name__}: {exc}")
                    continue
                with self.lock:
                    self.calls += 1
                    self.rows += len(ids)
                    self.acked.setdefault(name, []).extend(ids)
                    self.ack_times.append(time.time())
                self.stopping.wait(PACE_S)

    def wait_for_acks(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.ack_times) < count:
            if time.monotonic() > deadline:
                raise errors.KvLeaseError(f"the drill's writers had no write acknowledged in {timeout_s:g}s: "
                                          f"{'; '.join(self.errors[:3]) or 'no error either'}")
            time.sleep(0.05)

    def gap_after(self, at: float) -> float | None:
        """The longest time without an acknowledged write in the 30 s after ``at`` (None: none acknowledged)."""
        with self.lock:
            times = sorted(t for t in self.ack_times if at <= t <= at + 30.0)
        if not times:
            return None
        points = [at, *times]
        return round(max(b - a for a, b in zip(points, points[1:])), 3)


class PartitionWatch:
    """The table's partitions, listed every 0.3 s by a thread of its own until closed."""

    def __init__(self, admin, path: str) -> None:
        self.admin, self.path = admin, path
        self.seen: dict[int, Seen] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="drill-partition-watch", daemon=True)

    def __enter__(self) -> "PartitionWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)

    def current(self) -> dict:
        """Partition name -> PartitionInfo, listed now (and recorded)."""
        listed_at = time.time()
        _table, partitions = self.admin.list_partitions(self.path)
        with self.lock:
            ids = set()
            for p in partitions:
                ids.add(p.partition_id)
                entry = self.seen.setdefault(p.partition_id, Seen(p.partition_id, p.name, listed_at, listed_at))
                entry.last = listed_at
            for entry in self.seen.values():
                if entry.partition_id not in ids and entry.gone is None:
                    entry.gone = listed_at
        return {p.name: p for p in partitions}

    def _watch(self) -> None:
        while not self.stopping.wait(0.3):
            try:
                self.current()
            except errors.KvLeaseError:
                continue
