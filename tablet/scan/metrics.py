"""The live-scan metrics of a tablet server (:class:`~kvlease.tablet.scan.service.ScanService` keeps them).

Counters the service bumps as it answers (opened, released, expired, refused,
read-ahead used or dropped, rows, bytes) and gauges read at scrape time from
the service's ``counts()`` (open sessions, per bucket, snapshots held), so no
gauge keeps a stale label.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from kvlease.common.metrics import MetricsRegistry
from kvlease.common.model import TableBucket

#: ``(open sessions, open sessions per bucket, snapshots held)``
Counts = Callable[[], tuple[int, dict[TableBucket, int], int]]


class ScanMetrics(MetricsRegistry):
    """The tablet server's Prometheus registry: live-scan counters and open-scanner gauges."""

    def __init__(self, counts: Counts) -> None:
        super().__init__()
        r = self.registry
        self.opened = Counter("kvlease_scanners_opened", "scan sessions opened", registry=r)
        self.released = Counter("kvlease_scanners_released", "scan sessions ended, by reason", ["reason"],
                                registry=r)
        self.expired = Counter("kvlease_scanners_expired", "scan sessions ended idle past kv.scanner.ttl",
                               registry=r)
        self.refused = Counter("kvlease_scan_requests_refused", "scan requests answered with an error, by code",
                               ["code"], registry=r)
        self.read_ahead = Counter("kvlease_scan_read_ahead", "batches read ahead, by outcome: used or dropped "
                                  "(the next call asked for another size)", ["outcome"], registry=r)
        self.rows = Counter("kvlease_scan_rows", "rows served by live scans", registry=r)
        self.bytes = Counter("kvlease_scan_bytes", "record bytes served by live scans (replays included)",
                             registry=r)
        self._counts = counts
        r.register(self)

    def describe(self):  # registering must not call collect(): the service is not built yet
        return [GaugeMetricFamily("kvlease_scanners_open", ""), GaugeMetricFamily("kvlease_bucket_scanners_open", ""),
                GaugeMetricFamily("kvlease_scan_snapshots_open", "")]

    def collect(self):  # the gauges, read from the service at scrape time (no stale labels)
        total, per_bucket, snapshots = self._counts()
        yield GaugeMetricFamily("kvlease_scanners_open", "open scan sessions on this server", value=total)
        by_bucket = GaugeMetricFamily("kvlease_bucket_scanners_open", "open scan sessions per bucket",
                                      labels=["table_id", "partition_id", "bucket"])
        for tb, n in sorted(per_bucket.items(), key=lambda kv: kv[0].sort_key()):  # partition_id "": none
            by_bucket.add_metric([str(tb.table_id), "" if tb.partition_id is None else str(tb.partition_id),
                                  str(tb.bucket)], n)
        yield by_bucket
        yield GaugeMetricFamily("kvlease_scan_snapshots_open", "RocksDB snapshots held by scan sessions",
                                value=snapshots)
