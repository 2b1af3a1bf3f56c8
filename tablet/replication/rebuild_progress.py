"""A tablet server's replica rebuilds and how far its followers are behind, as Prometheus metrics.

``kvlease cluster status`` reads them (``ops/local_cluster/tablet_health.py``)
and shows per server "rebuilding N bucket(s), X MB downloaded, Y offsets
behind". The gauges (``kvlease_tablet_*``):

- ``rebuilds_in_progress``: followed buckets waiting for or in a rebuild now
  (``tablet/replication/rebuild.py``);
- ``rebuilds_total`` (counter): buckets rebuilt since the server started;
- ``rebuild_bytes_total`` (counter): snapshot bytes downloaded by rebuilds;
- ``follower_offsets_behind`` and ``follower_offsets_behind_max``: over the
  buckets it follows, the sum and the largest of (the leader's log end in its
  last fetch answer - this replica's log end); a bucket in a rebuild counts
  from its leader's log end known (its whole log if none was fetched yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


@dataclass(frozen=True)
class RebuildProgress:
    in_progress: int
    rebuilt: int
    bytes_downloaded: int
    behind_sum: int
    behind_max: int


def progress(replicas, rebuilder) -> RebuildProgress:
    """Now (reads only memory): ``replicas`` a ReplicaManager, ``rebuilder`` the fetchers' (or None)."""
    behind = []
    for replica in replicas.followed():
        if replica.leader_end < 0:
            continue
        offsets = replica.store.files.known_offsets()
        end = offsets[1] if offsets is not None and not replica.fresh else 0
        behind.append(max(0, replica.leader_end - end))
    if rebuilder is None:
        return RebuildProgress(0, 0, 0, sum(behind), max(behind, default=0))
    return RebuildProgress(rebuilder.in_progress, rebuilder.rebuilt, rebuilder.bytes_downloaded, sum(behind),
                           max(behind, default=0))


class RebuildCollector:
    """The rebuild metrics (module docstring), computed at scrape time; register it with a CollectorRegistry."""

    def __init__(self, replicas, fetchers) -> None:
        self.replicas = replicas
        self.fetchers = fetchers

    def describe(self):  # registering must not call collect()
        return []

    def collect(self):
        p = progress(self.replicas, self.fetchers.rebuilder if self.fetchers is not None else None)
        yield GaugeMetricFamily("kvlease_tablet_rebuilds_in_progress",
                                "followed buckets waiting for or in a rebuild from a remote snapshot", value=p.in_progress)
        yield CounterMetricFamily("kvlease_tablet_rebuilds", "followed buckets rebuilt from a remote snapshot",
                                  value=p.rebuilt)
        yield CounterMetricFamily("kvlease_tablet_rebuild_bytes", "snapshot bytes downloaded by rebuilds",
                                  value=p.bytes_downloaded)
        yield GaugeMetricFamily("kvlease_tablet_follower_offsets_behind",
                                "changelog offsets the followed buckets are behind their leaders' log ends (sum)",
                                value=p.behind_sum)
        yield GaugeMetricFamily("kvlease_tablet_follower_offsets_behind_max",
                                "the most changelog offsets one followed bucket is behind its leader's log end",
                                value=p.behind_max)
