"""``kvlease bench freshness``'s Spark part: from a write's acknowledgement to its row in a micro-batch.

A streaming query of the kvlease source (``startup.mode`` latest: the change feed from the query's start;
the default trigger: the next micro-batch as soon as the previous one ended and ``latestOffset`` says there is
something new) runs ``foreachBatch`` in this process (PySpark runs it in the driver): it collects the
batch's keys and stamps them with ``time.monotonic()``, the clock the writer stamps its acknowledgements
with (:mod:`kvlease.ops.bench.freshness_probe`). A first row, written before the timed ones, is waited for:
the query runs (its first micro-batch is behind it) when the writer starts.

The session has :data:`LOW_LATENCY_CONF`, docs/spark.md's "Low-latency streaming" settings: without them,
writing the offset and commit logs of a micro-batch (``walCommit`` + ``commitOffsets``) took 60-100 ms of its
200-450 ms here (20 processes started), with them 10-15 ms (2 processes), and each task's input reached its
Python worker ~42 ms late (TCP), with them at once (a Unix domain socket).
"""

from __future__ import annotations

import time
from statistics import median
from typing import Any

from kvlease.ops.bench.freshness_probe import Seen, StampedWriter, freshness

#: docs/spark.md's "Low-latency streaming" settings. A checkpoint on the local disk (``file:``): Hadoop's local
#: filesystem, without its native library (PySpark from pip has none), starts a process for some file
#: operations: ``readlink`` each time Spark's default checkpoint file manager (FileContext) resolves a path,
#: ``chmod`` for each file it creates. Writing a micro-batch's offset and commit logs so started 20 processes
#: (16 ``readlink``, 4 ``chmod``: the two log files and their ``.crc`` checksum files) from the driver's JVM,
#: 60-100 ms of the micro-batch on 2 cores. With the FileSystem API's checkpoint file manager (no path
#: resolution) and raw local files (no ``.crc``) 2 remain (a ``chmod`` per log file). (Counted with ``strace -f
#: -e execve`` on the driver's JVM; a checkpoint on HDFS or an object store starts none.) Unix domain sockets
#: between the JVM and its Python workers: on TCP, a task's input (the split, a few hundred bytes) reached the
#: worker ~42 ms after the worker asked for it, every task (Nagle's algorithm meeting a delayed ACK), before
#: the read could start.
LOW_LATENCY_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.python.unix.domain.socket.enabled": "true",
}
START_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 60.0


def spark_freshness(spark, client, bootstrap: str, table: str, rate: int, seconds: float, checkpoint: str,
                    progress) -> dict[str, Any]:
    """The freshness of a micro-batch (see the module docstring): ``freshness()``'s figures, with ``batches``
    (micro-batches that had rows), ``achieved_rate`` and ``rate``."""
    writer = StampedWriter(client, rate, seconds)
    seen = Seen(writer.n)
    batches: list[int] = []

    def sink(df, batch_id: int) -> None:
        keys = [row[0] for row in df.select("k").collect()]
        seen.mark(keys, time.monotonic())
        if keys:
            batches.append(len(keys))

    query = (spark.readStream.format("kvlease").option("bootstrap", bootstrap).option("table", table)
             .option("startup.mode", "latest").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start())
    try:
        _await_first_row(query, client, seen, writer.n)
        progress(f"Spark: {writer.n:,} writes at {rate:,}/s into {table}, each timed to its micro-batch")
        writer.run()
        if not seen.wait_all(DRAIN_TIMEOUT_S):
            raise RuntimeError(f"the streaming query did not see every write within {DRAIN_TIMEOUT_S:g} s")
        _check(query)
        steps = batch_steps(query.recentProgress)
    finally:
        query.stop()
    figures = freshness(writer.acked, seen.times)
    return {**figures, "rate": rate, "achieved_rate": writer.achieved_rate, "batches": len(batches),
            "rows_per_batch": writer.n / max(1, len(batches)), "batch_steps_ms": steps}


def batch_steps(progress) -> dict[str, float]:
    """Where a micro-batch's time goes: the median ms of each step Spark times (``durationMs`` of its progress
    reports: ``latestOffset``, ``queryPlanning``, ``addBatch`` (the read and ``foreachBatch``), ``walCommit``,
    ``commitOffsets``, ``triggerExecution`` the whole) over the micro-batches that had rows, the first such
    (workers starting) left out."""
    reports = [p for p in progress if p.numInputRows > 0][1:]
    steps = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")
    return {step: float(median([p.durationMs.get(step, 0) for p in reports])) if reports else float("nan")
            for step in steps}


def _await_first_row(query, client, seen: Seen, key: int) -> None:
    """Write key ``key`` (outside the timed ones) every second until a micro-batch had it: the query started
    (its start offset, the log's end then, may be after the first writes) and ran a micro-batch."""
    import pyarrow as pa

    deadline = time.monotonic() + START_TIMEOUT_S
    written = 0.0
    while seen.other == 0:
        _check(query)
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"the streaming query saw no row within {START_TIMEOUT_S:g} s of its start")
        if now - written >= 1.0:
            client.upsert(pa.record_batch({"k": pa.array([key], pa.int64()), "v": pa.array(["warm-up"])}))
            written = now
        time.sleep(0.05)


def _check(query) -> None:
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
