"""``kvlease drill spark-failover --cluster DIR [--json]``: a Spark bootstrap-then-tail query while the active
coordinator is killed; the query's output must equal the table.

Runs :func:`kvlease.ops.streaming.run_failover` (the scenario ``kvlease demo`` shows)
against a running local cluster with at least two coordinators and one
tablet server, on a table of its own (``drill.spark_failover_<random>``,
dropped at the end) and a local SparkSession (started and stopped here
unless one is passed in). Every coordinator that ran before and was killed
is started again afterwards, so the cluster keeps its shape. Checks: those
of the scenario (:mod:`kvlease.ops.streaming.feed_check`, the lease), plus that the killed
coordinator is back. Figures: rows, change rows, micro-batches, snapshots
leased and released, the failover time.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.ops import local_cluster
from kvlease.ops import streaming
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.cluster import DrillCluster, require

NAME = "spark-failover"
OPTIONS: tuple[str, ...] = ()  # a fixed scenario: one kill (kvlease drill refuses --rounds etc.)
DEFAULT_ROWS = 20_000
#: A shorter writer than the demo's: the drill is a check, not a show.
PLAN = streaming.Plan(rows=DEFAULT_ROWS, rounds=16, round_interval_s=0.3, snapshot_every=4,
                            kill_after_round=4, tail_rounds=6)


def check_shape(doc: dict) -> None:
    """ClusterShapeError unless the cluster has 2 coordinators and a tablet server (``drill all`` skips it)."""
    require(doc, NAME, coordinators=2, tablets=1)


def main(cluster_dir: str, json_output: bool = False, *, rows: int = DEFAULT_ROWS, spark=None) -> int:
    """Run the drill; returns the exit code of :func:`kvlease.ops.drills.finish`. ``spark``: a SparkSession to use
    (left running)."""
    running = _running_coordinators(cluster_dir)
    work = Path(tempfile.mkdtemp(prefix="kvlease-drill-spark-failover-"))
    plan = streaming.Plan(**{**PLAN.__dict__, "rows": rows,
                                   "table": f"drill.spark_failover_{uuid.uuid4().hex[:8]}"})
    own_spark = spark is None
    report = Report(NAME)
    try:
        if own_spark:
            from kvlease.ops.streaming import local_session

            _progress(f"starting Spark (local[*]; its log: {work / 'spark.log'})")
            spark = local_session(work / "spark", app="kvlease-drill-spark-failover", log_file=work / "spark.log")
        outcome = streaming.run_failover(cluster_dir, spark, work, plan, progress=_progress)
        report.checks.extend(outcome.checks)
        report.figures.update(outcome.figures)
        report.figures["killed_coordinator"] = outcome.failover.get("killed")
        report.figures["active_coordinator"] = outcome.failover.get("active")
    finally:
        if own_spark and spark is not None:
            from kvlease.ops.streaming import stop_local_session

            stop_local_session(spark)
        restarted = _restart(cluster_dir, running)
        _drop(cluster_dir, plan.table)
        shutil.rmtree(work, ignore_errors=True)
    report.add(Check.of("every coordinator killed was started again and serves", restarted, len(running)))
    report.add(_whole_again(cluster_dir))
    return finish(report, json_output)


def _whole_again(cluster_dir: str) -> Check:
    """The last check of every drill: every process runs and every bucket is served."""
    try:
        with DrillCluster(cluster_dir, NAME) as cluster:
            return cluster.whole_again()
    except errors.KvLeaseError as exc:  # a process down: the cluster is not whole
        return Check.of("the cluster is whole again (every process runs, every bucket served)", [exc.message], 1)


def _progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _running_coordinators(cluster_dir: str) -> list[str]:
    """The ids of the running coordinators; a ClusterError unless the drill can run on this cluster."""
    doc = local_cluster.load(cluster_dir)
    coordinators = [c["id"] for c in doc.get("coordinators", [])
                    if local_cluster.pid_alive(c["pid"], c.get("proc_start"))]
    tablets = [t["id"] for t in doc.get("tablets", []) if local_cluster.pid_alive(t["pid"], t.get("proc_start"))]
    if len(coordinators) < 2 or not tablets:
        raise local_cluster.ClusterError(
            f"the {NAME} drill needs at least 2 running coordinators (one to kill, one to take over) and 1 "
            f"running tablet server; the cluster in {cluster_dir} has {len(coordinators)} coordinator(s) and "
            f"{len(tablets)} tablet server(s) running (e.g. kvlease cluster start --dir D --coordinators 2 "
            "--tablets 1)")
    return coordinators


def _restart(cluster_dir: str, ids: list[str]) -> list[str]:
    """Start again every coordinator of ``ids`` that no longer runs; returns what went wrong."""
    problems = []
    doc = local_cluster.load(cluster_dir)
    for entry in doc.get("coordinators", []):
        if entry["id"] in ids and not local_cluster.pid_alive(entry["pid"], entry.get("proc_start")):
            _progress(f"starting coordinator {entry['id']} again")
            try:
                local_cluster.restart(cluster_dir, "coordinators", entry["id"])
            except errors.KvLeaseError as exc:
                problems.append(f"coordinator {entry['id']}: {exc.message}")
    return problems


def _drop(cluster_dir: str, table: str) -> None:
    try:
        with AdminClient(local_cluster.bootstrap(cluster_dir), retry_total_s=30) as admin:
            admin.drop_table(table, ignore_if_not_exists=True)
    except errors.KvLeaseError as exc:
        _progress(f"could not drop {table}: {exc.message}")
