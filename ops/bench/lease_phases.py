"""The phases of ``kvlease bench leases`` (:mod:`kvlease.ops.bench.leases`): its coordinators, a. acquiring
leases, b. raw ZooKeeper writes, c. the failover, d. the idle loop, and seeding leases."""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.client.admin import AdminClient, wait_for_active
from kvlease.common.kvsnapshot import Manifest
from kvlease.common.model import TableBucket
from kvlease.common.storage import open_storage
import kvlease.ops.bench.scale as bench_scale
from kvlease.ops.bench.machine import cpu_seconds
from kvlease.ops.bench.suite import Progress
from kvlease.ops.local_cluster import ServerProcess, child_env, dying_with_parent

HOUR_MS = 3_600_000
TARGET_RATIO = 0.5  # acquires/s over raw ZooKeeper creates/s, at least
SECURE_TARGET = 0.8  # secure acquires/s over plain, at least
FAILOVER_SLACK_S = 2.0  # failover at most the session timeout + this


@dataclass(frozen=True)
class BenchSettings:
    seconds: float = 8.0  # acquire phase: at most this long ...
    held_leases: int = 30_000  # ... or until this many leases exist; also the failover's lease count
    threads: int = 64  # many in flight, as the anchor has (see the module docstring)
    buckets: int = 16
    raw_writes: int = 20_000
    raw_window: int = 1_000
    session_timeout_ms: int = 6_000  # the default zookeeper.session-timeout
    idle_seconds: float = 5.0  # phase d: loop CPU sampled this long
    fsync: bool = True  # the default remote.file.fsync


# -- processes ---------------------------------------------------------------------------------------


class Coordinator(ServerProcess):
    """A coordinator of this benchmark (dies with it); its CPU seconds and log size."""

    def __init__(self, home: Path, values: dict[str, Any]) -> None:
        super().__init__(home, "coordinator", values)
        self.address = f"127.0.0.1:{values[cfg.COORDINATOR_PORT.name]}"
        self.metrics_port = values.get(cfg.METRICS_PORT.name, -1)

    def cpu_s(self) -> float:
        return cpu_seconds(self.popen.pid)

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0


def percentile_ms(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return round(sorted_values[index] * 1000, 2)


# -- a. acquire ---------------------------------------------------------------------------------------


def acquire_many(addresses: list[str], table_id: int, buckets: int, threads: int, prefix: str,
                  stop_after_s: float | None, max_total: int, config: cfg.Config | None = None, *,
                  shared_client: bool = True) -> dict[str, Any]:
    """``threads`` threads acquire new leases ``{prefix}-{thread}-{n}`` until time or count runs out:
    through one client they share (its acquires made at once travel together), or a client each."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    failures: list[str] = []
    issued = [0]
    lock = threading.Lock()
    clock = {"start": 0.0, "deadline": 0.0}

    def start_clock() -> None:  # run by the barrier before any thread passes it
        clock["start"] = time.perf_counter()
        clock["deadline"] = clock["start"] + (stop_after_s or 0.0)

    start_gate = threading.Barrier(threads + 1, action=start_clock)

    def take() -> bool:
        with lock:
            if issued[0] >= max_total:
                return False
            issued[0] += 1
            return True

    def new_client() -> AdminClient:
        return AdminClient(addresses, config, request_timeout_s=30.0, retry_total_s=30.0)

    shared = new_client() if shared_client else None

    def worker(index: int) -> None:
        tb = TableBucket(table_id, index % buckets)
        with contextlib.nullcontext(shared) if shared is not None else new_client() as client:
            try:  # connect before the clock starts
                client.list_tables()
            except errors.KvLeaseError:
                pass
            start_gate.wait()
            n = 0
            mine = latencies[index]
            while (stop_after_s is None or time.perf_counter() < clock["deadline"]) and take():
                t0 = time.perf_counter()
                try:
                    result = client.acquire_lease(f"{prefix}-{index}-{n}", {tb: 1}, HOUR_MS)
                except errors.KvLeaseError as exc:
                    with lock:
                        failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                finally:
                    n += 1
                mine.append(time.perf_counter() - t0)
                if result.unavailable:
                    with lock:
                        failures.append(f"unavailable: {result.unavailable}")

    try:
        _run_threads(worker, threads, start_gate)
    finally:
        if shared is not None:
            shared.close()
    return _acquire_figures(latencies, failures, time.perf_counter() - clock["start"], shared_client)


def _run_threads(worker: Callable[[int], None], threads: int, start_gate: threading.Barrier) -> None:
    """``worker(i)`` in ``threads`` threads, released together through ``start_gate``; until all return."""
    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    start_gate.wait()
    for t in pool:
        t.join()


def _acquire_figures(latencies: list[list[float]], failures: list[str], elapsed: float,
                     shared_client: bool) -> dict[str, Any]:
    lat = sorted(x for per in latencies for x in per)
    return {
        "clients": "shared" if shared_client else "one per thread", "acquires": len(lat), "errors": len(failures),
        "first_errors": failures[:5], "seconds": round(elapsed, 3),
        "per_s": round(len(lat) / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": percentile_ms(lat, 0.50), "p99_ms": percentile_ms(lat, 0.99),
        "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
    }


# -- b. raw ZooKeeper ----------------------------------------------------------------------------------


def raw_zk_writes(connect: str, count: int, window: int, session_timeout_s: float) -> dict[str, dict[str, float]]:
    """Pipelined creates, then sets, of ``count`` small nodes (run in its own process), once
    through kazoo's stock handler and once through :class:`kvlease.common.zk.PollHandler` (the
    coordinator's): per handler ``{"create": per_s, "set": per_s}``."""
    from kazoo.client import KazooClient

    from kvlease.common.zk import PollHandler

    # about the size of a lease node: {version, expiration_time, tables: [{table_id, metadata_path}]}
    data = json.dumps({"version": 1, "expiration_time": 1_900_000_000_000, "tables": [
        {"table_id": 1, "metadata_path": "lease/kv-snapshot/1/" + "0" * 32 + ".metadata"}]}).encode()
    rates: dict[str, dict[str, float]] = {}
    for handler in ("stock", "poll"):
        zk = KazooClient(hosts=connect, timeout=session_timeout_s,
                         **({"handler": PollHandler()} if handler == "poll" else {}))
        zk.start(timeout=30)
        try:
            base = f"/kvlease-bench-raw-{handler}"
            zk.ensure_path(base)
            rates[handler] = {}
            for kind in ("create", "set"):
                pending: deque = deque()
                t0 = time.perf_counter()
                for i in range(count):
                    path = f"{base}/n{i}"
                    pending.append(zk.create_async(path, data) if kind == "create" else zk.set_async(path, data))
                    if len(pending) >= window:
                        pending.popleft().get()
                while pending:
                    pending.popleft().get()
                rates[handler][kind] = count / (time.perf_counter() - t0)
        finally:
            zk.stop()
            zk.close()
    return rates


def raw_phase(connect: str, s: BenchSettings) -> dict[str, Any]:
    """:func:`raw_zk_writes` in a process of its own (its own GIL), through ``--raw-zk``."""
    cmd = [sys.executable, "-m", "kvlease.ops.bench.leases", "--raw-zk", connect, str(s.raw_writes), str(s.raw_window),
           str(s.session_timeout_ms)]
    proc = subprocess.run(dying_with_parent(cmd), capture_output=True, text=True, timeout=600, env=child_env())
    if proc.returncode != 0:
        raise errors.KvLeaseError(f"raw ZooKeeper write phase failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    # the anchor is the faster client's: the best measure of what ZooKeeper itself can take
    best = max(result.values(), key=lambda rates: rates["create"])
    return {"writes": s.raw_writes, "window": s.raw_window, "create_per_s": round(best["create"], 1),
            "set_per_s": round(best["set"], 1),
            "by_handler": {name: {kind: round(rate, 1) for kind, rate in rates.items()}
                           for name, rates in result.items()}}


# -- c. failover -------------------------------------------------------------------------------------------


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?(elected, epoch \d+|reinitialized: .*|"
                       r"active \(epoch \d+\))", re.MULTILINE)


def log_events(log_path: Path) -> dict[str, float]:
    """Wall-clock times (s since the epoch) of the standby's election, reinit done, and serving."""
    found: dict[str, float] = {}
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return found
    for stamp, what in _LOG_TIME.findall(text):
        t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        key = "elected" if what.startswith("elected") else "reinitialized" if what.startswith("reinit") else "active"
        found[key] = t  # the last occurrence wins: the failover, not the start
        if key == "reinitialized":
            found["stats"] = what  # type: ignore[assignment]
    return found


def active_and_standby(coordinators: list[Coordinator]) -> tuple[Coordinator, Coordinator, int]:
    """(the active coordinator, the standby, the epoch)."""
    with AdminClient([c.address for c in coordinators], request_timeout_s=2.0, retry_total_s=0) as probe:
        states = {c.address: probe.coordinator_info(c.address) for c in coordinators}
    active = next(c for c in coordinators if states[c.address].active)
    return active, next(c for c in coordinators if c is not active), states[active.address].epoch


def failover_phase(coordinators: list[Coordinator], known_lease: str, held: int,
                    s: BenchSettings) -> dict[str, Any]:
    active, standby, old_epoch = active_and_standby(coordinators)
    before = bench_scale.lease_view(active.address)
    with AdminClient([standby.address], request_timeout_s=1.0, retry_total_s=0) as client:
        wall_kill = time.time()
        t_kill = time.perf_counter()
        active.kill()
        attempts = 0
        while True:
            attempts += 1
            try:
                client.describe_lease(known_lease)
                break
            except errors.KvLeaseError as exc:
                if time.perf_counter() - t_kill > 120:
                    raise errors.KvLeaseError(f"the standby did not serve within 120 s of the kill: {exc}") from None
                time.sleep(0.01)
        failover_s = time.perf_counter() - t_kill
        info = client.coordinator_info(standby.address)
    intact = bench_scale.compare(before, bench_scale.lease_view(standby.address))
    served = intact["after"]
    events = log_events(standby.log_path)
    target_s = s.session_timeout_ms / 1000.0 + FAILOVER_SLACK_S
    result = {
        "leases_held": held, "leases_served_after": served, "failover_s": round(failover_s, 3),
        "target_s": target_s, "met": failover_s <= target_s, "epoch_before": old_epoch, "epoch_after": info.epoch,
        "probes": attempts, "session_timeout_s": s.session_timeout_ms / 1000.0, "leases": intact,
    }
    if "elected" in events:
        result["kill_to_elected_s"] = round(events["elected"] - wall_kill, 3)
    if "elected" in events and "active" in events:
        result["reinit_s"] = round(events["active"] - events["elected"], 3)
    if "stats" in events:
        result["reinit_stats"] = str(events["stats"])
    return result


def leasable_table(addresses: list[str], remote: Path, buckets: int, config: cfg.Config | None) -> int:
    """Create the table and commit snapshot 1 of every bucket (as ``config``'s principal); the table id."""
    with AdminClient(addresses, config, request_timeout_s=5.0, retry_total_s=30.0) as client:
        wait_for_active(client, 60.0)
        table = client.create_table("bench.leases", [Column("id", "BIGINT")], ["id"], buckets)
        storage = open_storage(remote.as_uri())
        for b in range(buckets):  # a commit is accepted only with its manifest in place
            manifest = Manifest(TableBucket(table.table_id, b), 1, 0, (), 0)
            storage.put(manifest.path, manifest.to_bytes())
            client.commit_kv_snapshot(manifest.to_handle())
    return table.table_id


def with_cpu(pids: dict[str, list[int]], phase) -> dict[str, Any]:
    """``phase()``'s figures with ``cpu_ms_per_acquire``: each role's processes' CPU over the phase, per acquire."""
    before = {role: sum(map(cpu_seconds, ps)) for role, ps in pids.items()}
    figures = phase()
    figures["cpu_ms_per_acquire"] = {
        role: round((sum(map(cpu_seconds, ps)) - before[role]) * 1000 / max(1, figures["acquires"]), 3)
        for role, ps in pids.items()}
    return figures


def idle_phase(coordinators: list[Coordinator], held: int, s: BenchSettings) -> dict[str, Any]:
    """Phase d at the lease count now held: the active coordinator's loop CPU per second, no request."""
    active, _standby, _epoch = active_and_standby(coordinators)
    return bench_scale.idle_loop_cpu(active.metrics_port, lambda: bench_scale.threads_cpu_s(active.popen.pid), held,
                                     s.idle_seconds)


def seed(config_path: Path, table_id: int, buckets: int, count: int, prefix: str, expiration_time: int) -> int:
    """``python -m kvlease.ops.bench.seed`` (a process of its own, so this benchmark's process never loads the lease store)."""
    cmd = [sys.executable, "-m", "kvlease.ops.bench.seed", "--config", str(config_path), "--table-id", str(table_id),
           "--buckets", str(buckets), "--count", str(count), "--prefix", prefix,
           "--expiration-time", str(expiration_time)]
    proc = subprocess.run(dying_with_parent(cmd), capture_output=True, text=True, timeout=3600,
                          env=child_env(isolated=True))
    if proc.returncode != 0:
        raise errors.KvLeaseError(f"seeding leases failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return int(proc.stdout.split()[-1])


def fill_phase(coordinators: list[Coordinator], values: dict[str, Any], table_id: int, held: int,
                s: BenchSettings, progress: Progress) -> dict[str, Any]:
    """Up to ``--leases``: seed the rest with both coordinators stopped, start them, wait for the mirror."""
    missing = s.held_leases - held
    progress(f"c. seeding {missing} leases (coordinators stopped)")
    for c in coordinators:  # both at once: the standby must not take over (and reinitialize) meanwhile
        if c.popen.poll() is None:
            c.popen.terminate()
    for c in coordinators:
        c.stop()
    t0 = time.perf_counter()
    seeded = seed(coordinators[0].home / "config.toml", table_id, s.buckets, missing, "f",
                   int(time.time() * 1000) + HOUR_MS)
    seed_s = time.perf_counter() - t0
    progress(f"c. starting both coordinators with {held + seeded} leases")
    offsets = [c.log_size() for c in coordinators]
    t0 = time.perf_counter()
    for i, c in enumerate(coordinators):
        coordinators[i] = Coordinator(c.home, c.values)
    with AdminClient([c.address for c in coordinators], request_timeout_s=5.0, retry_total_s=30.0) as client:
        wait_for_active(client, 300.0)
    cold_start_s = time.perf_counter() - t0
    active, standby, _epoch = active_and_standby(coordinators)
    progress("c. waiting for the standby's lease mirror and the active's orphan-file listing")
    mirror_s = bench_scale.wait_mirror_loaded(standby.log_path, offsets[coordinators.index(standby)],
                                              held + seeded, 900.0)
    bench_scale.wait_orphans_listed(active.log_path, offsets[coordinators.index(active)], 900.0)
    return {"seeded": seeded, "seed_s": round(seed_s, 3), "cold_start_s": round(cold_start_s, 3),
            "mirror_loaded_s": round(cold_start_s + mirror_s, 3)}
