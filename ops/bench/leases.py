"""``kvlease bench leases`` (or ``python -m kvlease.ops.bench.leases``): what leases cost.

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
   into their persisted layout (:mod:`kvlease.ops.bench.seed`; acquiring 100,000
   through the coordinator takes minutes) with both coordinators stopped,
   then both are started again (the active loads them all: "cold start"),
   and the standby's lease mirror is waited for;
d. idle loop CPU (:mod:`kvlease.ops.bench.scale`): with 1,000 leases held (before
   phase a) and with ``--leases`` (before the failover), the active
   coordinator's event-loop CPU per second over ``--idle-seconds`` with no
   request; target: the same within noise (at most 1.5 x + 1 ms/s).

Everything it starts is stopped in ``finally`` (and dies with it on kill -9).
The suite interface (``OPTIONS``, ``run``, ``target_rows``, ``report``) is
:mod:`kvlease.ops.bench.suite`'s.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvlease.common import config as cfg
import kvlease.ops.bench.scale as bench_scale
import kvlease.ops.bench.suite as bench_suite
from kvlease.ops.bench.suite import Option, at_least, positive_float, positive_int
from kvlease.ops.bench.lease_phases import (SECURE_TARGET, TARGET_RATIO, BenchSettings, Coordinator, acquire_many,
                                            failover_phase, fill_phase, idle_phase, leasable_table, raw_phase,
                                            raw_zk_writes, with_cpu)
from kvlease.ops.bench.lease_report import report, target_rows

__all__ = ["OPTIONS", "BenchSettings", "raw_phase", "report", "run", "target_rows"]  # what the suite and the tests use
from kvlease.ops.local_cluster import ZooKeeperCluster, free_ports, log_tail

ZK_ROOT = "/kvlease-bench"


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


# -- the run -------------------------------------------------------------------------------------------------


def run(*, leases: int, seconds: float, threads: int, raw_writes: int, secure: bool = False,
        idle_seconds: float = BenchSettings.idle_seconds,
        progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    settings = BenchSettings(held_leases=leases, seconds=seconds, threads=threads, raw_writes=raw_writes,
                             idle_seconds=idle_seconds)
    return measure_secure(settings, progress) if secure else measure(settings, progress)


def measure_secure(s: BenchSettings, progress: bench_suite.Progress) -> dict[str, Any]:
    """Phase a twice on one ZooKeeper: a plain coordinator, then a secure one (TLS, user ``bench`` with a
    password and a READ grant, not a super user); each on its own chroot and remote directory."""
    from kvlease.common.security.acl import Operation, Resource
    from kvlease.ops.bench.secure import secure_setup

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
                coordinator = Coordinator(base / f"coordinator-{mode}",
                                           {**values, cfg.COORDINATOR_PORT.name: free_ports(1)[0],
                                            cfg.COORDINATOR_ID.name: "1"})
                try:
                    table_id = leasable_table([coordinator.address], remote, s.buckets, setup_config)
                    progress(f"{mode}: acquiring leases: {s.threads} threads, {s.seconds:g} s or {s.held_leases}")
                    results[mode] = acquire_many([coordinator.address], table_id, s.buckets, s.threads, mode,
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
        coordinators: list[Coordinator] = []
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
                coordinators.append(Coordinator(base / f"coordinator-{i + 1}",
                                                 {**values, cfg.COORDINATOR_PORT.name: ports[2 * i],
                                                  cfg.METRICS_PORT.name: ports[2 * i + 1],
                                                  cfg.COORDINATOR_ID.name: str(i + 1)}))
            addresses = [c.address for c in coordinators]
            table_id = leasable_table(addresses, remote, s.buckets, None)
            base_leases = min(bench_scale.IDLE_BASE_LEASES, s.held_leases)
            progress(f"d. idle loop CPU with {base_leases} leases")
            setup = acquire_many(addresses, table_id, s.buckets, s.threads, "i", None, base_leases)
            idle_base = idle_phase(coordinators, setup["acquires"], s)
            progress(f"a. acquiring leases: {s.threads} threads, {s.seconds:g} s or {s.held_leases} leases")
            pids = {"coordinator": [c.popen.pid for c in coordinators], "zookeeper": [zk.nodes[0].pid],
                    "client": [os.getpid()]}
            room = max(2, s.held_leases - setup["acquires"])
            acquire = with_cpu(pids, lambda: acquire_many(addresses, table_id, s.buckets, s.threads, "a",
                                                            s.seconds, room - room // 3))
            progress(f"a'. the same with a client per thread: {s.seconds / 2:g} s or {room // 3} leases")
            own = with_cpu(pids, lambda: acquire_many(addresses, table_id, s.buckets, s.threads, "o",
                                                        s.seconds / 2, room // 3, shared_client=False))
            progress(f"b. raw ZooKeeper writes: {s.raw_writes} pipelined, window {s.raw_window}")
            raw = raw_phase(zk.connect_string, s)
            held = setup["acquires"] + acquire["acquires"] + own["acquires"]
            fill = None
            if s.held_leases > held:
                fill = fill_phase(coordinators, values, table_id, held, s, progress)
                held += fill["seeded"]
            progress(f"d. idle loop CPU with {held} leases")
            idle_held = idle_phase(coordinators, held, s)
            progress(f"c. failover with {held} leases held")
            failover = failover_phase(coordinators, "i-0-0", held, s)
        except BaseException:
            for c in coordinators:
                sys.stderr.write(f"--- {c.log_path} ---\n{log_tail(c.log_path, 40)}\n")
            raise
        finally:
            for c in coordinators:
                c.kill()
            if zk is not None:
                zk.stop()
    return _figures(s, acquire, own, fill, raw, (idle_base, idle_held), failover, time.perf_counter() - t_run)


def _figures(s: BenchSettings, acquire: dict[str, Any], own: dict[str, Any], fill: dict[str, Any] | None,
             raw: dict[str, Any], idle: tuple[dict[str, Any], dict[str, Any]], failover: dict[str, Any],
             run_s: float) -> dict[str, Any]:
    """The figures of :func:`measure` from those of its phases."""
    idle_base, idle_held = idle
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
        "run_s": round(run_s, 1),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--raw-zk"]:  # phase b's child process: --raw-zk CONNECT COUNT WINDOW SESSION_MS
        connect, count, window, session_ms = sys.argv[2:6]
        print(json.dumps(raw_zk_writes(connect, int(count), int(window), int(session_ms) / 1000.0)))
        sys.exit(0)
    bench_suite.module_main("leases")
