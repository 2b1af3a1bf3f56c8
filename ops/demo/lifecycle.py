"""``kvlease demo``: a local cluster, a live table with replication factor 2, a Spark bootstrap-then-tail query
into Parquet, a ``kill -9`` of the active coordinator during the bootstrap and one of a bucket leader's tablet
server while the query tails; then a check that the Parquet change rows give the table, and a partitioned table
(orders by day: written, its partitions listed, one read; :mod:`kvlease.ops.demo.partitioned`).

:func:`run_demo` starts an embedded cluster in a directory (1 ZooKeeper node,
2 coordinators, 2 tablet servers, ``file://`` remote storage, default
settings) and a local SparkSession, runs :func:`kvlease.ops.streaming.run_failover`
with :data:`DEMO_PLAN` (the writer, the query, both failovers, the killed
tablet server started again, the checks) and returns a summary
(:func:`render` prints it). Whatever happens (a failure, Ctrl-C) it stops
the query, Spark and every process of the cluster, and removes the directory
if it made it (unless the run failed: then its logs and output stay), unless
``keep``: then the cluster stays up (the killed coordinator started again,
as a standby) and :func:`keep_hint` says how to use it.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from kvlease.common import errors
from kvlease.ops import local_cluster
from kvlease.ops import streaming
from kvlease.ops.check import MAX_SHOWN
import kvlease.ops.demo.partitioned as partitioned_table

DEFAULT_ROWS = 100_000
MIN_ROWS = 1_000
ZK_NODES, COORDINATORS, TABLETS = 1, 2, 2
#: The demo's scenario: the table on RF 2 (one in-sync replica is enough to write), and the leader of bucket 0
#: killed after writer round 23 of 30 (the last 10 rounds are tailed), then started again.
DEMO_PLAN = streaming.Plan(replication_factor=2, min_insync_replicas=1, kill_tablet_after_round=23)

Progress = Callable[[str], None]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the demo; ``message`` says what was cleaned up."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def run_demo(directory: str | None = None, *, rows: int = DEFAULT_ROWS, keep: bool = False, spark=None,
             progress: Progress = lambda text: None, config_overrides: Mapping[str, Any] | None = None,
             plan: streaming.Plan | None = None) -> dict[str, Any]:
    """Run the demo; returns the summary (``ok`` says PASS). ``directory``: where everything lives (must be
    empty or new; kept afterwards); default a fresh temp dir, removed at the end unless ``keep`` or the run
    did not pass (then its logs and output stay for a look). ``spark``: a SparkSession to use (left
    running) instead of starting one. ``config_overrides`` go into every server's config and ``plan``
    replaces the scenario's parameters, ``rows`` included (tests shorten the run with them)."""
    started = time.monotonic()
    if rows < MIN_ROWS:
        raise errors.InvalidRequestError(f"--rows must be at least {MIN_ROWS:,}, got {rows:,}")
    base, made = _work_dir(directory)
    cluster_dir = base / "cluster"
    plan = plan or dataclasses.replace(DEMO_PLAN, rows=rows)
    own_spark = spark is None
    outcome = None
    interrupted = False
    abort = threading.Event()
    try:
        progress(f"starting a local cluster in {cluster_dir}: {ZK_NODES} ZooKeeper node, {COORDINATORS} "
                 f"coordinators, {TABLETS} tablet servers, remote storage file://{cluster_dir / 'remote'}")
        local_cluster.start(cluster_dir, zk_nodes=ZK_NODES, coordinators=COORDINATORS, tablets=TABLETS,
                            config_overrides=config_overrides, progress=lambda text: progress(f"  {text}"))
        if own_spark:
            from kvlease.ops.streaming import local_session

            progress(f"starting Spark (local[*]; its log: {base / 'spark.log'})")
            spark = local_session(base / "spark", app="kvlease-demo", log_file=base / "spark.log")
        with _plain_interrupts():
            outcome = streaming.run_failover(str(cluster_dir), spark, base, plan, progress=progress, abort=abort)
            partitioned, check = partitioned_table.show_partitioned(str(cluster_dir), progress)
            outcome.checks.append(check)
        kept = keep or not made or not outcome.ok
        return summary(outcome, base if kept else None, time.monotonic() - started, keep, partitioned)
    except KeyboardInterrupt:
        interrupted = True
        if keep:
            done = f"stopped the query and Spark; the cluster keeps running (kvlease cluster stop --dir {cluster_dir})"
        else:
            done = f"stopped every process it started{'; removed ' + str(base) if made else ''}"
        raise Interrupted(done) from None
    finally:
        abort.set()
        passed = outcome is not None and outcome.ok
        with _no_interrupts():
            _clean_up(base, cluster_dir, spark if own_spark else None, keep, outcome, progress,
                      remove=made and not keep and (passed or interrupted))


def _work_dir(directory: str | None) -> tuple[Path, bool]:
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="kvlease-demo-")), True
    base = Path(directory).resolve()
    if base.exists() and (not base.is_dir() or any(base.iterdir())):
        raise errors.InvalidRequestError(f"--dir {directory}: not an empty directory (the demo needs a new or "
                                         "empty one)")
    base.mkdir(parents=True, exist_ok=True)
    return base, False


def _clean_up(base: Path, cluster_dir: Path, spark, keep: bool, outcome, progress: Progress, remove: bool) -> None:
    """Stop Spark (``spark``: one the demo started) and the cluster (unless ``keep``), remove ``base`` if
    ``remove``; never raises."""
    if spark is not None:
        from kvlease.ops.streaming import stop_local_session

        try:
            stop_local_session(spark, log_file=base / "spark.log")
        except Exception as exc:  # the JVM may be gone already (Ctrl-C)
            progress(f"stopping Spark: {exc}")
    has_cluster = local_cluster.cluster_file(cluster_dir).exists()
    killed = outcome.failover.get("killed") if outcome is not None else None
    try:
        if has_cluster and keep and killed is not None:
            progress(f"--keep: starting coordinator {killed} again (as a standby)")
            local_cluster.restart(cluster_dir, "coordinators", killed)
        elif has_cluster and not keep:
            progress("stopping the cluster")
            local_cluster.stop(cluster_dir)
    except errors.KvLeaseError as exc:
        progress(f"{'restarting the coordinator' if keep else 'stopping the cluster'}: {exc.message}")
    if remove:
        shutil.rmtree(base, ignore_errors=True)
    elif not keep:
        progress(f"kept {base} (the servers' and Spark's logs, the Parquet output); remove it when done")


@contextmanager
def _sigint(handler) -> Iterator[None]:
    """SIGINT goes to ``handler`` while inside (only in the main thread, where Python runs handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _no_interrupts():
    """Ctrl-C is ignored while inside: cleaning up must not be cut short."""
    return _sigint(signal.SIG_IGN)


def _plain_interrupts():
    """Ctrl-C raises KeyboardInterrupt, nothing else: PySpark's own handler cancels the jobs through py4j from
    inside the signal handler, which collides with the py4j call the main thread is in (tracebacks on the
    terminal); the demo stops the query and Spark itself."""
    return _sigint(signal.default_int_handler)


# -- the summary -----------------------------------------------------------------------------------------


def summary(outcome: streaming.Outcome, directory: Path | None, seconds: float, kept: bool,
            partitioned: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The demo's one JSON document (``partitioned``: what :func:`show_partitioned` saw)."""
    failover = outcome.failover
    return {
        "ok": outcome.ok,
        "result": "PASS" if outcome.ok else "FAIL",
        "seconds": round(seconds, 1),
        "directory": str(directory) if directory else None,
        "kept": kept,
        "table": outcome.plan.table,
        "lease_id": outcome.lease_id,
        **{name: _round(value) for name, value in outcome.figures.items() if name != "failover_s"},
        "failover": {"killed_coordinator": failover.get("killed"), "killed_pid": failover.get("killed_pid"),
                     "active_coordinator": failover.get("active"), "seconds": _round(failover.get("seconds"))},
        "replication_factor": outcome.plan.replication_factor,
        "tablet_failover": _tablet_failover(outcome.tablet_failover),
        "partitioned": dict(partitioned) if partitioned else None,
        "checks": [{**check.as_dict(), "violations": list(check.violations[:MAX_SHOWN])}
                   for check in outcome.checks],
    }


def _tablet_failover(t: Mapping[str, Any]) -> dict[str, Any] | None:
    if not t:
        return None
    return {"killed_tablet": t.get("killed"), "killed_pid": t.get("killed_pid"), "buckets": t.get("buckets"),
            "new_leaders": {str(b): leader for b, leader in t.get("new_leaders", {}).items()},
            "seconds": _round(t.get("seconds")), "restarted": bool(t.get("restarted")),
            "in_sync_after_restart_s": _round(t.get("in_sync_s"))}


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def render(doc: Mapping[str, Any]) -> str:
    """The summary as text: figures, then every check (with its first differences when it failed)."""
    f = doc["failover"]
    lines = [
        f"kvlease demo: {doc['result']} ({doc['seconds']:.0f}s)",
        f"  table {doc['table']}: {doc['rows_loaded']:,} rows loaded and snapshotted, then "
        f"{doc['changes_written']:,} inserts/updates/deletes while the query ran ({doc['table_rows']:,} rows now)",
        f"  Spark query -> Parquet: {doc['bootstrap_rows']:,} bootstrap rows + {doc['change_rows']:,} change rows "
        f"in {doc['micro_batches']} micro-batches",
        f"  lease {doc['lease_id']}: {doc['snapshots_leased']} snapshots leased, {doc['snapshots_released']} "
        f"released after the bootstrap committed (renewals seen: {doc['lease_renewals_seen']})",
        (f"  failover: coordinator {f['killed_coordinator']} killed with -9, coordinator "
         f"{f['active_coordinator']} serving after {f['seconds']:.1f}s" if f.get("seconds") is not None
         else "  failover: none happened"),
        *_render_tablet_failover(doc),
        *_render_partitioned(doc),
    ]
    for check in doc["checks"]:
        lines.append(f"  [{'ok' if check['ok'] else 'FAIL'}] {check['name']} ({check['checked']:,} checked)")
        lines += [f"      - {v}" for v in check["violations"]]
    return "\n".join(lines)


def _render_tablet_failover(doc: Mapping[str, Any]) -> list[str]:
    t = doc.get("tablet_failover")
    if not t:
        return []
    if t.get("seconds") is None:
        return [f"  tablet failover (replication factor {doc['replication_factor']}): tablet server "
                f"{t.get('killed_tablet')} killed with -9, its buckets not served again"]
    buckets = ", ".join(str(b) for b in t["buckets"])
    leaders = ", ".join(sorted({str(v) for v in t["new_leaders"].values()}))
    longest = doc.get("writer_longest_round_s")
    writer = f"; the writer went on (longest round {longest:.1f}s)" if longest is not None else ""
    back = (f"; tablet server {t['killed_tablet']} started again, every ISR full after "
            f"{t['in_sync_after_restart_s']:.1f}s" if t.get("in_sync_after_restart_s") is not None
            else f"; tablet server {t['killed_tablet']} not back in sync")
    return [f"  tablet failover (replication factor {doc['replication_factor']}): tablet server "
            f"{t['killed_tablet']} (leader of bucket(s) {buckets}) killed with -9 mid-stream, tablet server "
            f"{leaders} serving them after {t['seconds']:.1f}s{writer}{back}"]


def _render_partitioned(doc: Mapping[str, Any]) -> list[str]:
    p = doc.get("partitioned")
    if not p:
        return []
    names = ", ".join(f"{q['name']} (id {q['id']})" for q in p["partitions"])
    return [f"  partitioned table {p['table']} (by day): partitions {names}; partition {p['read_partition']} "
            f"read: {p['rows_read']:,} rows"]


def keep_hint(doc: Mapping[str, Any]) -> str:
    """How to use the cluster ``--keep`` left running."""
    base = Path(doc["directory"])
    cluster = base / "cluster"
    return "\n".join([
        f"the cluster is still running in {cluster} (the Parquet output is in {base / 'output'}):",
        f"  kvlease cluster status --dir {cluster}",
        f"  kvlease --cluster {cluster} scan {doc['table']} --limit 10",
        f"  kvlease --cluster {cluster} snapshot list {doc['table']}",
        f"  kvlease cluster stop --dir {cluster}     # when done (then remove {base})",
    ])
