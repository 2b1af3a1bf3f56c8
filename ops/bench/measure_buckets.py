"""Measure a tablet server with many one-bucket tables: file descriptors per bucket and restart time.

``python -m kvlease.ops.bench.measure_buckets --buckets 10000 [--dir D] [--keep] [--json]``
starts a local cluster (1 coordinator, 1 tablet server) in ``D`` (default: a
temp dir), creates N one-bucket tables, writes and reads a row in each,
counts the tablet server's open file descriptors (``/proc/PID/fd``) and reads
its health, then restarts it (``kvlease cluster restart --tablet 1``: SIGTERM,
start, wait until every bucket answers) and measures:

- ``restart_s``: until the restart returns (every bucket answers ListOffsets);
- ``recovered_s``: until the server has opened every bucket once in the
  background (its ``kvlease_tablet_buckets_recovering`` gauge reaches 0);
- ``read_all_s``: reading every table's row once more after the restart.

Progress goes to stderr; the figures to stdout (one JSON document with
``--json``). The cluster is stopped at the end (and ``D`` removed unless
``--keep`` or ``--dir`` was given).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.local_cluster import read_health

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]
THREADS = 8


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _parallel(n: int, work: Callable[[int], Any], what: str) -> float:
    """Run ``work(i)`` for i < n on a few threads; returns the seconds it took (raises the first error)."""
    started, done = time.monotonic(), [0]
    lock = threading.Lock()

    def one(i: int) -> None:
        work(i)
        with lock:
            done[0] += 1
            if done[0] % 1000 == 0:
                _log(f"{what}: {done[0]} of {n}")
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(n)))
    return time.monotonic() - started


def _tablet(directory: str) -> dict[str, Any]:
    return local_cluster.member(local_cluster.load(directory), "tablets", "1")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return kb / 1024


def _read_row(admin: AdminClient, i: int, expected: str) -> None:
    with TableClient(admin, f"db.t{i}", retry_total_s=60) as table:
        if table.lookup([i]) != [{"id": i, "v": expected}]:
            raise RuntimeError(f"db.t{i}: row {i} is not {expected!r}")


def measure(directory: str, buckets: int) -> dict[str, Any]:
    """The figures (see the module docstring) of a cluster started in ``directory``, stopped again at the end."""
    _log(f"starting a cluster in {directory}")
    with local_cluster.running(directory, tablets=1, config_overrides={"kv.snapshot.interval": "1h"}):
        return _measure(directory, buckets)


def _measure(directory: str, buckets: int) -> dict[str, Any]:
    """The figures of the cluster running in ``directory``."""
    figures: dict[str, Any] = {"buckets": buckets}
    pid = _tablet(directory)["pid"]
    figures["fds_empty"] = _fds(pid)
    with AdminClient(local_cluster.bootstrap(directory), retry_total_s=60) as admin:
        figures["create_s"] = _parallel(
            buckets, lambda i: admin.create_table(f"db.t{i}", SCHEMA, ["id"], 1), "tables created")

        def write(i: int) -> None:
            with TableClient(admin, f"db.t{i}", retry_total_s=60) as table:
                table.upsert([{"id": i, "v": f"row {i}"}])
            _read_row(admin, i, f"row {i}")
        figures["write_read_s"] = _parallel(buckets, write, "buckets written and read")
        figures["fds_loaded"] = _fds(pid)
        figures["rss_mb_loaded"] = round(_rss_mb(pid), 1)
        figures["health_loaded"] = read_health(_tablet(directory)["metrics_address"])

        _log("restarting the tablet server")
        recovered: dict[str, float] = {}
        started = time.monotonic()
        watcher = threading.Thread(target=_watch_recovery, args=(directory, buckets, started, recovered), daemon=True)
        watcher.start()
        local_cluster.restart(directory, "tablets", "1", ready_timeout_s=3600, graceful=True)
        figures["restart_s"] = time.monotonic() - started
        watcher.join(timeout=3600)
        figures["recovered_s"] = recovered.get("s")
        figures["read_all_s"] = _parallel(buckets, lambda i: _read_row(admin, i, f"row {i}"), "buckets read")
        pid = _tablet(directory)["pid"]
        figures["fds_restarted"] = _fds(pid)
        figures["rss_mb_restarted"] = round(_rss_mb(pid), 1)
        figures["health_restarted"] = read_health(_tablet(directory)["metrics_address"])
    figures["fds_per_bucket"] = round((figures["fds_loaded"] - figures["fds_empty"]) / buckets, 3)
    return figures


def _watch_recovery(directory: str, buckets: int, started: float, out: dict[str, float]) -> None:
    """Until the restarted tablet server leads every bucket and has opened each once."""
    old = _tablet(directory)["pid"]
    while time.monotonic() - started < 3600:
        entry = _tablet(directory)
        if entry["pid"] != old:
            try:
                health = read_health(entry["metrics_address"])
                if health.get("buckets") == buckets and health.get("recovering") == 0:
                    out["s"] = time.monotonic() - started
                    return
            except Exception:  # not up yet
                pass
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlease.ops.bench.measure_buckets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--buckets", type=int, default=10_000, help="one-bucket tables to create (default 10000)")
    parser.add_argument("--dir", help="cluster directory (default: a new temp dir, removed at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if args.buckets <= 0:
        parser.error("--buckets must be positive")
    directory = args.dir or tempfile.mkdtemp(prefix="kvlease-buckets-")
    try:
        figures = measure(directory, args.buckets)
    finally:
        if not (args.keep or args.dir):
            shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
