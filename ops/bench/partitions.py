"""``kvlease bench partitions`` (or ``python -m kvlease.ops.bench.partitions``): a cluster with many partitions.

Starts its own local cluster (ZooKeeper, two coordinators, ``--tablets`` (3)
tablet servers; ``file://`` remote storage, fsync on, session timeout 6 s,
``auto-partition.check-interval`` 1 s; processes in a temp directory, stopped
at the end whatever happens) and measures in one run:

1. the one-table cluster: a table partitioned by ``day`` with one partition
   of ``--buckets`` (4) buckets, replication factor 2, snapshot 1 of each
   bucket committed; the active coordinator's idle event-loop CPU
   (``kvlease_coordinator_loop_cpu_seconds_total`` per second over
   ``--idle-seconds``, no request, once the tablet servers settled);
2. ``--partitions`` (1,000) partitions of a second table made one after
   another (each create tells every tablet server that holds a replica of it
   its whole bucket list): the time, each create's latency as the count grows
   and the CPU of the coordinators, tablet servers and ZooKeeper (reported,
   not judged); then snapshot 1 of every one of their buckets committed;
3. the idle loop CPU again, now with the 1,000-partition table: target at
   most 2 x the one-table cluster's;
4. from here on a thread commits snapshot handles of the big table's buckets
   at ``--commit-rate`` (20) per second, round robin, as tablet servers
   would after their uploads (a manifest on remote storage, then
   ``CommitKvSnapshot``; no rows are written, no files uploaded):
   ``lease acquire --latest`` (``acquire_latest_lease``: one acquire of the
   latest snapshot of each of its buckets, chosen by the coordinator) of the big table and of the
   one-partition table, ``--rounds`` (9) times alternating, a new lease each
   time: target median big / median one at most 10;
5. coordinator failover: ``kill -9`` of the active coordinator with those
   leases held, until the standby serves ``describe_lease``: target at most
   the session timeout + 2 s; the leases the new active lists must be those
   the old one listed (ids, deadlines, buckets): 0 lost or changed;
6. retention: an HOUR auto-partitioned table (precreate 0) with
   ``--expiring`` (100) partitions of the past hours made by hand (its
   retention, 110 hours, keeps them), then its retention lowered to 0
   (``alter_table``: the coordinator checks an altered table at once, as its
   next timed check would): they are all expired together; the time from
   the alter until none is listed, target at most 30 s.

The suite interface (``OPTIONS``, ``run``, ``target_rows``, ``report``) is
:mod:`kvlease.ops.bench.suite`'s.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any

from kvlease.client.admin import AdminClient
from kvlease.common.tables import DEFAULT_MAX_PARTITIONS, MAX_PARTITIONS
import kvlease.ops.bench.partition_phases as phases
import kvlease.ops.bench.suite as bench_suite
from kvlease.ops.bench.partition_phases import BIG, ONE, Settings
from kvlease.ops.bench.partition_report import report, target_rows
from kvlease.ops.bench.suite import Option, at_least, at_most, positive_float, positive_int
from kvlease.ops import local_cluster

__all__ = ["OPTIONS", "Settings", "report", "run", "target_rows"]


OPTIONS = (
    Option("--partitions", at_most(MAX_PARTITIONS, "a table's most partitions (table.partition.max)"),
           Settings.partitions, "partitions of the big table"),
    Option("--buckets", positive_int, Settings.buckets, "buckets of each partition (replication factor 2)"),
    Option("--tablets", at_least(2, "replication factor 2 needs two tablet servers"), Settings.tablets,
           "tablet servers"),
    Option("--commit-rate", positive_float, Settings.commit_rate,
           "snapshot handles committed per second while the leases, the failover and retention are measured",
           metavar="R"),
    Option("--idle-seconds", positive_float, Settings.idle_seconds,
           "idle loop CPU is sampled this long, with one table and with the big one", metavar="S"),
    Option("--rounds", positive_int, Settings.rounds, "lease acquire --latest of each table, alternating"),
    Option("--expiring", at_most(MAX_PARTITIONS - phases.RETENTION_ROOM - 1,
                                 "one table's partitions, with room for its retention"),
           Settings.expiring, "partitions retention drops at once"),
)


def run(*, partitions: int, buckets: int, tablets: int, commit_rate: float, idle_seconds: float, rounds: int,
        expiring: int, progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    s = Settings(partitions=partitions, buckets=buckets, tablets=tablets, commit_rate=commit_rate,
                 idle_seconds=idle_seconds, rounds=rounds, expiring=expiring)
    t0 = time.perf_counter()
    base = tempfile.mkdtemp(prefix="kvlease-bench-partitions-")
    directory = f"{base}/cluster"
    try:
        with local_cluster.running(directory, coordinators=2, tablets=s.tablets, config_overrides=s.overrides(),
                                   ready_timeout_s=120.0, progress=progress):
            try:
                figures = measure(directory, s, progress)
            except BaseException:
                for entry in local_cluster.load(directory)["coordinators"]:
                    sys.stderr.write(f"--- {entry['log']} ---\n{local_cluster.log_tail(entry['log'], 40)}\n")
                raise
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures["run_s"] = round(time.perf_counter() - t0, 1)
    return figures


def measure(directory: str, s: Settings, progress: bench_suite.Progress) -> dict[str, Any]:
    """Phases 1-6 of the module docstring on the running cluster in ``directory``."""
    doc = local_cluster.load(directory)
    addresses, remote, pids = local_cluster.bootstrap(directory), doc["remote"], phases.role_pids(doc)
    with AdminClient(addresses, request_timeout_s=120.0, retry_total_s=120.0) as admin:
        one_id = phases.create_partitioned(admin, ONE, s)
        one = phases.create_partitions(admin, ONE, ["p0"], pids, lambda text: None)
        phases.commit_all(addresses, remote, phases.buckets_of(one_id, one["ids"].values(), s.buckets))
        progress(f"1. idle loop CPU with one table ({s.buckets} buckets), {s.idle_seconds:g} s")
        idle_one = phases.idle_loop(directory, s.idle_seconds, 0)
        big_id = phases.create_partitioned(admin, BIG, s, max_partitions=max(DEFAULT_MAX_PARTITIONS, s.partitions))
        progress(f"2. creating {s.partitions:,} partitions x {s.buckets} buckets x RF {s.replication_factor} "
                 f"on {s.tablets} tablet servers")
        isr0 = phases.isr_changes(directory)
        created = phases.create_partitions(admin, BIG, phases.partition_names(s.partitions), pids, progress)
        big_buckets = phases.buckets_of(big_id, created.pop("ids").values(), s.buckets)
        created["settled_after_s"] = round(phases.settle(directory), 1)
        created["isr_changes"] = phases.isr_changes(directory) - isr0
        progress(f"2. committing snapshot 1 of {len(big_buckets):,} buckets")
        initial = phases.commit_all(addresses, remote, big_buckets)
        progress(f"3. idle loop CPU with {s.partitions:,} partitions, {s.idle_seconds:g} s")
        idle_big = phases.idle_loop(directory, s.idle_seconds, 0)
        with phases.Committer(addresses, remote, big_buckets, s.commit_rate) as committer:
            progress(f"4. lease acquire --latest, {s.rounds} rounds of each table (committing "
                     f"{s.commit_rate:g} snapshots/s)")
            latest = phases.lease_rounds(directory, admin, {"one": one_id, "big": big_id}, s.rounds)
            progress("5. kill -9 of the active coordinator")
            failover = phases.failover(directory, "latest-big-0", s)
            progress(f"6. retention dropping {s.expiring} partitions at once")
            retention = phases.retention(directory, admin, s, pids, progress)
    return {"settings": asdict(s), "bucket_replicas": s.partitions * s.buckets * s.replication_factor,
            "create": created, "initial_commits": initial, "idle": {"one_table": idle_one, "big": idle_big},
            "lease_latest": latest, "failover": failover, "retention": retention, "committer": committer.figures(),
            "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}


if __name__ == "__main__":
    bench_suite.module_main("partitions")
