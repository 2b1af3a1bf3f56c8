"""A live scan of a whole table: every bucket's scanner, in parallel, into one :class:`ScanResult`."""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pyarrow as pa

from kvlease.client.routing import LEADER_CHANGED
from kvlease.client.scanner import DEFAULT_MAX_RESUMES, check_limit
from kvlease.common import errors
from kvlease.common.codec import RowCodec
from kvlease.common.tables import TableInfo

log = logging.getLogger(__name__)
#: How a bucket's scan ends when its leader changed (a failover: NOT_LEADER, FENCED_LEADER_EPOCH, the
#: server gone): :func:`scan_table` reads that bucket again from its start, as a new session.
RESTART_ON = (*LEADER_CHANGED, errors.NetworkError)


@dataclass
class ScanResult:
    """What :func:`scan_table` read: ``batches`` (bucket order, the table's schema) and per bucket
    ``log_offsets`` (replay the changelog from there to reach the present) and ``resumed`` counts."""

    table: TableInfo
    batches: list[pa.RecordBatch]
    log_offsets: dict[int, int]
    resumed: dict[int, int] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        """Rows read, over every bucket."""
        return sum(b.num_rows for b in self.batches)

    def to_table(self) -> pa.Table:
        """The batches as one Arrow table (the table's schema, also when no row was read)."""
        schema = self.batches[0].schema if self.batches else RowCodec(self.table).schema
        return pa.Table.from_batches(self.batches, schema=schema)

    @property
    def rows(self) -> list[dict]:
        """Every row as a dict (bucket order)."""
        return [row for batch in self.batches for row in batch.to_pylist()]

    @property
    def one_snapshot(self) -> bool:
        """Every bucket was read from one snapshot (no resumed scan)."""
        return not any(self.resumed.values())


def scan_table(client, *, limit: int | None = None, buckets: Sequence[int] | None = None,
               streaming: bool = False, resume: bool = False, decode: bool = True,
               batch_size_bytes: int | None = None,
               on_batch: Callable[[int, pa.RecordBatch], None] | None = None) -> ScanResult:
    """Every row of the table (or of ``buckets``) through ``client`` (a TableClient).

    Without a limit the buckets are read in parallel on the client's thread
    pool (``parallelism`` buckets at a time, each its own scanner with one
    request in flight): buckets live on different servers, so the scan takes
    about as long as the slowest bucket rather than the sum, and the server
    side of each stays bounded by one batch. With a limit they are read one
    after another, each asked for what is still missing, so no more than
    ``limit`` rows are ever fetched; buckets not reached then have no
    ``log_offsets`` entry. ``on_batch(bucket, batch)`` is called for every
    batch (from worker threads when parallel). The first error stops the
    other buckets (their sessions are closed) and is raised. A bucket whose
    scan lost its leader is read again as a new session (:func:`_restarting`).
    """
    table = client.table
    check_limit(limit)
    wanted = list(range(table.buckets)) if buckets is None else sorted(set(buckets))
    for bucket in wanted:
        client.physical.check_bucket(bucket)
    stop = threading.Event()

    def scan_session(bucket: int, bucket_limit: int | None) -> tuple[list[pa.RecordBatch], int, int]:
        batches: list[pa.RecordBatch] = []
        options = {} if batch_size_bytes is None else {"batch_size_bytes": batch_size_bytes}
        with client.scanner(bucket, streaming=streaming, limit=bucket_limit, resume=resume, decode=decode,
                            **options) as scanner:
            while not stop.is_set() and (batch := scanner.poll()) is not None:
                batches.append(batch)
                if on_batch is not None:
                    on_batch(bucket, batch)
            return batches, scanner.log_offset, scanner.resumed

    scan_bucket = functools.partial(_restarting, scan_session, give_up=lambda: resume or stop.is_set())
    per_bucket: dict[int, tuple[list[pa.RecordBatch], int, int]] = {}
    if limit is not None:
        remaining = limit
        for bucket in wanted:
            if remaining <= 0:
                break
            per_bucket[bucket] = scan_bucket(bucket, remaining)
            remaining -= sum(b.num_rows for b in per_bucket[bucket][0])
    else:
        def guarded(bucket: int):
            try:
                return scan_bucket(bucket, None)
            except BaseException:
                stop.set()
                raise
        for bucket, (result, error) in zip(wanted, client.map_parallel(guarded, wanted)):
            if error is not None:
                raise error
            per_bucket[bucket] = result
    return ScanResult(table=table,
                      batches=[b for bucket in sorted(per_bucket) for b in per_bucket[bucket][0]],
                      log_offsets={bucket: per_bucket[bucket][1] for bucket in sorted(per_bucket)},
                      resumed={bucket: per_bucket[bucket][2] for bucket in sorted(per_bucket)})


def _restarting(scan: Callable[[int, int | None], tuple], bucket: int, limit: int | None, *,
                give_up: Callable[[], bool]) -> tuple:
    """``scan(bucket, limit)``, called again when the session it read lost its leader (:data:`RESTART_ON`),
    at most ``DEFAULT_MAX_RESUMES`` times, unless ``give_up()`` (a scan with ``resume`` resumes after its
    last key instead). The bucket is then read from its start on the new leader as a new session: its
    snapshot and ``log_offset`` replace the lost one's, so scan + changelog stay exact per bucket
    (``on_batch`` sees that bucket's batches again)."""
    restarts = 0
    while True:
        try:
            return scan(bucket, limit)
        except RESTART_ON as exc:
            # a session that was open and got lost (BucketScanner._lost), not an open out of retries
            lost = "rows_delivered" in exc.details
            if not lost or give_up() or restarts >= DEFAULT_MAX_RESUMES:
                raise
            restarts += 1
            log.info("scan of bucket %d lost its leader (%s); reading the bucket again on the new leader",
                     bucket, exc.message)
