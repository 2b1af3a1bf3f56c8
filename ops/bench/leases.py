"""``kvlease bench leases`` (or ``python -m ops.bench.leases``): what leases cost.

One run starts its own ZooKeeper (``ops.local_cluster.zookeeper``, in a temp dir) and two
coordinator processes (``file://`` remote storage in the temp dir, fsync on as
in the default config) and measures:

a. lease acquire throughput and p50/p99 latency: ``--threads`` client
   threads (64) sharing one ``AdminClient`` (acquires made at once travel
   together: ``client.coalescing``), each acquiring its own new lease ids
   (one bucket of a committed snapshot each) for ``--seconds`` (8) or until
   two thirds of the ``--leases`` (30,000) beyond the idle anchor's exist;
   then, reported and not judged, a': the same threads with a client each
   (no shared calls) for half as long or the last third. Why 64: the
   anchor keeps 1,000 creates in flight, so it is ZooKeeper's capacity,
   and the acquire rate is measured the same way, with many in flight.
   With few, the rate is their number over one acquire's latency (two
   fsyncs in turn: the lease file's, then ZooKeeper's log) however little
   the coordinator works; with more, the loop's batches grow and each
   acquire costs less (on 2 cores: 16 callers ~1,600 /s at p50 ~9 ms, 64
   ~2,900-3,800 /s at ~16-20 ms, 128 ~4,500 /s at ~26 ms). ``--threads
   16`` measures the latency-bound case;
b. raw pipelined ZooKeeper writes/s on the same server (``--raw-writes``
   kazoo ``create_async`` (20,000), then as many ``set_async``, with a window,
   in a separate process), once through kazoo's stock handler and once
   through the coordinator's ``common.zk.PollHandler``; the anchor is the
   faster of the two, and the ratio acquire/raw creates (target >= 0.5);
c. failover: with ``--leases`` leases held, ``kill -9`` the active
   coordinator and time the first request the standby serves
   (``describe_lease`` of a known lease), against session timeout + 2 s
   (target <=). The standby's log gives the split: ZooKeeper session expiry,
   then reinitialization. Then every lease must be intact: the new active
   lists exactly the leases (deadlines, buckets) the old one listed.
   If phase a stopped short of ``--leases``, the rest are written straight
   into their persisted layout (:mod:`ops.bench.seed`; acquiring 100,000
   through the coordinator takes minutes) with both coordinators stopped,
   then both are started again (the active loads them all: "cold start"),
   and the standby's lease mirror is waited for;
d. idle loop CPU (:mod:`ops.bench.scale`): with 1,000 leases held (before
   phase a) and with ``--leases`` (before the failover), the active
   coordinator's event-loop CPU per second over ``--idle-seconds`` with no
   request; target: the same within noise (at most 1.5 x + 1 ms/s).

Everything it starts is stopped in ``finally`` (and dies with it on kill -9).
The suite interface (``OPTIONS``, ``run``, ``target_rows``, ``report``) is
:mod:`ops.bench.suite`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from common import config as cfg
from common import errors
from common.tables import Column
from client.admin import AdminClient, wait_for_active
from common.kvsnapshot import Manifest
from common.model import TableBucket
from common.storage import open_storage
import ops.bench.scale as bench_scale
import ops.bench.suite as bench_suite
from ops.bench.suite import Option, Row, at_least, cpu_seconds, positive_float, positive_int
from ops.local_cluster import free_ports, log_tail
from ops.local_cluster import ZooKeeperCluster, dying_with_parent

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ZK_ROOT = "/kvlease-bench"
HOUR_MS = 3_600_000
TARGET_RATIO = 0.5  # acquires/s over raw ZooKeeper creates/s, at least
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


OPTIONS = (
    Option("--leases", at_least(2 * bench_scale.IDLE_BASE_LEASES, f"the idle anchor holds "
                                 f"{bench_scale.IDLE_BASE_LEASES:,} leases and the acquire phase needs as many more"),
           BenchSettings.held_leases,
           "leases held at the failover; the acquire phase also stops at this count"),
    Option("--seconds", positive_float, BenchSettings.seconds, "the acquire phase runs at most this long",
           metavar="S"),
    Option("--threads", positive_int, BenchSettings.threads, "client threads acquiring leases"),
    Option("--raw-writes", positive_int, BenchSettings.raw_writes,
           "pipelined ZooKeeper creates (then sets) timed for the anchor"),
    Option("--idle-seconds", positive_float, BenchSettings.idle_seconds,
           "idle loop CPU is sampled this long, at 1,000 leases and at --leases", metavar="S"),
    Option("--secure", bool, False, "instead: acquires/s with TLS + password + ACL checks on vs off, one "
           "coordinator each, in the same run (target secure >= 0.8 of plain)"),
)
SECURE_TARGET = 0.8  # secure acquires/s over plain, at least


# -- processes ---------------------------------------------------------------------------------------


class _Coordinator:
    def __init__(self, home: Path, values: dict[str, Any]) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.values = values
        self.address = f"127.0.0.1:{values[cfg.COORDINATOR_PORT.name]}"
        self.metrics_port = values.get(cfg.METRICS_PORT.name, -1)
        self.log_path = home / "coordinator.log"
        config_path = home / "config.toml"
        cfg.write_file(config_path, values)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEASE_") or k == "KVLEASE_TEST_SESSION"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                dying_with_parent([sys.executable, "-m", "coordinator", "--config", str(config_path)]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=str(home), env=env)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM: it closes its ZooKeeper session (no wait for its expiry); kill -9 after 30 s."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def cpu_s(self) -> float:
        return cpu_seconds(self.popen.pid)

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0


def _percentile_ms(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return round(sorted_values[index] * 1000, 2)


# -- a. acquire ---------------------------------------------------------------------------------------


def _acquire_many(addresses: list[str], table_id: int, buckets: int, threads: int, prefix: str,
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

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    try:
        for t in pool:
            t.start()
        start_gate.wait()
        for t in pool:
            t.join()
    finally:
        if shared is not None:
            shared.close()
    elapsed = time.perf_counter() - clock["start"]
    lat = sorted(x for per in latencies for x in per)
    return {
        "clients": "shared" if shared_client else "one per thread", "acquires": len(lat), "errors": len(failures),
        "first_errors": failures[:5], "seconds": round(elapsed, 3),
        "per_s": round(len(lat) / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": _percentile_ms(lat, 0.50), "p99_ms": _percentile_ms(lat, 0.99),
        "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
    }


# -- b. raw ZooKeeper ----------------------------------------------------------------------------------


def raw_zk_writes(connect: str, count: int, window: int, session_timeout_s: float) -> dict[str, dict[str, float]]:
    """Pipelined creates, then sets, of ``count`` small nodes (run in its own process), once
    through kazoo's stock handler and once through :class:`common.zk.PollHandler` (the
    coordinator's): per handler ``{"create": per_s, "set": per_s}``."""
    from kazoo.client import KazooClient

    from common.zk import PollHandler

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


def _raw_phase(connect: str, s: BenchSettings) -> dict[str, Any]:
    """:func:`raw_zk_writes` in a process of its own (its own GIL), through ``--raw-zk``."""
    cmd = [sys.executable, "-m", "ops.bench.leases", "--raw-zk", connect, str(s.raw_writes), str(s.raw_window),
           str(s.session_timeout_ms)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(dying_with_parent(cmd), capture_output=True, text=True, timeout=600, env=env)
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


def _log_events(log_path: Path) -> dict[str, float]:
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


def _active(coordinators: list[_Coordinator]) -> tuple[_Coordinator, _Coordinator, int]:
    """(the active coordinator, the standby, the epoch)."""
    with AdminClient([c.address for c in coordinators], request_timeout_s=2.0, retry_total_s=0) as probe:
        states = {c.address: probe.coordinator_info(c.address) for c in coordinators}
    active = next(c for c in coordinators if states[c.address].active)
    return active, next(c for c in coordinators if c is not active), states[active.address].epoch


def _failover_phase(coordinators: list[_Coordinator], known_lease: str, held: int,
                    s: BenchSettings) -> dict[str, Any]:
    active, standby, old_epoch = _active(coordinators)
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
    events = _log_events(standby.log_path)
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


# -- the run -------------------------------------------------------------------------------------------------


def run(*, leases: int, seconds: float, threads: int, raw_writes: int, secure: bool = False,
        idle_seconds: float = BenchSettings.idle_seconds,
        progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    settings = BenchSettings(held_leases=leases, seconds=seconds, threads=threads, raw_writes=raw_writes,
                             idle_seconds=idle_seconds)
    return measure_secure(settings, progress) if secure else measure(settings, progress)


def _leasable_table(addresses: list[str], remote: Path, buckets: int, config: cfg.Config | None) -> int:
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


def measure_secure(s: BenchSettings, progress: bench_suite.Progress) -> dict[str, Any]:
    """Phase a twice on one ZooKeeper: a plain coordinator, then a secure one (TLS, user ``bench`` with a
    password and a READ grant, not a super user); each on its own chroot and remote directory."""
    from common.security.acl import Operation, Resource
    from ops.bench.secure import secure_setup

    with tempfile.TemporaryDirectory(prefix="kvlease-bench-") as tmp:
        base = Path(tmp)
        zk = None
        results: dict[str, Any] = {}
        try:
            progress("starting ZooKeeper")
            zk = ZooKeeperCluster.start(str(base / "zookeeper"), 1)
            for mode in ("plain", "secure"):
                remote = base / f"remote-{mode}"
                remote.mkdir()
                values = {
                    cfg.ZK_ADDRESS.name: zk.connect_string, cfg.ZK_ROOT.name: f"{ZK_ROOT}-{mode}",
                    cfg.ZK_SESSION_TIMEOUT.name: f"{s.session_timeout_ms}ms", cfg.REMOTE_DATA_DIR.name: remote.as_uri(),
                    cfg.REMOTE_FSYNC.name: s.fsync, cfg.METRICS_PORT.name: -1, cfg.COORDINATOR_HOST.name: "127.0.0.1",
                }
                client_config = setup_config = None
                if mode == "secure":
                    setup = secure_setup(base / "secure", values, [(Operation.READ, Resource.table("bench.leases"))])
                    values.update(setup.server)
                    client_config, setup_config = setup.client, setup.setup_client
                progress(f"{mode}: starting a coordinator")
                coordinator = _Coordinator(base / f"coordinator-{mode}",
                                           {**values, cfg.COORDINATOR_PORT.name: free_ports(1)[0],
                                            cfg.COORDINATOR_ID.name: "1"})
                try:
                    table_id = _leasable_table([coordinator.address], remote, s.buckets, setup_config)
                    progress(f"{mode}: acquiring leases: {s.threads} threads, {s.seconds:g} s or {s.held_leases}")
                    results[mode] = _acquire_many([coordinator.address], table_id, s.buckets, s.threads, mode,
                                                  s.seconds, s.held_leases, client_config)
                except BaseException:
                    sys.stderr.write(f"--- {coordinator.log_path} ---\n{log_tail(coordinator.log_path, 40)}\n")
                    raise
                finally:
                    coordinator.kill()
        finally:
            if zk is not None:
                zk.stop()
    plain, secure = results["plain"]["per_s"], results["secure"]["per_s"]
    ratio = secure / plain if plain else 0.0
    return {"settings": asdict(s), "secure": True, "plain": results["plain"], "secured": results["secure"],
            "secure_to_plain": {"ratio": round(ratio, 3), "target": SECURE_TARGET, "met": ratio >= SECURE_TARGET},
            "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}


def measure(s: BenchSettings, progress: bench_suite.Progress) -> dict[str, Any]:
    """Run the measurements with settings ``s``; returns the figures."""
    t_run = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvlease-bench-") as tmp:
        base = Path(tmp)
        remote = base / "remote"
        remote.mkdir()
        zk = None
        coordinators: list[_Coordinator] = []
        try:
            progress("starting ZooKeeper")
            zk = ZooKeeperCluster.start(str(base / "zookeeper"), 1)
            values = {
                cfg.ZK_ADDRESS.name: zk.connect_string, cfg.ZK_ROOT.name: ZK_ROOT,
                cfg.ZK_SESSION_TIMEOUT.name: f"{s.session_timeout_ms}ms", cfg.REMOTE_DATA_DIR.name: remote.as_uri(),
                cfg.REMOTE_FSYNC.name: s.fsync, cfg.COORDINATOR_HOST.name: "127.0.0.1",
            }
            progress("starting 2 coordinators")
            ports = free_ports(4)
            for i in range(2):  # a gRPC port and a metrics port (phase d reads the loop's CPU there) each
                coordinators.append(_Coordinator(base / f"coordinator-{i + 1}",
                                                 {**values, cfg.COORDINATOR_PORT.name: ports[2 * i],
                                                  cfg.METRICS_PORT.name: ports[2 * i + 1],
                                                  cfg.COORDINATOR_ID.name: str(i + 1)}))
            addresses = [c.address for c in coordinators]
            table_id = _leasable_table(addresses, remote, s.buckets, None)
            base_leases = min(bench_scale.IDLE_BASE_LEASES, s.held_leases)
            progress(f"d. idle loop CPU with {base_leases} leases")
            setup = _acquire_many(addresses, table_id, s.buckets, s.threads, "i", None, base_leases)
            idle_base = _idle_phase(coordinators, setup["acquires"], s)
            progress(f"a. acquiring leases: {s.threads} threads, {s.seconds:g} s or {s.held_leases} leases")
            pids = {"coordinator": [c.popen.pid for c in coordinators], "zookeeper": [zk.nodes[0].pid],
                    "client": [os.getpid()]}
            room = max(2, s.held_leases - setup["acquires"])
            acquire = _with_cpu(pids, lambda: _acquire_many(addresses, table_id, s.buckets, s.threads, "a",
                                                            s.seconds, room - room // 3))
            progress(f"a'. the same with a client per thread: {s.seconds / 2:g} s or {room // 3} leases")
            own = _with_cpu(pids, lambda: _acquire_many(addresses, table_id, s.buckets, s.threads, "o",
                                                        s.seconds / 2, room // 3, shared_client=False))
            progress(f"b. raw ZooKeeper writes: {s.raw_writes} pipelined, window {s.raw_window}")
            raw = _raw_phase(zk.connect_string, s)
            held = setup["acquires"] + acquire["acquires"] + own["acquires"]
            fill = None
            if s.held_leases > held:
                fill = _fill_phase(coordinators, values, table_id, held, s, progress)
                held += fill["seeded"]
            progress(f"d. idle loop CPU with {held} leases")
            idle_held = _idle_phase(coordinators, held, s)
            progress(f"c. failover with {held} leases held")
            failover = _failover_phase(coordinators, "i-0-0", held, s)
        except BaseException:
            for c in coordinators:
                sys.stderr.write(f"--- {c.log_path} ---\n{log_tail(c.log_path, 40)}\n")
            raise
        finally:
            for c in coordinators:
                c.kill()
            if zk is not None:
                zk.stop()
    ratio = acquire["per_s"] / raw["create_per_s"] if raw["create_per_s"] else 0.0
    limit = bench_scale.idle_limit_ms(idle_base["loop_cpu_ms_per_s"])
    return {
        "settings": asdict(s),
        "acquire": acquire,
        "acquire_client_per_thread": {**own, "to_raw": round(own["per_s"] / raw["create_per_s"], 3)
                                      if raw["create_per_s"] else 0.0},
        "fill": fill,
        "raw_zookeeper": raw,
        "acquire_to_raw": {"ratio": round(ratio, 3), "target": TARGET_RATIO, "met": ratio >= TARGET_RATIO},
        "idle": {"base": idle_base, "held": idle_held, "limit_ms_per_s": round(limit, 3),
                 "met": idle_held["loop_cpu_ms_per_s"] <= limit},
        "failover": failover,
        "run_s": round(time.perf_counter() - t_run, 1),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }


def _with_cpu(pids: dict[str, list[int]], phase) -> dict[str, Any]:
    """``phase()``'s figures with ``cpu_ms_per_acquire``: each role's processes' CPU over the phase, per acquire."""
    before = {role: sum(map(cpu_seconds, ps)) for role, ps in pids.items()}
    figures = phase()
    figures["cpu_ms_per_acquire"] = {
        role: round((sum(map(cpu_seconds, ps)) - before[role]) * 1000 / max(1, figures["acquires"]), 3)
        for role, ps in pids.items()}
    return figures


def _idle_phase(coordinators: list[_Coordinator], held: int, s: BenchSettings) -> dict[str, Any]:
    """Phase d at the lease count now held: the active coordinator's loop CPU per second, no request."""
    active, _standby, _epoch = _active(coordinators)
    return bench_scale.idle_loop_cpu(active.metrics_port, lambda: bench_scale.threads_cpu_s(active.popen.pid), held,
                                     s.idle_seconds)


def _seed(config_path: Path, table_id: int, buckets: int, count: int, prefix: str, expiration_time: int) -> int:
    """``python -m ops.bench.seed`` (a process of its own, so this benchmark's process never loads the lease store)."""
    cmd = [sys.executable, "-m", "ops.bench.seed", "--config", str(config_path), "--table-id", str(table_id),
           "--buckets", str(buckets), "--count", str(count), "--prefix", prefix,
           "--expiration-time", str(expiration_time)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEASE_") or k == "KVLEASE_TEST_SESSION"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(dying_with_parent(cmd), capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        raise errors.KvLeaseError(f"seeding leases failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return int(proc.stdout.split()[-1])


def _fill_phase(coordinators: list[_Coordinator], values: dict[str, Any], table_id: int, held: int,
                s: BenchSettings, progress: bench_suite.Progress) -> dict[str, Any]:
    """Up to ``--leases``: seed the rest with both coordinators stopped, start them, wait for the mirror."""
    missing = s.held_leases - held
    progress(f"c. seeding {missing} leases (coordinators stopped)")
    for c in coordinators:  # both at once: the standby must not take over (and reinitialize) meanwhile
        if c.popen.poll() is None:
            c.popen.terminate()
    for c in coordinators:
        c.stop()
    t0 = time.perf_counter()
    seeded = _seed(coordinators[0].home / "config.toml", table_id, s.buckets, missing, "f",
                   int(time.time() * 1000) + HOUR_MS)
    seed_s = time.perf_counter() - t0
    progress(f"c. starting both coordinators with {held + seeded} leases")
    offsets = [c.log_size() for c in coordinators]
    t0 = time.perf_counter()
    for i, c in enumerate(coordinators):
        coordinators[i] = _Coordinator(c.home, c.values)
    with AdminClient([c.address for c in coordinators], request_timeout_s=5.0, retry_total_s=30.0) as client:
        wait_for_active(client, 300.0)
    cold_start_s = time.perf_counter() - t0
    active, standby, _epoch = _active(coordinators)
    progress("c. waiting for the standby's lease mirror and the active's orphan-file listing")
    mirror_s = bench_scale.wait_mirror_loaded(standby.log_path, offsets[coordinators.index(standby)],
                                              held + seeded, 900.0)
    bench_scale.wait_orphans_listed(active.log_path, offsets[coordinators.index(active)], 900.0)
    return {"seeded": seeded, "seed_s": round(seed_s, 3), "cold_start_s": round(cold_start_s, 3),
            "mirror_loaded_s": round(cold_start_s + mirror_s, 3)}


def _secure_report(figures: dict[str, Any]) -> str:
    s, ratio = figures["settings"], figures["secure_to_plain"]
    lines = [f"kvlease bench leases --secure ({figures['host']['cpus']} CPUs; one coordinator each; "
             f"{s['threads']} threads; TLS + password + ACL checks vs none)"]
    for label, key in (("plain ", "plain"), ("secure", "secured")):
        a = figures[key]
        lines.append(f"{label}  acquire {a['per_s']:>9.1f} /s   p50 {a['p50_ms']} ms   p99 {a['p99_ms']} ms   "
                     f"({a['acquires']} leases in {a['seconds']:.1f} s, {a['errors']} errors)")
        if a["errors"]:
            lines.append(f"        errors (first): {a['first_errors']}")
    lines.append(f"secure/plain    {ratio['ratio']:>6.3f}      target >= {ratio['target']}: "
                 f"{'met' if ratio['met'] else 'NOT met'}")
    return "\n".join(lines)


def report(figures: dict[str, Any]) -> str:
    if figures.get("secure"):
        return _secure_report(figures)
    a, r, f, s = figures["acquire"], figures["raw_zookeeper"], figures["failover"], figures["settings"]
    ratio = figures["acquire_to_raw"]
    lines = [
        f"kvlease bench leases ({figures['host']['cpus']} CPUs; file:// remote, fsync {'on' if s['fsync'] else 'off'};"
        f" ZooKeeper session timeout {s['session_timeout_ms'] / 1000:g} s; 2 coordinator processes)",
        f"a. acquire        {a['per_s']:>9.1f} /s   p50 {a['p50_ms']} ms   p99 {a['p99_ms']} ms   "
        f"({a['acquires']} new leases by {s['threads']} threads sharing a client in {a['seconds']:.1f} s, "
        f"{a['errors']} errors)",
        f"b. raw ZooKeeper  {r['create_per_s']:>9.1f} creates/s   {r['set_per_s']:.1f} sets/s   "
        f"({r['writes']} pipelined, window {r['window']}; the faster of kazoo's stock handler "
        f"{r['by_handler']['stock']['create']:.1f} and PollHandler {r['by_handler']['poll']['create']:.1f} creates/s)",
        f"   acquire/raw    {ratio['ratio']:>9.3f}      target >= {ratio['target']}: "
        f"{'met' if ratio['met'] else 'NOT met'}",
        f"c. failover       {f['failover_s']:>9.3f} s    target <= {f['target_s']:g} s (session timeout + 2 s): "
        f"{'met' if f['met'] else 'NOT met'}",
        f"   {f['leases_held']} leases held, {f['leases_served_after']} served after; epoch "
        f"{f['epoch_before']} -> {f['epoch_after']}"
        + (f"; kill -> elected {f['kill_to_elected_s']:.3f} s" if "kill_to_elected_s" in f else "")
        + (f", reinitialization {f['reinit_s']:.3f} s" if "reinit_s" in f else ""),
    ]
    leases = f.get("leases")
    if leases:
        lines.append(f"   leases after the failover: {'intact' if leases['intact'] else 'NOT intact'} "
                     f"({leases['after']} of {leases['before']}; missing {leases['missing']}, extra {leases['extra']}, "
                     f"changed {leases['changed']})")
    fill = figures.get("fill")
    if fill and "seeded" in fill:  # (a run before seeding acquired the rest instead)
        lines.append(f"   setup: {fill['seeded']} leases seeded in {fill['seed_s']:.1f} s; cold start (both "
                     f"coordinators, the active loads every lease) {fill['cold_start_s']:.1f} s; standby's mirror "
                     f"loaded after {fill['mirror_loaded_s']:.1f} s")
    idle = figures.get("idle")
    if idle:
        b, h = idle["base"], idle["held"]
        lines.append(f"d. idle loop CPU   {h['loop_cpu_ms_per_s']:.3f} ms/s at {h['leases']} leases vs "
                     f"{b['loop_cpu_ms_per_s']:.3f} ms/s at {b['leases']}   target <= {idle['limit_ms_per_s']:.3f} "
                     f"(1.5 x + 1 ms/s): {'met' if idle['met'] else 'NOT met'}")
        lines.append(f"   whole coordinator process: {h['process_cpu_ms_per_s']:.3f} vs "
                     f"{b['process_cpu_ms_per_s']:.3f} ms/s (sampled {h['seconds']:.1f} s each)")
    if "run_s" in figures:
        lines.append(f"   run: {figures['run_s']:.0f} s end to end")
    cpu = a.get("cpu_ms_per_acquire", {})
    if cpu:
        lines.insert(2, "   CPU per acquire: " + ", ".join(f"{role} {ms:.2f} ms" for role, ms in cpu.items()))
    own = figures.get("acquire_client_per_thread")
    if own:
        lines.insert(3, f"a'. a client per thread {own['per_s']:.1f} /s   p50 {own['p50_ms']} ms   (acquire/raw "
                        f"{own['to_raw']:.3f}, not judged; CPU per acquire: "
                        + ", ".join(f"{role} {ms:.2f} ms" for role, ms in own.get("cpu_ms_per_acquire", {}).items())
                        + f"; {own['acquires']} leases, {own['errors']} errors)")
    if a["errors"]:
        lines.append(f"   acquire errors (first): {a['first_errors']}")
    return "\n".join(lines)


def target_rows(figures: dict[str, Any]) -> list[Row]:
    if figures.get("secure"):
        return [Row.ratio("secure / plain lease acquires", figures["secured"]["per_s"], figures["plain"]["per_s"],
                          "/s", SECURE_TARGET)]
    f = figures["failover"]
    rows = [
        Row.ratio("acquire / raw ZooKeeper creates", figures["acquire"]["per_s"],
                  figures["raw_zookeeper"]["create_per_s"], "/s", TARGET_RATIO),
        Row.limit(f"failover, {f['leases_held']:,} leases held", f["failover_s"],
                  f["session_timeout_s"], "s", f["session_timeout_s"] + FAILOVER_SLACK_S),
    ]
    if "leases" in f:
        leases = f["leases"]
        rows.append(Row.limit("leases lost or changed by the failover",
                              leases["missing"] + leases["extra"] + leases["changed"], leases["before"], "leases", 0))
    idle = figures.get("idle")
    if idle:
        b, h = idle["base"], idle["held"]
        rows.append(Row.limit(f"idle loop CPU, {h['leases']:,} vs {b['leases']:,} leases", h["loop_cpu_ms_per_s"],
                              b["loop_cpu_ms_per_s"], "ms/s", idle["limit_ms_per_s"]))
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--raw-zk"]:  # phase b's child process: --raw-zk CONNECT COUNT WINDOW SESSION_MS
        connect, count, window, session_ms = sys.argv[2:6]
        print(json.dumps(raw_zk_writes(connect, int(count), int(window), int(session_ms) / 1000.0)))
        sys.exit(0)
    bench_suite.module_main("leases")
