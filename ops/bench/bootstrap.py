"""``kvlease bench bootstrap`` (or ``python -m kvlease.ops.bench.bootstrap``): Spark reading kvlease vs Parquet, in one run.

Starts its own local cluster (ZooKeeper, one coordinator, two tablet servers,
``file://`` remote storage; stopped at the end whatever happens) and a
4-bucket table ``(id BIGINT primary key, v STRING of 100 hex digits)`` with
``--rows`` rows (default 1,000,000), snapshots it, then updates 5% of the
rows (a changelog tail the hybrid splits merge on top). Then, in one local
Spark session (``local[*]``):

- ``kvlease``: a batch read of the table into Spark's ``noop`` sink;
- ``parquet``: the same rows (the table's state, written once with pyarrow)
  read from a local Parquet file into ``noop``;

each warmed up once, then timed 3 times; the medians give rows/s and the
ratio (target >= 0.4). Then the streaming tail: a query bootstraps
(``Trigger.AvailableNow``), the table gets N/2 updates (N changelog records:
before- and after-images), and a second AvailableNow run of the same query
reads them through ``foreachBatch`` into ``noop``: changes/s, query start
included.

The suite interface (``OPTIONS``, ``run``, ``target_rows``, ``report``) is
:mod:`kvlease.ops.bench.suite`'s.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvlease.common.tables import Column
import kvlease.ops.bench.suite as bench_suite
from kvlease.ops import local_cluster
from kvlease.ops.bench.suite import Option, Row, positive_int
from kvlease.ops.bench.writes import make_batch

TABLE = "bench.bootstrap"
COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]
BUCKETS = 4
TARGET_RATIO = 0.4
LOAD_BATCH = 50_000

OPTIONS = (
    Option("--rows", positive_int, 1_000_000, "rows in the table (and in the Parquet file); N/2 updates for the "
                                              "streaming tail"),
)


def _median_seconds(action, runs: int = 3) -> float:
    action()  # warm
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        action()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _load(client, ids: np.ndarray, salt: int) -> None:
    for start in range(0, len(ids), LOAD_BATCH):
        client.upsert(make_batch(ids[start:start + LOAD_BATCH], salt=salt))


def run(*, rows: int, seed: int = 11, progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    from kvlease.client.admin import AdminClient
    from kvlease.client.table import TableClient
    from kvlease.ops.streaming import local_session, stop_local_session

    rng = np.random.default_rng(seed)
    base = tempfile.mkdtemp(prefix="kvlease-bench-bootstrap-")
    directory = f"{base}/cluster"
    with contextlib.ExitStack() as stack:  # on leaving: Spark stopped, then the cluster, then base removed
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        stack.enter_context(local_cluster.running(directory, tablets=2,
                                                  config_overrides={"kv.snapshot.interval": "1h"}, progress=progress))
        bootstrap = ",".join(local_cluster.bootstrap(directory))
        with AdminClient(local_cluster.bootstrap(directory), retry_total_s=30) as admin:
            admin.create_table(TABLE, COLUMNS, ["id"], BUCKETS)
            with TableClient(admin, TABLE) as client:
                progress(f"loading {rows:,} rows, snapshot, updating 5% of them, writing the Parquet copy")
                _load(client, np.arange(rows), salt=0)
                client.trigger_snapshot(wait=True)
                updated = np.sort(rng.choice(rows, max(1, rows // 20), replace=False))
                _load(client, updated, salt=1)
                state = pa.Table.from_batches([make_batch(np.arange(rows), salt=0)])
                fresh = make_batch(updated, salt=1)
                keep = ~np.isin(np.arange(rows), updated)
                state = pa.concat_tables([state.filter(pa.array(keep)), pa.Table.from_batches([fresh])])
                parquet = f"{base}/state.parquet"
                pq.write_table(state, parquet)

                progress("starting Spark; batch reads of kvlease and Parquet, warm-up + 3 each")
                spark = local_session(f"{base}/spark", app="kvlease-bench-bootstrap")
                stack.callback(stop_local_session, spark)
                source = spark.read.format("kvlease").option("bootstrap", bootstrap).option("table", TABLE)
                counted = source.load().count()
                if counted != rows:
                    raise RuntimeError(f"the kvlease read returned {counted} rows, expected {rows}")
                kv_s = _median_seconds(lambda: source.load().write.format("noop").mode("overwrite").save())
                pq_s = _median_seconds(lambda: spark.read.parquet(parquet).write.format("noop")
                                       .mode("overwrite").save())
                progress("streaming: bootstrap, then the changelog tail")
                tail = _tail_rate(spark, client, bootstrap, rows, f"{base}/checkpoint")
        return {"rows": rows, "buckets": BUCKETS, "updated_after_snapshot": int(len(updated)),
                "kvlease_s": kv_s, "parquet_s": pq_s, "kvlease_rows_per_s": rows / kv_s,
                "parquet_rows_per_s": rows / pq_s, "ratio": pq_s / kv_s, "target_ratio": TARGET_RATIO,
                **tail}


def _tail_rate(spark, client, bootstrap: str, rows: int, checkpoint: str) -> dict[str, Any]:
    """Bootstrap a streaming query, then time reading N changelog records in a second run."""

    def noop(df, batch_id):
        df.write.format("noop").mode("overwrite").save()

    def run_query() -> None:
        query = (spark.readStream.format("kvlease").option("bootstrap", bootstrap).option("table", TABLE).load()
                 .writeStream.foreachBatch(noop).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"streaming query failed: {query.exception()}")

    run_query()  # the bootstrap
    updates = max(1, rows // 2)
    _load(client, np.arange(updates), salt=2)
    t0 = time.perf_counter()
    run_query()
    seconds = time.perf_counter() - t0
    return {"tail_changes": 2 * updates, "tail_s": seconds, "tail_changes_per_s": 2 * updates / seconds}


def report(result: dict[str, Any]) -> str:
    met = "met" if result["ratio"] >= result["target_ratio"] else "NOT met"
    return "\n".join([
        f"batch read of {result['rows']:,} rows in {result['buckets']} buckets "
        f"({result['updated_after_snapshot']:,} updated after the snapshot), median of 3, warm:",
        f"  kvlease -> noop  {result['kvlease_s']:.2f} s  {result['kvlease_rows_per_s']:,.0f} rows/s",
        f"  parquet -> noop  {result['parquet_s']:.2f} s  {result['parquet_rows_per_s']:,.0f} rows/s",
        f"  ratio {result['ratio']:.2f} (target >= {result['target_ratio']}: {met})",
        f"streaming tail: {result['tail_changes']:,} changes in {result['tail_s']:.2f} s = "
        f"{result['tail_changes_per_s']:,.0f} changes/s (foreachBatch into noop, query start included)",
    ])


def target_rows(figures: dict[str, Any]) -> list[Row]:
    return [Row.ratio("Spark read, kvlease / Parquet", figures["kvlease_rows_per_s"], figures["parquet_rows_per_s"],
                      "rows/s", TARGET_RATIO)]


if __name__ == "__main__":
    bench_suite.module_main("bootstrap")
