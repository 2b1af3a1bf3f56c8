"""The phases of ``kvlease bench partitions`` (:mod:`kvlease.ops.bench.partitions`): its tables and partitions,
snapshot handles committed without a tablet server's upload, the steady committer, the idle loop, ``lease
acquire --latest``, the coordinator failover and retention dropping partitions at once."""

from __future__ import annotations

import re
import statistics
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from kvlease.client.admin import AdminClient
from kvlease.common import auto_partition, errors
from kvlease.common.kvsnapshot import Manifest
from kvlease.common.model import TableBucket
from kvlease.common.storage import RemoteStorage, open_storage
from kvlease.common.tables import Column, DEFAULT_MAX_PARTITIONS
import kvlease.ops.bench.scale as bench_scale
from kvlease.ops.bench.lease_phases import FAILOVER_SLACK_S, HOUR_MS, log_events, percentile_ms
from kvlease.ops.bench.machine import cpu_seconds, wait_idle
from kvlease.ops.bench.suite import Progress
from kvlease.ops import local_cluster

COLUMNS = [Column("day", "STRING"), Column("id", "BIGINT")]
BIG, ONE, EXPIRING = "bench.partitions", "bench.one_partition", "bench.expiring"
IDLE_TARGET = 2.0  # idle loop CPU with the big table, at most this x the one-table cluster's
LATEST_TARGET = 10.0  # lease acquire --latest on the big table, at most this x the one-partition table's
RETENTION_TARGET_S = 30.0  # retention dropping --expiring partitions at once, at most this long
RETENTION_ROOM = 10  # the expiring table keeps this many hours more than it has partitions, until altered
ROLES = ("coordinators", "tablets", "zookeeper")
COMMIT_ATTEMPTS = 5  # a commit whose answer was lost (timed out) is sent again, at most this often
# the coordinator writes the log ends the last commits moved at most every 10 s (FLUSH_MS of
# coordinator/log_ends.py): that write is the commits' tail, not idle work, so an idle sample starts after it
WRITES_TAIL_S = 11.0
COMMIT_TIMEOUT_S = 120.0  # a commit waits for its leader's log end (ListOffsets): slow on a server thrashing


@dataclass(frozen=True)
class Settings:
    partitions: int = 1_000
    buckets: int = 4
    tablets: int = 3
    replication_factor: int = 2
    commit_rate: float = 20.0  # snapshot handles committed per second in the background
    idle_seconds: float = 30.0  # kv.snapshot.interval and leader.imbalance.check-interval: each sample has one of each
    rounds: int = 9  # lease acquire --latest of each table, alternating; the median counts (the rounds wait behind
    # the committer's commits on the loop now and then: 9 keep the medians steady)
    expiring: int = 100  # partitions retention drops at once
    session_timeout_ms: int = 6_000  # the default zookeeper.session-timeout
    check_interval_ms: int = 1_000  # auto-partition.check-interval (default 10 min)

    def overrides(self) -> dict[str, Any]:
        """The config of every coordinator and tablet server."""
        return {"zookeeper.session-timeout": f"{self.session_timeout_ms}ms",
                "auto-partition.check-interval": f"{self.check_interval_ms}ms"}


def partition_names(count: int) -> list[str]:
    return [f"p{i:05d}" for i in range(count)]


def role_pids(doc: dict[str, Any]) -> dict[str, list[int]]:
    """The running cluster's processes by role (``bench``: this process, the client)."""
    import os

    pids = {role: [int(e["pid"]) for e in doc.get(role, [])] for role in ROLES}
    pids["bench"] = [os.getpid()]
    return pids


def cpu_by_role(pids: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(map(cpu_seconds, ps)) for role, ps in pids.items()}


def cpu_spent(before: dict[str, float], pids: dict[str, list[int]]) -> dict[str, float]:
    """Each role's CPU seconds since ``before`` (:func:`cpu_by_role`)."""
    now = cpu_by_role(pids)
    return {role: round(now[role] - before[role], 2) for role in now}


# -- tables and partitions ------------------------------------------------------------------------------


def create_partitioned(admin: AdminClient, path: str, s: Settings, **extra: Any) -> int:
    """A table ``(day STRING, id BIGINT)`` partitioned by ``day``; its id."""
    table = admin.create_table(path, COLUMNS, ["day", "id"], s.buckets, replication_factor=s.replication_factor,
                               partition_key=["day"], **extra)
    return table.table_id


def create_partitions(admin: AdminClient, path: str, names: list[str], pids: dict[str, list[int]],
                      progress: Progress) -> dict[str, Any]:
    """Create ``names`` one after another; the time, each create's latency over the run, each role's CPU."""
    cpu0, t0 = cpu_by_role(pids), time.perf_counter()
    latencies, ids = [], {}
    step = max(1, len(names) // 10)
    for i, name in enumerate(names):
        t = time.perf_counter()
        _table, partition = admin.create_partition(path, name)
        latencies.append(time.perf_counter() - t)
        ids[name] = partition.partition_id
        if (i + 1) % step == 0:
            progress(f"   {i + 1:,} of {len(names):,} partitions of {path} made "
                     f"({time.perf_counter() - t0:.1f} s; the last one took {latencies[-1] * 1000:.0f} ms)")
    elapsed = time.perf_counter() - t0
    cpu = cpu_spent(cpu0, pids)
    tenth = max(1, len(latencies) // 10)
    return {"partitions": len(names), "seconds": round(elapsed, 3),
            "per_s": round(len(names) / elapsed, 2) if elapsed else 0.0,
            "first_tenth_mean_ms": round(statistics.fmean(latencies[:tenth]) * 1000, 2),
            "last_tenth_mean_ms": round(statistics.fmean(latencies[-tenth:]) * 1000, 2),
            "p50_ms": percentile_ms(sorted(latencies), 0.5), "cpu_s": cpu,
            "cpu_ms_per_partition": {role: round(v * 1000 / len(names), 2) for role, v in cpu.items()},
            "ids": ids}


def buckets_of(table_id: int, partition_ids: Iterable[int], buckets: int) -> list[TableBucket]:
    return [TableBucket(table_id, b, pid) for pid in partition_ids for b in range(buckets)]


def commit_handle(admin: AdminClient, storage: RemoteStorage, tb: TableBucket, snapshot_id: int) -> None:
    """Commit snapshot ``snapshot_id`` of ``tb`` as a tablet server would after its upload, without the
    upload: its manifest (no files, log offset 0) written to remote storage, then the handle committed."""
    manifest = Manifest(tb, snapshot_id, 0, (), 0)
    storage.put(manifest.path, manifest.to_bytes())
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            admin.commit_kv_snapshot(manifest.to_handle())
            return
        except errors.OutcomeUnknownError:  # a commit of a stored handle again is answered as done
            if attempt == COMMIT_ATTEMPTS - 1:
                raise


def commit_all(addresses: list[str], remote: str, tbs: list[TableBucket], threads: int = 8) -> dict[str, Any]:
    """Snapshot 1 of every bucket of ``tbs``, from ``threads`` threads sharing a client; the first error
    (once every thread stopped) is raised."""
    storage = open_storage(remote)
    failures: list[BaseException] = []

    def commit(part: list[TableBucket]) -> None:
        try:
            for tb in part:
                if failures:
                    return
                commit_handle(admin, storage, tb, 1)
        except BaseException as exc:  # raised in the caller's thread below
            failures.append(exc)

    t0 = time.perf_counter()
    with AdminClient(addresses, request_timeout_s=COMMIT_TIMEOUT_S, retry_total_s=COMMIT_TIMEOUT_S) as admin:
        workers = [threading.Thread(target=commit, args=(tbs[i::threads],)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    if failures:
        raise failures[0]
    elapsed = time.perf_counter() - t0
    return {"snapshots": len(tbs), "seconds": round(elapsed, 3), "per_s": round(len(tbs) / elapsed, 1)}


class Committer:
    """A thread committing a new snapshot handle of the next bucket of ``tbs`` (round robin) ``rate``
    times a second, on a schedule (a late commit is not made up for by a burst); errors are counted."""

    def __init__(self, addresses: list[str], remote: str, tbs: list[TableBucket], rate: float) -> None:
        self.addresses, self.storage, self.tbs, self.rate = addresses, open_storage(remote), tbs, rate
        self.next_id = {tb: 2 for tb in tbs}
        self.commits, self.errors, self.first_errors = 0, 0, []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-committer", daemon=True)
        self.started = self.stopped = 0.0

    def __enter__(self) -> "Committer":
        self.started = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join()
        self.stopped = time.perf_counter()

    def _run(self) -> None:
        with AdminClient(self.addresses, request_timeout_s=10.0, retry_total_s=60.0) as admin:
            n, origin = 0, self.started
            while not self.stop_event.is_set():
                tb = self.tbs[n % len(self.tbs)]
                n += 1
                try:
                    commit_handle(admin, self.storage, tb, self.next_id[tb])
                    self.next_id[tb] += 1
                    self.commits += 1
                except errors.KvLeaseError as exc:
                    self.errors += 1
                    if len(self.first_errors) < 5:
                        self.first_errors.append(f"{type(exc).__name__}: {exc.message}")
                delay = origin + n / self.rate - time.perf_counter()
                if delay < 0:  # behind: the schedule starts again from now
                    origin -= delay
                self.stop_event.wait(max(0.0, delay))

    def figures(self) -> dict[str, Any]:
        elapsed = (self.stopped or time.perf_counter()) - self.started
        return {"rate_asked_per_s": self.rate, "commits": self.commits, "seconds": round(elapsed, 1),
                "per_s": round(self.commits / elapsed, 2) if elapsed > 0 else 0.0, "errors": self.errors,
                "first_errors": self.first_errors}


# -- the idle loop, lease acquire --latest -------------------------------------------------------------


def isr_changes(directory: str) -> int:
    """How many ISR changes the coordinators logged so far ("ISR of bucket …": a follower fell behind or caught
    up; each is a ZooKeeper write and a push of every bucket to the bucket's holders)."""
    count = 0
    for entry in local_cluster.load(directory)["coordinators"]:
        try:
            with open(entry["log"], "rb") as fh:
                count += sum(line.count(b"] ISR of bucket ") for line in fh)
        except OSError:
            continue
    return count


def settle(directory: str, timeout_s: float = 120.0) -> float:
    """Wait until the active coordinator is idle (the pushes of the last creates sent, the tablet servers'
    answers taken); the seconds waited. The tablet servers are not waited for: with thousands of buckets
    each keeps working in the background (followers' fetches, ISR and lease rounds), see :func:`idle_loop`."""
    return wait_idle(int(local_cluster.active_coordinator(directory)["pid"]), busy_below=0.05, timeout_s=timeout_s)


def idle_loop(directory: str, seconds: float, leases: int) -> dict[str, Any]:
    """The active coordinator's event-loop CPU per second with no client request, once it settled; the
    tablet servers' CPU per second meanwhile (their background work, and what they ask of the coordinator)."""
    time.sleep(WRITES_TAIL_S)
    settled = WRITES_TAIL_S + settle(directory)
    active = local_cluster.active_coordinator(directory)
    tablets = [int(t["pid"]) for t in local_cluster.load(directory)["tablets"]]
    port, pid = int(active["metrics_address"].rsplit(":", 1)[1]), int(active["pid"])
    cpu0, isr0, t0 = sum(map(cpu_seconds, tablets)), isr_changes(directory), time.perf_counter()
    # the whole process from /proc/PID/stat (10 ms ticks: fine over seconds), threads that ended meanwhile counted
    idle = bench_scale.idle_loop_cpu(port, lambda: cpu_seconds(pid), leases, seconds)
    tablets_ms = (sum(map(cpu_seconds, tablets)) - cpu0) * 1000 / (time.perf_counter() - t0) / len(tablets)
    return {**idle, "settled_after_s": round(settled, 1), "tablet_cpu_ms_per_s": round(tablets_ms, 1),
            "isr_changes": isr_changes(directory) - isr0, "tablets": tablet_buckets(directory)}


def tablet_buckets(directory: str) -> list[dict[str, Any]]:
    """What each tablet server says: the buckets it leads, those with open files and the most it keeps open
    (``tablet.buckets.max-open``; beyond it, buckets are closed and reopened on use)."""
    out = []
    for entry in local_cluster.load(directory)["tablets"]:
        try:
            health = local_cluster.read_health(entry["metrics_address"], timeout_s=10.0)
        except errors.KvLeaseError as exc:
            out.append({"error": exc.message})
            continue
        out.append({key: health.get(key) for key in ("buckets", "open_buckets", "max_open_buckets")})
    return out


def lease_latest(admin: AdminClient, table_id: int, lease_id: str) -> dict[str, float]:
    """``kvlease lease acquire LEASE --table TABLE --latest``: one acquire of every bucket's latest snapshot, the
    coordinator choosing them (``AdminClient.acquire_latest_lease``)."""
    t0 = time.perf_counter()
    result = admin.acquire_latest_lease(lease_id, table_id, HOUR_MS)
    return {"total_s": time.perf_counter() - t0, "buckets": len(result.acquired)}


def lease_rounds(directory: str, admin: AdminClient, tables: dict[str, int], rounds: int) -> dict[str, Any]:
    """``rounds`` times, alternating, :func:`lease_latest` of each of ``tables`` (label -> table id), a new
    lease each time (they stay held: the failover's leases); per table the medians (wall, and the CPU the
    active coordinator and this process spent) and every round."""
    coordinator = int(local_cluster.active_coordinator(directory)["pid"])
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in tables}
    for r in range(rounds):
        for label, table_id in tables.items():
            cpu0 = (cpu_seconds(coordinator), time.process_time())
            sample = lease_latest(admin, table_id, f"latest-{label}-{r}")
            sample["coordinator_cpu_s"] = cpu_seconds(coordinator) - cpu0[0]
            sample["client_cpu_s"] = time.process_time() - cpu0[1]
            runs[label].append(sample)
    out = {}
    for label, samples in runs.items():
        out[label] = {"buckets": samples[0]["buckets"],
                      "rounds_ms": [round(x["total_s"] * 1000, 2) for x in samples],
                      **{f"median_{key[:-2]}_ms": round(statistics.median(x[key] for x in samples) * 1000, 2)
                         for key in ("total_s", "coordinator_cpu_s", "client_cpu_s")}}
    return out


# -- failover ---------------------------------------------------------------------------------------------


def failover(directory: str, known_lease: str, s: Settings) -> dict[str, Any]:
    """``kill -9`` of the active coordinator; the time until the standby serves ``describe_lease``; the leases
    it lists against those the old one listed."""
    doc = local_cluster.load(directory)
    active = local_cluster.active_coordinator(directory)
    standby = next(c for c in doc["coordinators"] if c["id"] != active["id"])
    before = bench_scale.lease_view(active["address"])
    with AdminClient([standby["address"]], request_timeout_s=1.0, retry_total_s=0) as client:
        wall_kill, t_kill = time.time(), time.perf_counter()
        local_cluster.kill(directory, "coordinators", active["id"])
        probes = 0
        while True:
            probes += 1
            try:
                client.describe_lease(known_lease)
                break
            except errors.KvLeaseError as exc:
                if time.perf_counter() - t_kill > 180:
                    raise errors.KvLeaseError(f"the standby did not serve within 180 s of the kill: {exc}") from None
                time.sleep(0.01)
        failover_s = time.perf_counter() - t_kill
    leases = bench_scale.compare(before, bench_scale.lease_view(standby["address"]))
    events = log_events(Path(standby["log"]))
    session_s = s.session_timeout_ms / 1000
    result = {"failover_s": round(failover_s, 3), "session_timeout_s": session_s,
              "target_s": session_s + FAILOVER_SLACK_S, "probes": probes, "leases": leases,
              "lease_buckets": sum(len(buckets) for _deadline, buckets in before.values())}
    if "elected" in events:
        result["kill_to_elected_s"] = round(events["elected"] - wall_kill, 3)
        if "active" in events:
            result["reinit_s"] = round(events["active"] - events["elected"], 3)
    if "stats" in events:
        result["reinit_stats"] = str(events["stats"])
    return result


# -- retention ------------------------------------------------------------------------------------------


_DROPPED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*dropped partition \S+ of table (\S+) ",
                      re.MULTILINE)


def drop_times(log_path: str, table: str) -> list[float]:
    """Wall-clock times of the coordinator's "dropped partition … of table ``table``" lines."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return []
    return [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for stamp, path in _DROPPED.findall(text) if path == table]


def past_hours(count: int, now_ms: int) -> list[str]:
    """The HOUR partition values of the ``count`` hours before the current one (oldest first)."""
    unit = auto_partition.TimeUnit.HOUR
    return sorted(auto_partition.value_at(unit, "UTC", now_ms - k * HOUR_MS) for k in range(1, count + 1))


def retention(directory: str, admin: AdminClient, s: Settings, pids: dict[str, list[int]],
              progress: Progress) -> dict[str, Any]:
    """An HOUR-partitioned table with ``--expiring`` partitions of the past hours (kept: retention is longer);
    then its retention lowered to 0, so that the check of the altered table (at once, and every
    ``auto-partition.check-interval``) finds them all expired together: the time from the alter until none
    is listed."""
    kept = s.expiring + RETENTION_ROOM
    auto = auto_partition.AutoPartition(auto_partition.TimeUnit.HOUR, precreate=0, retention=kept)
    create_partitioned(admin, EXPIRING, s, auto_partition=auto, max_partitions=max(DEFAULT_MAX_PARTITIONS, kept + 1))
    progress(f"retention: {s.expiring} partitions of the past hours in {EXPIRING}")
    made = create_partitions(admin, EXPIRING, past_hours(s.expiring, int(time.time() * 1000)), pids, progress)
    made.pop("ids")
    cpu0 = cpu_by_role(pids)
    wall0, t0 = time.time(), time.perf_counter()
    admin.alter_table(EXPIRING, retention=0)
    progress(f"retention: lowered to 0; waiting until the {s.expiring} partitions are dropped")
    while admin.list_partitions(EXPIRING)[1]:
        if time.perf_counter() - t0 > 600:
            raise errors.KvLeaseError(f"retention did not drop the partitions of {EXPIRING} within 600 s")
        time.sleep(0.05)
    gone_s = time.perf_counter() - t0
    cpu = cpu_spent(cpu0, pids)
    active = local_cluster.active_coordinator(directory)
    times = [t for t in drop_times(active["log"], EXPIRING) if t >= wall0 - 1]
    result = {"partitions": s.expiring, "check_interval_s": s.check_interval_ms / 1000, "gone_s": round(gone_s, 3),
              "target_s": RETENTION_TARGET_S, "created": made, "cpu_s": cpu, "dropped_logged": len(times)}
    if times:
        result["alter_to_first_drop_s"] = round(min(times) - wall0, 3)
        result["first_to_last_drop_s"] = round(max(times) - min(times), 3)
    return result

