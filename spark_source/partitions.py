"""The buckets of a read of a partitioned table: bucket keys, and the partitions' table clients as one table.

A read of an unpartitioned table names a bucket by its number, as it always
did (offsets, splits, positions). A partition is a physical table of its own
(docs/partitions.md), so a read of a partitioned table names a bucket by its
**bucket key** ``(partition_id, bucket)``; in a streaming offset's JSON that
key is ``"p{partition_id}-{bucket}"`` (:func:`key_text`), an unpartitioned
table's stays ``"{bucket}"``. Partition ids are never reused, so a key names
one bucket of one partition for good.

:class:`PartitionedTables` answers the table client's position calls
(``end_positions``, ``positions``, ``epochs_at``, ``list_offsets``) by bucket
key, each asked of the partition's own :class:`~kvlease.client.table.TableClient`
(opened when first used). A partition dropped meanwhile answers
PARTITION_NOT_EXISTS: its keys are left out of the answer and its id is added
to ``gone``, for the caller to end its part of the read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterable, Mapping

from kvlease.client.admin import AdminClient
from kvlease.client.log_position import LogPosition
from kvlease.client.lost_ranges import LostRanges, check_losses
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo
from kvlease.spark_source.options import Security, open_table

log = logging.getLogger(__name__)
#: A bucket of an unpartitioned table (its number), or of a partition: ``(partition_id, bucket)``.
BucketKey = int | tuple[int, int]


def key_of(partition_id: int | None, bucket: int) -> BucketKey:
    return bucket if partition_id is None else (partition_id, bucket)


def bucket_of(key: BucketKey) -> int:
    return key if isinstance(key, int) else key[1]


def partition_of(key: BucketKey) -> int | None:
    return None if isinstance(key, int) else key[0]


def table_bucket(table_id: int, key: BucketKey) -> TableBucket:
    return TableBucket(table_id, bucket_of(key), partition_of(key))


def key_text(key: BucketKey) -> str:
    """A key in an offset's JSON: ``"3"``, or ``"p12-3"`` for bucket 3 of partition 12."""
    return str(key) if isinstance(key, int) else f"p{key[0]}-{key[1]}"


def parse_key(text: str) -> BucketKey:
    """The inverse of :func:`key_text`; ValueError for anything else."""
    if text.startswith("p"):
        partition, _, bucket = text[1:].partition("-")
        return int(partition), int(bucket)
    return int(text)


def describe(key: BucketKey, names: Mapping[int, str] | None = None) -> str:
    """``bucket 3`` or ``partition 20261127 bucket 3``, for messages."""
    partition = partition_of(key)
    if partition is None:
        return f"bucket {key}"
    return f"partition {(names or {}).get(partition, partition)} bucket {bucket_of(key)}"


def name_splits(splits: Iterable, names: Mapping[int, str]) -> list:
    """``splits`` with the partition name of each one's ``partition_id`` (from ``names``) filled in."""
    return [s if s.partition_id is None else dataclasses.replace(s, partition_name=names.get(s.partition_id))
            for s in splits]


def keys_of(tables) -> list[BucketKey]:
    """Every bucket key of a read's table: a TableClient's buckets, or a :class:`PartitionedTables`' keys."""
    return tables.keys() if tables.table.partitioned else list(range(tables.table.buckets))


def check_table_losses(admin: AdminClient, table: TableInfo, positions: Mapping[BucketKey, int],
                       seen: Mapping[BucketKey, int], names: Mapping[int, str] | None = None) -> dict[BucketKey, int]:
    """The loss records each bucket has now (``client/lost_ranges.py``), for buckets of the table or of its
    partitions (``names``: their names, for messages); DataLostError if one not seen reused offsets read. A
    dropped partition's buckets are left out."""
    if not table.partitioned:
        return LostRanges(admin, table.table_id, table.path).check(positions, seen)
    out: dict[BucketKey, int] = {}
    _table, assignments = admin.partition_assignments(table.table_id)  # every partition's, in one call
    for partition, group in sorted(_by_partition(positions).items()):
        leaders = assignments.get(partition)
        if leaders is None:  # dropped
            continue
        where = table.of_partition(partition, (names or {}).get(partition, str(partition))).where
        found = check_losses(where, {b: leaders[b].losses for b in group if b in leaders},
                             {b: positions[(partition, b)] for b in group},
                             {b: seen.get((partition, b), 0) for b in group})
        out.update({(partition, b): n for b, n in found.items()})
    return out


def _by_partition(keys: Iterable[BucketKey]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for key in keys:
        groups.setdefault(partition_of(key), []).append(bucket_of(key))
    return groups


class PartitionedTables:
    """Some partitions of a partitioned table, read as one table whose buckets are bucket keys; thread-safe
    enough for one reader (the driver's planning). Close it to close the partitions' clients."""

    def __init__(self, admin: AdminClient, table: TableInfo, security: Security = (),
                 names: Mapping[int, str] | None = None) -> None:
        self.admin = admin
        self.table = table  # the partitioned table (its view of no partition)
        self.security = security
        self.names: dict[int, str] = dict(names or {})
        self.gone: set[int] = set()  # partitions found dropped (PARTITION_NOT_EXISTS) since made
        self._clients: dict[int, TableClient] = {}

    def keys(self) -> list[tuple[int, int]]:
        return [(p, b) for p in sorted(self.names) for b in range(self.table.buckets)]

    def view(self, partition: int) -> TableInfo:
        return self.table.of_partition(partition, self.names.get(partition, str(partition)))

    def set_partitions(self, names: Mapping[int, str]) -> None:
        """Read these partitions from now on (the clients of the others are closed)."""
        self.names = dict(names)
        for partition in [p for p in self._clients if p not in self.names]:
            self._clients.pop(partition).close()

    def client(self, partition: int) -> TableClient:
        """The partition's table client (PartitionNotExistsError if it was dropped)."""
        if partition not in self._clients:
            self._clients[partition] = open_table(self.admin, self.table.table_id, self.security,
                                                  partition=self.view(partition))
        return self._clients[partition]

    def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def __enter__(self) -> "PartitionedTables":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _each(self, keys: Iterable[BucketKey], call: Callable[[TableClient, list[int]], Mapping]) -> dict:
        """``call(client, buckets)`` of each partition of ``keys``, its answer keyed back by bucket key; a
        partition found dropped is left out (and added to ``gone``)."""
        out: dict = {}
        for partition, buckets in sorted(_by_partition(keys).items()):
            try:
                answer = call(self.client(partition), buckets)
            except errors.PartitionNotExistsError as exc:
                log.info("table %s: partition %s was dropped: %s", self.table.path,
                         self.names.get(partition, partition), exc.message)
                self.gone.add(partition)
                client = self._clients.pop(partition, None)
                if client is not None:
                    client.close()
                continue
            out.update({(partition, b): value for b, value in answer.items()})
        return out

    def end_positions(self, keys: Iterable[BucketKey] | None = None) -> dict[BucketKey, LogPosition]:
        return self._each(self.keys() if keys is None else keys, lambda c, buckets: c.end_positions(buckets))

    def positions(self, offsets: Mapping[BucketKey, int]) -> dict[BucketKey, LogPosition]:
        return self._each(offsets, lambda c, buckets: c.positions(
            {b: offsets[(c.table.partition_id, b)] for b in buckets}))

    def epochs_at(self, offsets: Mapping[BucketKey, Iterable[int]]) -> dict[BucketKey, dict[int, int | None]]:
        return self._each(offsets, lambda c, buckets: c.epochs_at(
            {b: offsets[(c.table.partition_id, b)] for b in buckets}))

    def list_offsets(self, buckets: Iterable[BucketKey] | None = None, timestamp: int | None = None) -> dict:
        return self._each(self.keys() if buckets is None else buckets,
                          lambda c, group: c.list_offsets(group, timestamp=timestamp))
