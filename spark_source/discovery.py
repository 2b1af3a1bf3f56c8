"""Partition discovery of a streaming read of a partitioned table (docs/spark.md, "Partitioned tables").

The partitions a query reads are in its offsets (``"partitions"``,
``spark_source/stream_offsets.py``). :class:`PartitionDiscovery` lists the
table's partitions when the reader first plans (a restarted query too) and
then at most every ``partition.discovery.interval``; :func:`follow` applies
a listing to what an offset reads: a partition no longer listed was dropped,
and leaves (its buckets too: its part of the stream ends); a partition listed
for the first time joins, each of its buckets not started yet, so that the
next micro-batch reads it from its beginning (its snapshot and changelog, or
its changelog from offset 0). A partition that joined is in every later
offset until it is dropped, so it is never read from its beginning twice:
partition ids are never reused, and a partition made again under a dropped
one's name is a new partition with a new id.
"""

from __future__ import annotations

import time
from typing import Callable, Container, Mapping

from kvlease.client.admin import AdminClient
from kvlease.common.tables import TableInfo
from kvlease.spark_source.partitions import BucketKey, partition_of
from kvlease.spark_source.stream_offsets import NOT_STARTED


class PartitionDiscovery:
    """Lists a partitioned table's partitions at the first :meth:`poll` and then at most every ``interval_ms``
    (``clock``: seconds, monotonic). A :meth:`listing` asked for outside a poll (a query's start) is what the
    next poll answers."""

    def __init__(self, admin: AdminClient, table: TableInfo, interval_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.admin = admin
        self.table = table
        self.interval_s = interval_ms / 1000.0
        self.clock = clock
        self._last: float | None = None
        self._unpolled: dict[int, str] | None = None

    def listing(self) -> dict[int, str]:
        """The table's partitions now (id -> name); the next :meth:`poll` answers them, and lists again an
        interval from now."""
        self._last = self.clock()
        _table, partitions = self.admin.list_partitions(table_id=self.table.table_id)
        self._unpolled = {p.partition_id: p.name for p in partitions}
        return dict(self._unpolled)

    def poll(self) -> dict[int, str] | None:
        """The listing not polled yet, or a new one if it is due; else None."""
        if self._unpolled is None and (self._last is None or self.clock() - self._last >= self.interval_s):
            self.listing()
        listed, self._unpolled = self._unpolled, None
        return listed


def follow(names: Mapping[int, str], starts: Mapping[BucketKey, tuple[int, int]], listing: Mapping[int, str] | None,
           buckets: int, admitted: Container[int] | None = None
           ) -> tuple[dict[int, str], dict[BucketKey, tuple[int, int]]]:
    """``(names, starts)`` after ``listing`` (None: nothing listed, nothing changes): the partitions it lacks
    leave with their buckets, those it has first join with every bucket ``(-1, NOT_STARTED)``; with
    ``admitted`` (Trigger.AvailableNow's partitions), only those may join."""
    if listing is None:
        return dict(names), dict(starts)
    kept = {p: n for p, n in names.items() if p in listing}
    new = {p: n for p, n in listing.items() if p not in names and (admitted is None or p in admitted)}
    out = {k: v for k, v in starts.items() if partition_of(k) in kept}
    out.update({(p, b): (-1, NOT_STARTED) for p in sorted(new) for b in range(buckets)})
    return {**kept, **new}, out


def dropping(names: Mapping[int, str], starts: Mapping[BucketKey, tuple[int, int]], gone: Container[int]
             ) -> tuple[dict[int, str], dict[BucketKey, tuple[int, int]]]:
    """``(names, starts)`` without the partitions in ``gone`` (found dropped by a call to them)."""
    return ({p: n for p, n in names.items() if p not in gone},
            {k: v for k, v in starts.items() if partition_of(k) not in gone})
