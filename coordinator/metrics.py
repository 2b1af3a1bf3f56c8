"""The coordinator's Prometheus metrics (one registry per coordinator process)."""

from __future__ import annotations

from collections import Counter as Tally
from typing import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from kvlease.common.metrics import MetricsRegistry
from kvlease.common.tables import TableInfo

#: The labels of the per-partition lease gauges: the table's id, the partition's id (never reused) and name.
PARTITION_LABELS = ("table_id", "partition_id", "partition")
#: The labels of the per-table bucket health gauges: a table's, or a partition's (partition labels empty for an
#: unpartitioned table).
HEALTH_LABELS = ("table_id", "table", "partition_id", "partition")


class CoordinatorMetrics(MetricsRegistry):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.leases = Gauge("kvlease_leases", "KV snapshot leases held", registry=r)
        self.leased_snapshots = Gauge("kvlease_leased_snapshots", "snapshots protected by at least one lease",
                                      registry=r)
        self.table_leases = Gauge("kvlease_table_leases", "leases holding a bucket of the table", ["table_id"],
                                  registry=r)
        self.table_leased_snapshots = Gauge("kvlease_table_leased_snapshots", "leased snapshots of the table",
                                            ["table_id"], registry=r)
        self.partition_leases = Gauge("kvlease_partition_leases", "leases holding a bucket of the partition (of a "
                                      "partitioned table; one series per partition some lease holds)",
                                      PARTITION_LABELS, registry=r)
        self.partition_leased_snapshots = Gauge("kvlease_partition_leased_snapshots",
                                                "leased snapshots of the partition", PARTITION_LABELS, registry=r)
        self.leases_expired = Counter("kvlease_leases_expired", "leases dropped because they expired", registry=r)
        self.failovers = Counter("kvlease_coordinator_failovers", "times this process took over as the active coordinator from an earlier one "
                                 "(epoch > 1; the cluster's first active does not count)",
                                 registry=r)
        self.active = Gauge("kvlease_coordinator_active", "1 while this process is the active coordinator",
                            registry=r)
        self.epoch = Gauge("kvlease_coordinator_epoch", "epoch of the active coordinator", registry=r)
        self.lease_files_unreadable = Gauge(
            "kvlease_lease_files_unreadable",
            "lease files found missing or corrupt at reinitialization (their leases are not loaded; "
            "their ZooKeeper nodes are kept for an operator)", registry=r)
        self.queue_depth = Gauge("kvlease_event_loop_queue_depth", "requests waiting for the event loop", registry=r)
        self.loop_cpu = Counter("kvlease_coordinator_loop_cpu_seconds",
                                "CPU time of the event loop's thread (requests, lease writes, expiry ticks)",
                                registry=r)
        self._replication_gauges(r)
        self.orphan_files_deleted = Counter(
            "kvlease_coordinator_orphan_files_deleted",
            "remote snapshot files the orphan reclaim deleted, by reason (orphan: named by no stored snapshot; "
            "dropped_table: left by a dropped table), each older than kv.snapshot.orphan-grace", ["reason"],
            registry=r)
        self.orphan_bytes_deleted = Counter("kvlease_coordinator_orphan_bytes_deleted",
                                            "bytes of the files the orphan reclaim deleted, by reason", ["reason"],
                                            registry=r)
        self._tables: set[str] = set()
        #: (table, partition) -> its labels, its two series, and the (leases, leased snapshots) they were last set to
        self._partitions: dict[tuple[int, int], tuple[tuple[str, str, str], Gauge, Gauge, tuple[int, int]]] = {}
        self._unhealthy: dict[str, set[tuple[str, ...]]] = {}  # "offline", "under" -> the label sets it has

    def _replication_gauges(self, r: CollectorRegistry) -> None:
        """Offline and under-replicated buckets, elections, accepted data losses (docs/operations.md)."""
        self.offline_buckets = Gauge("kvlease_coordinator_offline_buckets",
                                     "buckets with no live leader (LEADER_NOT_AVAILABLE)", registry=r)
        self.under_replicated_buckets = Gauge("kvlease_coordinator_under_replicated_buckets",
                                              "buckets with a live leader whose ISR is smaller than their replicas",
                                              registry=r)
        self.table_offline_buckets = Gauge(
            "kvlease_coordinator_table_offline_buckets", "offline buckets of the table, or of its partition (one "
            "series per table or partition that has some)", HEALTH_LABELS, registry=r)
        self.table_under_replicated_buckets = Gauge(
            "kvlease_coordinator_table_under_replicated_buckets", "under-replicated buckets of the table, or of "
            "its partition (one series per table or partition that has some)", HEALTH_LABELS, registry=r)
        self.unclean_elections = Counter("kvlease_coordinator_unclean_elections",
                                         "buckets led by a replica that was not in sync (unclean.leader-election: "
                                         "writes it missed are lost)", registry=r)
        self.preferred_leader_elections = Counter(
            "kvlease_coordinator_preferred_leader_elections",
            "buckets whose leadership went back to their preferred replica automatically "
            "(auto.leader-rebalance.enabled: back in the ISR, or over leader.imbalance.per-server.percentage)",
            registry=r)
        self.data_losses = Counter("kvlease_coordinator_data_losses",
                                   "losses of committed changes an operator accepted, by kind (restore: bucket "
                                   "restore --accept-data-loss; unclean: bucket elect --unclean)", ["kind"],
                                   registry=r)

    def set_lease_counts(self, leases: int, leased_snapshots: int, per_table_leases: dict[int, int],
                         per_table_snapshots: dict[int, int]) -> None:
        self.leases.set(leases)
        self.leased_snapshots.set(leased_snapshots)
        tables = {str(t) for t in per_table_leases} | {str(t) for t in per_table_snapshots}
        for gone in self._tables - tables:
            self.table_leases.remove(gone)
            self.table_leased_snapshots.remove(gone)
        for table_id in tables:
            self.table_leases.labels(table_id).set(per_table_leases.get(int(table_id), 0))
            self.table_leased_snapshots.labels(table_id).set(per_table_snapshots.get(int(table_id), 0))
        self._tables = tables

    def set_partition_lease_counts(self, leases: Mapping[tuple[int, int], int],
                                   snapshots: Mapping[tuple[int, int], int], physical: Mapping[int, TableInfo]) -> None:
        """The per-partition gauges, by (table id, partition id): a series for each partition some lease holds
        (``physical``: the catalog's physical tables, for the partition's name); a partition no lease holds any
        more (released, expired, dropped) loses its series. This runs every expiry tick: with 1,000 partitions
        held, looking up and setting every series took ~10 ms of the loop, so each partition's series are
        looked up once and set only when its counts changed."""
        held = leases.keys() | snapshots.keys()
        for gone in self._partitions.keys() - held:
            labels = self._partitions.pop(gone)[0]
            self.partition_leases.remove(*labels)
            self.partition_leased_snapshots.remove(*labels)
        for key in held:
            counts = (leases.get(key, 0), snapshots.get(key, 0))
            known = self._partitions.get(key)
            if known is None:
                name = getattr(physical.get(key[1]), "partition_name", None) or ""
                labels = (str(key[0]), str(key[1]), name)
                known = (labels, self.partition_leases.labels(*labels),
                         self.partition_leased_snapshots.labels(*labels), None)
            elif known[3] == counts:
                continue
            known[1].set(counts[0])
            known[2].set(counts[1])
            self._partitions[key] = (*known[:3], counts)

    def set_bucket_health(self, offline: Sequence[tuple[int, int]], under: Sequence[tuple[int, int]],
                          physical: Mapping[int, TableInfo]) -> None:
        """The offline and under-replicated buckets ((physical id, bucket)), in all and per table or partition
        (``physical``: the catalog's physical tables; a bucket of one not there, being dropped, is counted in
        all only). A table or partition with none has no series."""
        self.offline_buckets.set(len(offline))
        self.under_replicated_buckets.set(len(under))
        for key, gauge, buckets in (("offline", self.table_offline_buckets, offline),
                                    ("under", self.table_under_replicated_buckets, under)):
            counts = Tally(_health_labels(physical[t]) for t, _bucket in buckets if t in physical)
            for gone in self._unhealthy.get(key, set()) - counts.keys():
                gauge.remove(*gone)
            for labels, n in counts.items():
                gauge.labels(*labels).set(n)
            self._unhealthy[key] = set(counts)


def _health_labels(view: TableInfo) -> tuple[str, str, str, str]:
    partition_id = "" if view.partition_id is None else str(view.partition_id)
    return str(view.table_id), view.path, partition_id, view.partition_name or ""
