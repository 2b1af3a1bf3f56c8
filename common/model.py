"""The lease domain's values: table buckets, leases, snapshot handles."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, NamedTuple

from kvlease.common.errors import show

#: A lease id; use with fullmatch (``$`` would let a trailing newline through). See :func:`lease_id_problem`.
LEASE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
LEASE_ID_RULE = "1-128 characters of letters, digits, '.', '_' or '-' (not '.' or '..')"


def lease_id_problem(lease_id: object) -> str | None:
    """Why ``lease_id`` is not a lease id (a message naming it), or None if it is one. The coordinator
    checks every request with it; clients check with it too, to refuse a bad id before sending it.
    ``.`` and ``..`` are not usable as a ZooKeeper node or a directory name."""
    if isinstance(lease_id, str) and LEASE_ID.fullmatch(lease_id) and lease_id not in (".", ".."):
        return None
    return f"bad lease id {show(lease_id)}: {LEASE_ID_RULE}"


def lease_owner_problem(owner: object) -> str | None:
    """Why ``owner`` is not a lease owner token (the lease id rule), or None if it is one."""
    if lease_id_problem(owner) is None:
        return None
    return f"bad lease owner {show(owner)}: {LEASE_ID_RULE}"


class TableBucket(NamedTuple):
    """``(table_id, partition_id or None, bucket)``: a bucket of an unpartitioned table, or of one partition
    of a partitioned table (``table_id`` is the table's, ``partition_id`` the partition's).

    A named tuple, not a dataclass: a ``lease acquire --latest`` of a 1,000-partition table makes, hashes
    and compares 4,000 of them at every step (listing, request, lease, refcounts, lease file), and a
    tuple's are done in C (~0.06 us a hash instead of ~0.4, ~0.6 us to make one instead of ~2).
    Immutable, hashable and ordered by ``(table_id, bucket, partition_id)`` as before; it also equals
    the plain tuple of its fields."""

    table_id: int
    bucket: int
    partition_id: int | None = None

    @property
    def physical_id(self) -> int:
        """The id its bucket is kept under (common/tables.py): the partition's, else the table's."""
        return self.table_id if self.partition_id is None else self.partition_id

    def sort_key(self) -> tuple[int, int, int]:
        return (self.table_id, -1 if self.partition_id is None else self.partition_id, self.bucket)

    def to_json(self) -> dict:
        return {"table_id": self.table_id, "partition_id": self.partition_id, "bucket": self.bucket}

    @classmethod
    def from_json(cls, data: Mapping) -> "TableBucket":
        return cls(int(data["table_id"]), int(data["bucket"]),
                   None if data.get("partition_id") is None else int(data["partition_id"]))

    def __str__(self) -> str:
        part = "" if self.partition_id is None else f"p{self.partition_id}/"
        return f"{self.table_id}/{part}{self.bucket}"


@dataclass(frozen=True)
class Lease:
    """A lease: its deadline and the snapshot it holds per bucket.

    ``graced``: the deadline is a failover grace the coordinator granted (the
    lease expired while no coordinator was active), not one a client asked
    for; a later failover does not grant it again. Acquire and renew clear it.

    ``owner``: the token of the one reader the lease belongs to (None: an unowned
    lease, shared by whoever names it). While the lease lives, an acquire must
    carry the same owner (for an unowned lease, none): a second reader that
    picked the same lease id is refused instead of moving the first one's
    snapshots. Not a credential: ACLs decide who may use a lease at all.
    """

    lease_id: str
    expiration_time: int  # ms since the epoch
    buckets: Mapping[TableBucket, int] = field(default_factory=dict)
    graced: bool = False
    owner: str | None = None

    def tables(self) -> set[int]:
        return set(self._by_table)

    def partitions(self) -> set[tuple[int, int]]:
        """(table id, partition id) of every partition it holds a bucket of."""
        return set(self._partitions)

    def table_buckets(self, table_id: int) -> dict[TableBucket, int]:
        return dict(self._by_table.get(table_id, {}))

    # A lease's buckets never change (a change is a new Lease): they are grouped once, not at each of
    # the questions an acquire's write asks (tables changed, each table's file, the per-table and
    # per-partition counts): 4,000 buckets for a 1,000-partition table's ``--latest``. Not fields.

    @cached_property
    def _by_table(self) -> dict[int, dict[TableBucket, int]]:
        groups: dict[int, dict[TableBucket, int]] = {}
        for tb, sid in self.buckets.items():
            group = groups.get(tb.table_id)
            if group is None:
                group = groups[tb.table_id] = {}
            group[tb] = sid
        return groups

    @cached_property
    def _partitions(self) -> frozenset[tuple[int, int]]:
        return frozenset([(tb.table_id, tb.partition_id) for tb in self.buckets if tb.partition_id is not None])

    def sorted_buckets(self) -> list[tuple[TableBucket, int]]:
        return sorted(self.buckets.items(), key=lambda item: item[0].sort_key())


@dataclass(frozen=True)
class SnapshotFile:
    path: str  # relative to remote.data.dir
    size: int


@dataclass(frozen=True, slots=True)
class SnapshotHandle:
    """A completed KV snapshot of one bucket, as committed by its tablet server. (Slots: a frozen
    dataclass sets each field through ``object.__setattr__``, a third cheaper on a slot; a client's
    listing of a 1,000-partition table makes 4,000.)"""

    bucket: TableBucket
    snapshot_id: int
    log_offset: int
    metadata_path: str
    files: tuple[SnapshotFile, ...] = ()
    commit_time_ms: int = 0

    def file_paths(self) -> set[str]:
        paths = {f.path for f in self.files}
        if self.metadata_path:
            paths.add(self.metadata_path)
        return paths

    def to_json(self) -> dict:
        return {
            "bucket": self.bucket.to_json(),
            "snapshot_id": self.snapshot_id,
            "log_offset": self.log_offset,
            "metadata_path": self.metadata_path,
            "files": [{"path": f.path, "size": f.size} for f in self.files],
            "commit_time_ms": self.commit_time_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> "SnapshotHandle":
        return cls(TableBucket.from_json(data["bucket"]), int(data["snapshot_id"]), int(data["log_offset"]),
                   data.get("metadata_path", ""),
                   tuple(SnapshotFile(f["path"], int(f["size"])) for f in data.get("files", [])),
                   int(data.get("commit_time_ms", 0)))
