"""A writer loading a table's leader at a steady rate while a benchmark measures something else.

``with paced_writer(bootstrap, table, ids, rows_per_s) as written:`` upserts, from a process of its own, rows of
:func:`kvlease.ops.bench.writes.make_batch` (ids ``0 .. ids-1`` in turn: the
table's size does not change, each write is an update with a changelog
record pair) in batches of at most :data:`BATCH_ROWS`, spaced so that the
rows per second stay at ``rows_per_s`` (a batch that takes longer delays the
next; none is skipped). The block begins once the first batch was
acknowledged (the load is on when the measuring starts); its end stops it; ``written.rows`` and
``written.seconds`` say what it wrote, and a write that failed is raised there.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from kvlease.ops.bench.writes import make_batch

BATCH_ROWS = 1_000
START_TIMEOUT_S = 120.0  # the writer's process starts (an interpreter, a client) or stops within this


class PacedWriter:
    def __init__(self, client, ids: int, rows_per_s: int) -> None:
        if ids <= 0 or rows_per_s <= 0:
            raise ValueError(f"ids and rows_per_s must be positive, got {ids} and {rows_per_s}")
        self.client, self.ids, self.rows_per_s = client, ids, rows_per_s
        self.batch = min(BATCH_ROWS, ids, rows_per_s)
        self.rows = 0
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._first = threading.Event()  # the first batch acknowledged (or failed)
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-paced-writer")

    def start(self) -> "PacedWriter":
        self._thread.start()
        return self

    def wait_first(self, timeout_s: float) -> None:
        """Wait until the first batch was acknowledged (the load is on); raises the error of a write that failed,
        or RuntimeError if none was acknowledged within ``timeout_s``."""
        if not self._first.wait(timeout_s):
            raise RuntimeError(f"the writer loading the leader wrote nothing within {timeout_s:g}s")
        if self.error is not None:
            raise RuntimeError(f"the writer loading the leader failed: {self.error}") from self.error

    def stop(self) -> None:
        """Stop after the batch in flight; raises the error of a write that failed."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the writer loading the leader failed: {self.error}") from self.error

    def _run(self) -> None:
        t0 = time.perf_counter()
        start, salt = 0, 1_000
        try:
            while not self._stop.is_set():
                ids = np.arange(start, start + self.batch) % self.ids
                self.client.upsert(make_batch(ids, salt=salt))
                self.rows += len(ids)
                self._first.set()
                start, salt = (start + self.batch) % self.ids, salt + 1
                due = t0 + self.rows / self.rows_per_s  # when the next batch keeps the rate
                self._stop.wait(max(0.0, due - time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001 - raised by stop()
            self.error = exc
        finally:
            self._first.set()
            self.seconds = time.perf_counter() - t0


@dataclass
class Written:
    """What a :func:`paced_writer` wrote, known once its block ended."""

    rows: int = 0
    seconds: float = 0.0


def _writer_main(bootstrap, table: str, ids: int, rows_per_s: int) -> None:
    """The writer's process (``python -m kvlease.ops.bench.paced_writer BOOTSTRAP_JSON TABLE IDS ROWS_PER_S``): a
    client of its own and a :class:`PacedWriter` until a line (or the end) on stdin; one JSON line on stdout
    says it started (its first batch acknowledged), one what it wrote or why it failed."""
    from kvlease.client.admin import AdminClient
    from kvlease.client.table import TableClient

    def say(doc: dict) -> None:
        print(json.dumps(doc), flush=True)

    try:
        with AdminClient(bootstrap, retry_total_s=60) as admin, TableClient(admin, table, retry_total_s=60) as client:
            writer = PacedWriter(client, ids, rows_per_s).start()
            writer.wait_first(START_TIMEOUT_S)  # the load is on before the benchmark measures under it
            say({"started": True})
            sys.stdin.readline()
            try:
                writer.stop()
                say({"rows": writer.rows, "seconds": writer.seconds})
            except RuntimeError as exc:
                say({"failed": str(exc)})
    except Exception as exc:  # noqa: BLE001 - told to the benchmark, which raises it
        say({"failed": f"{type(exc).__name__}: {exc}"})


def _line(process: subprocess.Popen, what: str) -> dict:
    """The writer process's next JSON line (RuntimeError if it says it failed, or said nothing in time)."""
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline() if ready else ""
    doc = json.loads(line) if line.strip() else {"failed": f"it did not {what} (exit code {process.poll()})"}
    if "failed" in doc:
        raise RuntimeError(f"the writer loading the leader failed: {doc['failed']}")
    return doc


@contextlib.contextmanager
def paced_writer(bootstrap, table: str, ids: int, rows_per_s: int) -> Iterator[Written]:
    """A :class:`PacedWriter` on ``table`` of the cluster at ``bootstrap`` (``local_cluster.bootstrap``'s), in a
    process of its own (a client elsewhere: its CPU is not the measured process's, nor its interpreter lock),
    running for the block; the :class:`Written` it yields is filled at the block's end (RuntimeError if a
    write failed)."""
    command = [sys.executable, "-m", "kvlease.ops.bench.paced_writer", json.dumps(bootstrap), table, str(ids),
               str(rows_per_s)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    written = Written()
    try:
        _line(process, "start")
        yield written
        process.stdin.write("stop\n")
        process.stdin.flush()
        doc = _line(process, "stop")
        written.rows, written.seconds = doc["rows"], doc["seconds"]
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()  # the end of stdin stops it too (the block failed)
        try:
            process.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


if __name__ == "__main__":
    _writer_main(json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
