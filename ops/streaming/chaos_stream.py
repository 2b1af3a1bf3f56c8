"""The chaos drill's Spark query: bootstrap a table from leased snapshots, tail its changes through every
fault, and check at the end that what it wrote is the table.

:class:`ChaosStream` starts the query of :mod:`kvlease.ops.streaming.stream_query` (Parquet,
one directory per micro-batch) on a table the drill's writers change; once
the writers stopped, :meth:`ChaosStream.finish` waits until the query has read
up to the end of every bucket, stops it and runs the checks of
:mod:`kvlease.ops.streaming.feed_check`: the bootstrap has one row per key as of its offsets,
every change record after it is in the output exactly once, and the output
applied in ``(bucket, offset)`` order equals the table.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from kvlease.client.table import TableClient
import kvlease.ops.streaming.feed_check as feed_check
import kvlease.ops.streaming.stream_query as stream_query
from kvlease.ops.check import Check

KEY = ("id",)
VALUES = ("v", "pad")
LEASE_DURATION = "30s"  # renewed every third of it while the bootstrap runs
CATCH_UP_TIMEOUT_S = 180.0
BOOTSTRAP_BOUND_S = 120.0  # the query's bootstrap (micro-batch 0) is written within this


class ChaosStream:
    """One streaming query on ``table``; ``spark`` is a SparkSession with the kvlease source registered."""

    def __init__(self, spark, addresses: list[str], table: str, progress: Callable[[str], None]) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="kvlease-drill-chaos-"))
        self.lease_id = f"drill-chaos-stream-{uuid.uuid4().hex[:8]}"
        self.sink = stream_query.ParquetSink(self.work / "output", lambda: None, progress)
        self.query = stream_query.start(spark, addresses, table, self.lease_id, LEASE_DURATION, "1 second",
                                        self.sink, self.work / "checkpoint")
        self.started = time.monotonic()

    def wait_for_bootstrap(self, timeout_s: float = BOOTSTRAP_BOUND_S) -> float | None:
        """Wait up to ``timeout_s`` until the query wrote its bootstrap (micro-batch 0); the seconds that
        took (None: it did not, or the query stopped). A drill starts its faults after it: Spark starts the
        source's Python workers as the query starts and gives each a fixed 10 s to connect back, which the
        faults' load on a small machine could exceed, failing the query for Spark's reason, not the faults'."""
        start = time.monotonic()
        while 0 not in self.sink.rows:
            if self.failed() or time.monotonic() - start > timeout_s:
                return None
            time.sleep(0.1)
        return round(time.monotonic() - start, 3)

    def failed(self) -> str:
        """Why the query stopped by itself ("" while it runs)."""
        return "" if self.query.isActive else stream_query.failed(self.query).message

    def finish(self, client: TableClient) -> tuple[list[Check], dict[str, Any]]:
        """Wait for the query to read every bucket to its end, stop it, and check its output against the
        table. The table must not change meanwhile (the writers stopped)."""
        ends = {b: latest for b, (_, latest) in client.list_offsets().items()}
        stream_query.catch_up(self.query, self.sink, self.work / "checkpoint", ends, CATCH_UP_TIMEOUT_S)
        self.query.stop()
        scan = client.scan()
        output = stream_query.read_output(self.work / "output")
        bootstrap = {b: offset for b, (_, offset) in
                     stream_query.checkpoint_offsets(self.work / "checkpoint", 0).items()}
        moved = [f"bucket {b}: scanned at offset {scan.log_offsets.get(b)}, the query read to {end}"
                 for b, end in ends.items() if scan.log_offsets.get(b) != end]
        checks = [feed_check.check_bootstrap(output, KEY, bootstrap),
                  feed_check.check_tail(output, bootstrap, ends),
                  Check.of("the table was read at the offsets the query reached", moved, len(ends)),
                  feed_check.check_state(output, scan.to_table(), KEY, VALUES)]
        batches = output.column("_batch").to_numpy()
        figures = {"stream_micro_batches": int(batches.max()) + 1 if len(batches) else 0,
                   "stream_bootstrap_rows": int((batches == 0).sum()),
                   "stream_change_rows": int((batches > 0).sum()),
                   "stream_s": round(time.monotonic() - self.started, 1)}
        return checks, figures

    def close(self) -> None:
        """Stop the query if it runs; remove its output and checkpoint."""
        try:
            if self.query.isActive:
                self.query.stop()
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
