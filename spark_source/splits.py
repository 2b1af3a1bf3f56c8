"""Splits: what one Spark task reads. Small, frozen and picklable; planned on the driver, read on executors.

Everything an executor needs besides the split travels in :class:`ReadContext`
(held by the reader Spark pickles to every task): the coordinator addresses,
the table, and the remote storage (URI, endpoint, region; credentials come
from the executor's environment). Nothing refers to the driver's local disk.

A split of a partitioned table names its partition (``partition_id`` and
``partition_name``; None for an unpartitioned table): every client call it
makes goes to that partition's buckets (:func:`split_table`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from kvlease.common.storage import RemoteStorage
from kvlease.common.tables import TableInfo


@dataclass(frozen=True)
class ReadContext:
    bootstrap: tuple[str, ...]
    table: TableInfo
    storage: RemoteStorage | None
    columns: tuple[str, ...]  # the requested schema's columns: table columns and metadata columns, any subset
    security: tuple = ()  # spark_source.options.Security: TLS settings of the cluster
    nullable: tuple[bool, ...] = ()  # the requested schema's nullability per column; () = the source's own
    lease_duration_ms: int = 3_600_000  # option lease.duration: a split taking its snapshot back takes it so long


@dataclass(frozen=True)
class HybridSplit(InputPartition):
    """A bucket's snapshot with its changelog from the snapshot's ``log_offset`` to ``end`` merged on top.

    ``release``: the lease to release the bucket from once read (batch reads); streaming
    reads leave that to the query's commit. ``owner``: the token the lease belongs to (the
    plan's, or the streaming query's; None: an unowned lease, a checkpoint older than owners).
    ``end_epoch``: the leader epoch of the entry below ``end`` as planned (None: not known); it
    fences the changelog read, as :class:`LogSplit`'s does.
    """

    bucket: int
    snapshot_id: int
    end: int
    lease_id: str
    release: bool
    owner: str | None = None
    end_epoch: int | None = None
    partition_id: int | None = None
    partition_name: str | None = None


@dataclass(frozen=True)
class LogSplit(InputPartition):
    """Changelog records ``[start, end)`` of a bucket: as change rows, or (``as_state``) as the rows
    they leave behind (a full read of a bucket that has no snapshot yet). ``start_epoch``: the leader
    epoch of the entry just below ``start``, or a later one of the same history (a bound; None: not
    known, the first fetch is not fenced); ``end_epoch``: the leader epoch of the entry below the end of
    the range planned (or a bound), above which no entry the split reads may be (see
    ``spark_source/changelog.py``); ``losses_seen``: the bucket's loss records the plan had seen (to
    name a loss the split runs into as the plan's check would)."""

    bucket: int
    start: int
    end: int
    as_state: bool = False
    start_epoch: int | None = None
    losses_seen: int = 0
    end_epoch: int | None = None
    partition_id: int | None = None
    partition_name: str | None = None


@dataclass(frozen=True)
class LiveSplit(InputPartition):
    """A live scan (ScanKv) of a bucket: its rows as of the scan."""

    bucket: int
    partition_id: int | None = None
    partition_name: str | None = None


@dataclass(frozen=True)
class PrefixSplit(InputPartition):
    """The rows of some bucket-key prefixes (tuples in bucket-key order) of one bucket, by prefix lookups on
    its leader: the rows as of the read (spark_source/prefix_pruning.py)."""

    bucket: int
    prefixes: tuple[tuple, ...]
    partition_id: int | None = None
    partition_name: str | None = None


def split_table(table: TableInfo, split) -> TableInfo:
    """The physical table a split reads: ``table``, or its partition's view for a split of a partition."""
    if split.partition_id is None:
        return table
    return table.of_partition(split.partition_id, split.partition_name or str(split.partition_id))
