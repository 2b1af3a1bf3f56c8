"""The streaming query of ``kvlease demo`` and the ``spark-failover`` drill: the kvlease source, bootstrap then
tail, into Parquet through ``foreachBatch``; reading its output and checkpoint back; waiting until it has
read up to given offsets.

Micro-batch N goes to ``OUTPUT/batch-N`` (``mode("overwrite")``, so a
micro-batch Spark runs again replaces its own files) with one more column,
``_batch`` = N; micro-batch 0 is the bootstrap. The checkpoint's
``offsets/N`` holds the source offset micro-batch N ends at (docs/architecture.md, "The Spark source":
``{"lease", "buckets": {"<b>": {"snapshot", "offset"}}}``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.dataset as ds

from kvlease.common import errors

Progress = Callable[[str], None]


class ParquetSink:
    """The ``foreachBatch`` function; ``on_bootstrap`` runs inside micro-batch 0 before it reads anything,
    ``on_written(batch id)`` after each micro-batch is written."""

    def __init__(self, output_dir: Path, on_bootstrap: Callable[[], None], progress: Progress,
                 on_written: Callable[[int], None] = lambda batch_id: None) -> None:
        self.output_dir = output_dir
        self.on_bootstrap = on_bootstrap
        self.on_written = on_written
        self.progress = progress
        self.rows: dict[int, int] = {}  # micro-batch id -> rows written
        self._lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        from pyspark.sql.functions import lit

        if batch_id == 0:
            self.on_bootstrap()
        path = self.output_dir / f"batch-{batch_id:06d}"
        df.withColumn("_batch", lit(batch_id)).write.mode("overwrite").parquet(str(path))
        count = ds.dataset(str(path), format="parquet").count_rows()
        with self._lock:
            self.rows[batch_id] = count
            changes = sum(n for b, n in self.rows.items() if b > 0)
        if batch_id == 0:
            self.progress(f"micro-batch 0 (the bootstrap): {count:,} rows -> Parquet")
        else:
            self.progress(f"micro-batch {batch_id}: {count:,} change rows -> Parquet ({changes:,} so far)")
        self.on_written(batch_id)

    @property
    def last_batch(self) -> int | None:
        """The last micro-batch written, None before the first."""
        with self._lock:
            return max(self.rows) if self.rows else None


def start(spark, bootstrap: list[str], table: str, lease_id: str, lease_duration: str, trigger: str,
          sink: ParquetSink, checkpoint: Path):
    """Start the query: ``table`` from its leased snapshots, then its changelog, into ``sink``."""
    try:
        return (spark.readStream.format("kvlease").option("bootstrap", ",".join(bootstrap)).option("table", table)
                .option("lease.id", lease_id).option("lease.duration", lease_duration).load()
                .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
                .trigger(processingTime=trigger).start())
    except Exception as exc:  # Spark's errors: a Python traceback and a query plan in one message
        raise errors.KvLeaseError(f"the streaming query did not start: {error_line(exc)}") from None


def failed(query) -> errors.KvLeaseError:
    """The error of a query that stopped by itself, in one line."""
    return errors.KvLeaseError(f"the streaming query failed: {error_line(query.exception())}")


_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception|Interrupt)): (.*)$")


def error_line(exc: BaseException | None) -> str:
    """One line of a Spark error: the last ``SomeError: message`` line of the Python traceback it carries
    (the exception the query died of), else its first line."""
    text = str(exc).split("=== Streaming Query ===")[0]
    raised = [m for m in map(_RAISED.match, (line.strip() for line in text.splitlines())) if m]
    line = f"{raised[-1].group(1)}: {raised[-1].group(2)}" if raised else (text.strip().splitlines() or [""])[0]
    return line if len(line) <= 500 else line[:497] + "..."


def read_output(output_dir: str | Path) -> pa.Table:
    """Every micro-batch's Parquet files under ``output_dir`` as one table."""
    dataset = ds.dataset(str(output_dir), format="parquet")
    if not dataset.files:
        raise errors.KvLeaseError(f"the streaming query wrote no Parquet file under {output_dir}")
    return dataset.to_table()


def checkpoint_offsets(checkpoint: str | Path, batch: int) -> dict[int, tuple[int, int]]:
    """``bucket -> (snapshot id or -1, end offset)`` of micro-batch ``batch``, from the query's checkpoint."""
    lines = (Path(checkpoint) / "offsets" / str(batch)).read_text().splitlines()
    doc = json.loads(lines[-1])
    return {int(b): (int(v["snapshot"]), int(v["offset"])) for b, v in doc["buckets"].items()}


def catch_up(query, sink: ParquetSink, checkpoint: Path, ends: dict[int, int], timeout_s: float,
             stopped: Callable[[], bool] = lambda: False) -> None:
    """Return once a written micro-batch ends at (or past) ``ends`` in every bucket; raises if the query
    stopped, ``stopped()`` says to give up, or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = sink.last_batch
        if last is not None:
            reached = checkpoint_offsets(checkpoint, last)
            if all(reached[b][1] >= end for b, end in ends.items()):
                return
        if not query.isActive:
            raise failed(query)
        if stopped():
            raise errors.KvLeaseError("stopped while the query was catching up")
        if time.monotonic() > deadline:
            raise errors.KvLeaseError(f"the streaming query did not catch up within {timeout_s:g}s "
                                      f"(last micro-batch written: {last})")
        time.sleep(0.2)
