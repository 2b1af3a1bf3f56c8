"""``kvlease bench freshness`` (or ``python -m kvlease.ops.bench.freshness``): how fresh the change feed is.

Starts its own local cluster (ZooKeeper, one coordinator, three tablet servers; processes in a temp
directory, stopped at the end whatever happens) and measures in one run how long after a write is
acknowledged a reader sees it. Every time is this process's monotonic clock: a writer thread stamps each
key when its write is acknowledged (``upsert`` returned: PutKv answered, at RF 3 once the in-sync replicas
hold it), a reader stamps it when it sees it; keys seen before the writer was answered count 0 ms.

- ``feed``: new keys are written into a one-bucket table ``(k BIGINT, v STRING of 100 bytes)`` in batches
  every 10 ms (up to 8 in flight) at ``--low-rate`` (1,000 writes/s) and at ``--high-rate`` (10,000 writes/s), ``--seconds``
  (10) each, while a reader thread reads the bucket's changelog as ``kvlease log --follow`` does: long
  polls of ``fetch_log_from`` (``--wait-ms``, 500, the CLI's default poll interval). At replication factor
  1 and 3 (``min.insync-replicas`` 2): the feed shows committed records only, so at RF 3 a follower's fetch
  and the high watermark's advance are part of the figure. The first half second of each run is not
  counted (connections, caches).
  ``--no-feed`` leaves these runs out.
- ``spark`` (unless ``--no-spark``: Spark takes a while to start): a streaming query of the kvlease source
  (``startup.mode`` latest, the default trigger, local mode) with ``foreachBatch`` collecting each
  micro-batch's keys, while new keys are written at ``--spark-rate`` (100 writes/s) for
  ``--spark-seconds`` (20) into a one-bucket RF 1 table: from the acknowledgement to the row's micro-batch.

Judged (p50 and p99 each, against the p99's target): the feed at the low rate, RF 1 and 3, at most 50 ms; at
the high rate at most 100 ms (docs/benchmarks.md, "Freshness", says why); Spark's micro-batch at most 1 s.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import kvlease.ops.bench.suite as bench_suite
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.bench.freshness_probe import COLUMNS_SQL, FeedReader, Seen, StampedWriter, freshness
from kvlease.ops.bench.suite import Option, Row, positive_float, positive_int

COLUMNS = [Column(name, kind) for name, kind in COLUMNS_SQL]
LOW_RATE_TARGET_MS = 50.0  # the issue's: p99 at 1k writes/s
HIGH_RATE_TARGET_MS = 100.0  # ten times the writes: see docs/benchmarks.md, "Freshness"
SPARK_TARGET_MS = 1000.0  # the issue's: p99 of a micro-batch, default trigger
WARMUP_S = 0.5
DRAIN_TIMEOUT_S = 30.0

OPTIONS = (
    Option("--seconds", positive_float, 10.0, "seconds of writes per rate and replication factor", "S"),
    Option("--low-rate", positive_int, 1_000, "writes/s of the first run (judged: p99 <= 50 ms)"),
    Option("--high-rate", positive_int, 10_000, "writes/s of the second run"),
    Option("--wait-ms", positive_int, 500, "the reader's long-poll wait (kvlease log --follow's poll interval)",
           "MS"),
    Option("--spark-rate", positive_int, 100, "writes/s while the Spark streaming query runs"),
    Option("--spark-seconds", positive_float, 20.0, "seconds of writes while the Spark streaming query runs", "S"),
    Option("--no-spark", bool, False, "leave out the Spark streaming query (it takes a while to start)"),
    Option("--no-feed", bool, False, "leave out the feed's runs (the Spark streaming query alone)"),
)


def feed_once(admin, table: str, rate: int, seconds: float, wait_ms: int) -> dict[str, Any]:
    """One timed run of the feed: ``rate`` writes/s into ``table`` for ``seconds``, a long-polling reader."""
    from kvlease.client.table import TableClient

    with TableClient(admin, table) as writes, TableClient(admin, table) as reads:
        writer = StampedWriter(writes, rate, seconds)
        seen = Seen(writer.n)
        reader = FeedReader(reads, reads.end_positions([0])[0], seen, wait_ms).start()
        t0 = time.monotonic()
        try:
            writer.run()
            seen.wait_all(DRAIN_TIMEOUT_S)
        finally:
            reader.stop()
        took = time.monotonic() - t0
    figures = freshness(writer.acked, seen.times, warmup=min(int(rate * WARMUP_S), writer.n // 2))
    if figures["missing"] or seen.other:
        raise RuntimeError(f"{table}: the reader did not see {figures['missing']} of the keys written, or saw "
                           f"{seen.other} it should not have, within {DRAIN_TIMEOUT_S:g} s")
    return {**figures, "rate": rate, "achieved_rate": writer.achieved_rate, "writes": writer.n,
            "fetches_per_s": reader.fetches / took}


def run(*, seconds: float, low_rate: int, high_rate: int, wait_ms: int, spark_rate: int, spark_seconds: float,
        no_spark: bool = False, no_feed: bool = False, progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    from kvlease.client.admin import AdminClient
    from kvlease.ops.bench.replication import create_in_sync

    if low_rate >= high_rate:
        raise bench_suite.UsageError(f"--low-rate {low_rate:,} must be below --high-rate {high_rate:,}")

    base = tempfile.mkdtemp(prefix="kvlease-bench-freshness-")
    directory = f"{base}/cluster"
    feed: dict[str, dict[str, Any]] = {}
    spark: dict[str, Any] | None = None
    try:
        with local_cluster.running(directory, tablets=3, config_overrides={"kv.snapshot.interval": "1h"},
                                   progress=progress):
            with AdminClient(local_cluster.bootstrap(directory), retry_total_s=60) as admin:
                for rf in () if no_feed else (1, 3):
                    for rate in (low_rate, high_rate):
                        name = f"bench.fresh_rf{rf}_{rate}"
                        create_in_sync(admin, name, COLUMNS, ["k"], rf)
                        progress(f"feed: {rate:,} writes/s for {seconds:g} s at RF {rf}, a long-polling reader")
                        feed[f"rf{rf}_{rate}"] = feed_once(admin, name, rate, seconds, wait_ms)
                        admin.drop_table(name)
                if not no_spark:
                    spark = _spark(admin, directory, base, spark_rate, spark_seconds, progress)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures: dict[str, Any] = {"seconds": seconds, "wait_ms": wait_ms, "low_rate": low_rate, "high_rate": high_rate,
                               "feed": feed, "targets_ms": {"low_rate_p99": LOW_RATE_TARGET_MS,
                                                            "high_rate_p99": HIGH_RATE_TARGET_MS,
                                                            "spark_p99": SPARK_TARGET_MS}}
    if spark is not None:
        figures["spark"] = spark
    return figures


def _spark(admin, directory: str, base: str, rate: int, seconds: float, progress) -> dict[str, Any]:
    from kvlease.client.table import TableClient
    from kvlease.ops.bench.freshness_spark import LOW_LATENCY_CONF, spark_freshness
    from kvlease.ops.streaming import local_session, stop_local_session

    name = "bench.fresh_spark"
    admin.create_table(name, COLUMNS, ["k"], 1)
    progress("starting Spark (local mode) and a streaming query of the change feed")
    spark = local_session(f"{base}/spark", app="kvlease-bench-freshness", log_file=f"{base}/spark.log",
                          conf=LOW_LATENCY_CONF)
    try:
        with TableClient(admin, name) as client:
            return spark_freshness(spark, client, ",".join(local_cluster.bootstrap(directory)), name, rate, seconds,
                                   f"{base}/checkpoint", progress)
    finally:
        stop_local_session(spark)


def _line(label: str, f: dict[str, Any], target_ms: float | None) -> str:
    judged = "" if target_ms is None else (f"  (p99 target <= {target_ms:g} ms: "
                                           f"{'ok' if f['p99_ms'] <= target_ms else 'MISSED'})")
    return (f"  {label:<34} p50 {f['p50_ms']:8.1f} ms  p99 {f['p99_ms']:8.1f} ms  max {f['max_ms']:8.1f} ms  "
            f"({f['keys']:,} writes, {f['achieved_rate']:,.0f}/s, {f['seen_before_ack'] / max(1, f['keys']):.0%} seen "
            f"before acknowledged){judged}")


def report(result: dict[str, Any]) -> str:
    r, targets = result, result["targets_ms"]
    lines = [f"from a write's acknowledgement to a reader seeing it (one bucket, {r['seconds']:g} s of writes "
             f"per line, batches every 10 ms; the feed reader long-polls fetch_log {r['wait_ms']} ms)"]
    for rf in (1, 3):
        for rate, target in ((r["low_rate"], targets["low_rate_p99"]), (r["high_rate"], targets["high_rate_p99"])):
            f = r["feed"].get(f"rf{rf}_{rate}")
            if f is None:
                continue  # --no-feed
            lines.append(_line(f"feed, RF {rf}, {rate:,} writes/s", f, target)
                         + f"  [{f['fetches_per_s']:,.0f} fetches/s]")
    if "spark" in r:
        s = r["spark"]
        lines.append(_line(f"Spark micro-batch, {s['rate']:,} writes/s", s, targets["spark_p99"])
                     + f"  [{s['batches']} micro-batches with rows]")
        lines.append("    a micro-batch's steps, median ms: " + ", ".join(
            f"{step} {ms:,.0f}" for step, ms in s.get("batch_steps_ms", {}).items()))
    else:
        lines.append("  Spark micro-batch: not measured (--no-spark)")
    return "\n".join(lines)


def target_rows(figures: dict[str, Any]) -> list[Row]:
    """p50 and p99 of each line; a p50 is judged against its p99's target (half the writes at least that fresh)."""
    targets, rows = figures["targets_ms"], []
    for rf in (1, 3):
        for rate, target in ((figures["low_rate"], targets["low_rate_p99"]),
                             (figures["high_rate"], targets["high_rate_p99"])):
            f = figures["feed"].get(f"rf{rf}_{rate}")
            if f is None:
                continue  # --no-feed
            rows += [Row.limit(f"feed {q}, RF {rf}, {rate:,} writes/s", f[f"{q}_ms"], None, "ms", target)
                     for q in ("p50", "p99")]
    if "spark" in figures:
        s = figures["spark"]
        rows += [Row.limit(f"Spark micro-batch {q}, {s['rate']:,} writes/s", s[f"{q}_ms"], None, "ms",
                           targets["spark_p99"]) for q in ("p50", "p99")]
    return rows


if __name__ == "__main__":
    bench_suite.module_main("freshness")
