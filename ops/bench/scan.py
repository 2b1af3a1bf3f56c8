"""``kvlease bench scan`` (or ``python -m kvlease.ops.bench.scan``): live KV scans (ScanKv) against raw RocksDB iteration.

Starts its own local cluster (ZooKeeper, one coordinator, one tablet server;
processes in a temp directory, stopped at the end whatever happens), loads a
one-bucket table ``(id STRING of 16 chars primary key, v STRING of 100 random
hex digits)`` (``--schema wide``: 20 columns of mixed types, :mod:`kvlease.ops.bench.wide_schema`; the
target is then stream >= 0.6 only) with ``--rows`` rows (default 1,000,000) through
``TableClient.upsert`` (changelog fsync off), snapshots it (memtables
flushed) and waits until the tablet server is idle (its compactions done),
then measures in one run, each full scan ``--rounds`` times (3),
interleaved, the best of each counting:

- ``unary``: rows/s of :class:`kvlease.client.scanner.KvBatchScanner` (ScanKv
  sessions, one request in flight: prefetch) reading the whole bucket;
- ``stream``: rows/s of :class:`kvlease.client.scanner.KvStreamScanner` (ScanKvStream);
- ``raw``: rows/s of iterating a rocksdict (raw mode) holding the same
  encoded rows, in this process, without filling the block cache as a scan
  session reads: the floor of what reading them costs.

Each scanner is measured in two modes: ``decoded`` (rows handed out as Arrow
batches of the table's schema, the client decoding the values: what a
reader gets) and ``records`` (the ``value`` column as received, no decoding:
what the wire and the server deliver). Both ratios to ``raw`` are reported;
the targets (unary >= 0.65, stream >= 0.75: issue 12) are judged on
``decoded``, the honest one (raw iteration hands out bytes, not decoded
rows, so ``decoded`` is the stricter comparison).

CPU: the seconds of CPU this process (client) and the tablet server (all
its threads) used during the best run of each kind, next to its elapsed time:
a server CPU close to the elapsed time means the server's one thread per
scan is the limit.

Server memory: before each scan the tablet server's peak RSS is reset
(``/proc/PID/clear_refs`` 5) and read afterwards (``VmHWM``); reported as the
peak above the RSS before the scan, next to ``batch size x open scanners``.
A last phase opens 8 scanners at once (``kv.scanner.max-per-bucket``) and
reads them round-robin, each with one request in flight. Target: the peak
above the RSS before <= 2 x (scanners x batch size) + 32 MB, judged for one
scanner (the worst of the four kinds, over the rounds) and for the 8 at once;
the judged rows print the formula. The 2 batches per scanner are the one read
ahead and the one in flight (gRPC's copy being sent, or one being built); the
32 MB covers the finished sessions' replay cache (16 MB) and allocator slack.
The RSS before each scan is the server's after the load and the earlier
scans (what it keeps between scans is in it, what a scan adds is not).

The suite interface (``OPTIONS``, ``run``, ``target_rows``, ``report``) is
:mod:`kvlease.ops.bench.suite`'s.
"""

from __future__ import annotations

import collections
import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from kvlease.common.codec import RowCodec
from kvlease.common.errors import AuthorizationFailedError
from kvlease.common.kvsnapshot import scan_read_options
from kvlease.common.tables import Column, TableInfo
import kvlease.ops.bench.suite as bench_suite
from kvlease.ops import local_cluster
from kvlease.ops.bench.scan_report import SECURE_KINDS, SECURE_TARGET, TARGETS, WIDE_TARGETS, report, target_rows
from kvlease.ops.bench.machine import cpu_seconds, wait_idle
from kvlease.ops.bench.suite import Option, positive_int
from kvlease.ops.bench.wide_schema import WIDE_COLUMNS, schema_name, wide_batch
from kvlease.ops.wait import wait_until

__all__ = ["OPTIONS", "report", "run", "target_rows"]  # what the suite uses

TABLE = "bench.scan"
COLUMNS = [Column("id", "STRING"), Column("v", "STRING")]
LOAD_BATCH_ROWS = 20_000
CONCURRENT_SCANNERS = 8

OPTIONS = (
    Option("--rows", positive_int, 1_000_000, "rows loaded and scanned"),
    Option("--rounds", positive_int, 3, "full scans of each kind, interleaved (the best one counts)"),
    Option("--secure", bool, False, "instead: decoded rows/s of both scanners on a secure cluster (mutual TLS, "
           "a user with a password and READ/WRITE grants) vs a plain one, both up in the same run, rounds "
           "interleaved (target secure >= 0.8 of plain)"),
    Option("--schema", schema_name, "narrow", "the table: narrow (id STRING 16, v STRING 100 B) or wide (20 columns "
           "of mixed types: DECIMAL, DATE, TIMESTAMP, ARRAY, …)", metavar="NAME"),
)


def make_batch(start: int, count: int) -> pa.RecordBatch:
    """Rows ``start..start+count-1``: ``id`` 16 hex digits, ``v`` 100 random hex digits."""
    ids = np.arange(start, start + count, dtype=np.uint64)
    hexdigits = np.frombuffer(b"0123456789abcdef", np.uint8)
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    id_bytes = hexdigits[((ids[:, None] >> shifts) & np.uint64(15)).astype(np.uint8)].tobytes()
    rng = np.random.default_rng([start, count])
    v_bytes = hexdigits[rng.integers(0, 16, size=(count, 100), dtype=np.uint8)].tobytes()

    def strings(data: bytes, width: int) -> pa.Array:
        offsets = pa.py_buffer(np.arange(0, width * (count + 1), width, dtype=np.int32))
        return pa.Array.from_buffers(pa.string(), count, [None, offsets, pa.py_buffer(data)])

    return pa.record_batch({"id": strings(id_bytes, 16), "v": strings(v_bytes, 100)})


def wide_rows(start: int, count: int) -> pa.RecordBatch:
    """The wide rows ``start..start+count-1`` (``--schema wide``)."""
    return wide_batch(np.arange(start, start + count, dtype=np.int64))


def load(client, rows: int, threads: int = 2, make=make_batch) -> float:
    """Upsert rows 0..rows-1 in batches from ``threads`` threads; returns rows/s."""
    queue = collections.deque(range(0, rows, LOAD_BATCH_ROWS))
    lock, failures = threading.Lock(), []

    def worker() -> None:
        while True:
            with lock:
                if not queue or failures:
                    return
                start = queue.popleft()
            try:
                client.upsert(make(start, min(LOAD_BATCH_ROWS, rows - start)))
            except BaseException as exc:  # reported by the caller
                failures.append(exc)
                return

    workers = [threading.Thread(target=worker, name=f"bench-load-{i}") for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if failures:
        raise failures[0]
    return rows / (time.perf_counter() - t0)


def build_raw(codec: RowCodec, rows: int, directory: str, make=make_batch):
    """A rocksdict (raw mode) with the same encoded rows, flushed to SST files like a served bucket."""
    from rocksdict import Options, Rdict, WriteBatch, WriteOptions

    db = Rdict(directory, Options(raw_mode=True))
    no_wal = WriteOptions()
    no_wal.disable_wal = True  # like the tablet server: the changelog is its log
    for start in range(0, rows, LOAD_BATCH_ROWS):
        keys, values = codec.encode(make(start, min(LOAD_BATCH_ROWS, rows - start)))
        batch = WriteBatch(raw_mode=True)
        collections.deque(map(batch.put, keys, values), maxlen=0)
        db.write(batch, no_wal)
    db.flush()
    return db


def raw_scan(db) -> tuple[int, int]:
    """(rows, value bytes) of one full forward iteration, reading like a scan session does
    (:func:`kvlease.common.kvsnapshot.scan_read_options`: ~20% faster than through the block cache)."""
    n = size = 0
    for _key, value in db.items(read_opt=scan_read_options()):
        n += 1
        size += len(value)
    return n, size


# -- the tablet server's memory --------------------------------------------------------------------


class PeakRss:
    """The tablet server's RSS: reset the peak (clear_refs 5) where allowed, else sample every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._stop = threading.Event()
        self._sampled = 0
        self._thread: threading.Thread | None = None

    def _status(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc/{self.pid}/status")

    def rss(self) -> int:
        return self._status("VmRSS")

    def __enter__(self) -> "PeakRss":
        self.before = self.rss()
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self.method = "VmHWM after clear_refs"
        except OSError:
            self.method = "VmRSS sampled every 20 ms"
        self._sampled = self.before
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self._sampled = max(self._sampled, self.rss())
            except (OSError, RuntimeError):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self._sampled, self._status("VmHWM")) if self.method.startswith("VmHWM") else self._sampled

    def doc(self) -> dict[str, Any]:
        return {"rss_before": self.before, "peak": self.peak, "peak_above_before": self.peak - self.before,
                "method": self.method}


# -- measurements ----------------------------------------------------------------------------------


def timed(scan: Callable[[], int], rows: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    got = scan()
    elapsed = time.perf_counter() - t0
    if got != rows:
        raise RuntimeError(f"a full scan returned {got} rows, expected {rows}")
    return rows / elapsed, elapsed


def scanner_scan(client, streaming: bool, decode: bool) -> Callable[[], int]:
    def scan() -> int:
        n = 0
        with client.scanner(0, streaming=streaming, decode=decode) as scanner:
            for batch in scanner:
                n += batch.num_rows
        return n
    return scan


def concurrent_scanners(client, count: int, limit: int) -> dict[str, Any]:
    """``count`` scanners open at once, read round-robin (each with one request in flight)."""
    scanners = [client.scanner(0, limit=limit, decode=False) for _ in range(count)]
    rows = 0
    t0 = time.perf_counter()
    try:
        for s in scanners:
            s.open()
        live = list(scanners)
        while live:
            for s in list(live):
                batch = s.poll()
                if batch is None:
                    live.remove(s)
                else:
                    rows += batch.num_rows
    finally:
        for s in scanners:
            s.close()
    return {"scanners": count, "rows": rows, "rows_per_s": rows / (time.perf_counter() - t0)}


def _best_of_rounds(scans: dict[str, Callable[[], int]], rows: int, rounds: int, tablet_pid: int,
                    progress: bench_suite.Progress) -> tuple[dict[str, float], dict[str, dict], dict[str, dict]]:
    """Every scan of ``scans``, ``rounds`` times: per scan its best rows/s, the CPU seconds of that best run
    (client and tablet server), and the tablet server's largest peak RSS over its runs (not for ``raw``)."""
    best: dict[str, float] = {}
    cpu: dict[str, dict] = {}
    memory: dict[str, dict] = {}
    for round_ in range(rounds):
        progress(f"full scans, round {round_ + 1} of {rounds}")
        for name, scan in scans.items():
            client_cpu, server_cpu = time.process_time(), cpu_seconds(tablet_pid)
            if name == "raw":
                rate, elapsed = timed(scan, rows)
            else:
                with PeakRss(tablet_pid) as peak:
                    rate, elapsed = timed(scan, rows)
                if name not in memory or peak.peak - peak.before > memory[name]["peak_above_before"]:
                    memory[name] = peak.doc()
            if rate > best.get(name, 0.0):
                best[name] = rate
                cpu[name] = {"elapsed_s": elapsed, "client_cpu_s": time.process_time() - client_cpu,
                             "server_cpu_s": cpu_seconds(tablet_pid) - server_cpu}
    return best, cpu, memory


def _secure_client(directory: str, mode: str, rows: int, admins: list, progress: bench_suite.Progress):
    """A table client of the cluster in ``directory`` (for ``secure``: as user ``bench`` with its grants) on
    the table, ``rows`` rows loaded and snapshotted; its admin client is appended to ``admins``."""
    import secrets

    from kvlease.client.admin import AdminClient
    from kvlease.client.table import TableClient
    from kvlease.common import config as cfg
    from kvlease.common.security.acl import Operation, Resource

    config = local_cluster.client_config(local_cluster.load(directory))
    if mode == "secure":
        password = secrets.token_urlsafe(16)
        with AdminClient(local_cluster.bootstrap(directory), config, retry_total_s=30) as admin:
            admin.add_user("bench", password)
            admin.add_acl(Resource.database("bench"), "User:bench", Operation.CREATE)
            for operation in (Operation.READ, Operation.WRITE):
                admin.add_acl(Resource.table(TABLE), "User:bench", operation)
        config = config.with_overrides({cfg.SECURITY_USERNAME.name: "bench", cfg.SECURITY_PASSWORD.name: password})
    admin = AdminClient(local_cluster.bootstrap(directory), config, retry_total_s=30)
    admins.append(admin)
    # a fresh grant reaches the servers' ACL caches a ZooKeeper watch later
    wait_until(lambda: admin.create_table(TABLE, COLUMNS, ["id"], 1), 15, "the bench user's CREATE granted",
               retry_on=(AuthorizationFailedError,))
    client = TableClient(admin, TABLE)
    progress(f"{mode}: upserting {rows:,} rows, snapshot")
    wait_until(lambda: client.upsert(make_batch(0, 1)), 15, "the bench user's WRITE granted",
               retry_on=(AuthorizationFailedError,))  # WRITE has reached the tablet server
    load(client, rows)
    client.trigger_snapshot(wait=True)
    return client


def run_secure(rows: int, rounds: int, progress: bench_suite.Progress) -> dict[str, Any]:
    """Two local clusters up at once, one plain and one ``--secure`` (where user ``bench``, not a super user,
    is granted CREATE on the database and READ and WRITE on the table); the same rows loaded into each; then
    ``rounds`` rounds, each a full decoded scan per scanner kind on one cluster then the other."""
    base = tempfile.mkdtemp(prefix="kvlease-bench-scan-")
    started: list[str] = []
    admins: list = []
    clients: dict[str, Any] = {}
    clusters = contextlib.ExitStack()  # both clusters, stopped when it closes
    try:
        for mode in ("plain", "secure"):
            directory = f"{base}/{mode}"
            started.append(directory)
            clusters.enter_context(local_cluster.running(
                directory, tablets=1, secure=mode == "secure", progress=progress, config_overrides={
                    "kv.snapshot.interval": "1h", "log.flush.fsync": False}))
            clients[mode] = _secure_client(directory, mode, rows, admins, progress)
        for directory in started:
            wait_idle(local_cluster.load(directory)["tablets"][0]["pid"])
        best: dict[str, dict[str, float]] = {mode: {} for mode in clients}
        for round_ in range(rounds):
            progress(f"full scans, round {round_ + 1} of {rounds}")
            for kind, streaming in SECURE_KINDS.items():
                for mode, client in clients.items():
                    rate, _elapsed = timed(scanner_scan(client, streaming=streaming, decode=True), rows)
                    best[mode][kind] = max(best[mode].get(kind, 0.0), rate)
        ratios = {kind: best["secure"][kind] / best["plain"][kind] for kind in SECURE_KINDS}
        return {"secure": True, "rows": rows, "rounds": rounds, "rows_per_s": best, "secure_to_plain": ratios,
                "target": SECURE_TARGET}
    finally:
        for client in clients.values():
            client.close()
        for admin in admins:
            admin.close()
        clusters.close()
        shutil.rmtree(base, ignore_errors=True)


def run(*, rows: int, rounds: int, secure: bool = False, schema: str = "narrow",
        progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    if secure:
        return run_secure(rows, rounds, progress)
    from kvlease.client.admin import AdminClient
    from kvlease.client.table import TableClient

    base = tempfile.mkdtemp(prefix="kvlease-bench-scan-")
    directory = f"{base}/cluster"
    raw_db = None
    try:
        progress(f"raw rocksdict copy of {rows:,} rows")
        columns, make = (COLUMNS, make_batch) if schema == "narrow" else (WIDE_COLUMNS, wide_rows)
        codec = RowCodec(TableInfo(0, *TABLE.split("."), tuple(columns), ("id",), 1))
        raw_db = build_raw(codec, rows, f"{base}/rocksdb", make)
        with local_cluster.running(directory, tablets=1, config_overrides={
                "kv.snapshot.interval": "1h", "log.flush.fsync": False}, progress=progress):
            tablet_pid = local_cluster.load(directory)["tablets"][0]["pid"]
            with AdminClient(local_cluster.bootstrap(directory), retry_total_s=30) as admin:
                admin.create_table(TABLE, columns, ["id"], 1)
                with TableClient(admin, TABLE) as client:
                    progress(f"upserting {rows:,} rows, snapshot, waiting until the tablet server is idle")
                    load_rate = load(client, rows, make=make)
                    client.trigger_snapshot(wait=True)  # memtables flushed, like the raw copy
                    settle_s = wait_idle(tablet_pid)
                    batch_bytes = client.scan_batch_bytes
                    scans = {
                        "raw": lambda: raw_scan(raw_db)[0],
                        "unary_decoded": scanner_scan(client, streaming=False, decode=True),
                        "stream_decoded": scanner_scan(client, streaming=True, decode=True),
                        "unary_records": scanner_scan(client, streaming=False, decode=False),
                        "stream_records": scanner_scan(client, streaming=True, decode=False),
                    }
                    best, cpu, memory = _best_of_rounds(scans, rows, rounds, tablet_pid, progress)
                    progress(f"{CONCURRENT_SCANNERS} scanners at once")
                    with PeakRss(tablet_pid) as peak:
                        concurrent = concurrent_scanners(client, CONCURRENT_SCANNERS, max(1, rows // 5))
                    concurrent["memory"] = peak.doc()
            raw = best["raw"]
            ratios = {name: best[name] / raw for name in best if name != "raw"}
            return {
                "rows": rows, "schema": schema, "key_bytes": 16 if schema == "narrow" else 8,
                "value_bytes": 100 if schema == "narrow" else None, "load_rows_per_s": load_rate,
                "settle_s": settle_s, "rounds": rounds,
                "batch_size_bytes": batch_bytes, "rows_per_s": best, "ratio_to_raw": ratios, "cpu": cpu,
                "targets": {f"{k}_decoded": v for k, v in (TARGETS if schema == "narrow" else WIDE_TARGETS).items()},
                "ratio_used_for_targets": "decoded",
                "server_memory": {name: {**doc, "batch_x_scanners": batch_bytes} for name, doc in memory.items()},
                "concurrent": {**concurrent, "batch_x_scanners": batch_bytes * CONCURRENT_SCANNERS},
            }
    finally:
        if raw_db is not None:
            raw_db.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    bench_suite.module_main("scan")
