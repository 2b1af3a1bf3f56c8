"""The tables and partitions a tablet server holds buckets of, and which of them a request names.

A partition's buckets are kept by the partition's id, an unpartitioned table's by the table's (its
*physical table*: ``common/tables.py``), so the replicas are keyed ``(physical id, bucket)`` and
:class:`HeldTables` keeps the view the coordinator pushed of each physical table held (a partition's
view carries its table's id and the partition's id and name). A request names a bucket by
``table_id`` and, for a partition's bucket, ``partition_id``; :meth:`HeldTables.resolve` finds the
physical id (``partition_id`` if set, else ``table_id``) and checks that the two agree with the views:

==========================================  ===============================================================
the request names                           the answer
==========================================  ===============================================================
a physical table held, by its own ids       its physical id (a bucket of it not led here: NOT_LEADER)
a table not held here, no partition         its id: its buckets are answered as before (NOT_LEADER)
a partitioned table, no partition           PARTITION_NOT_EXISTS: the request must name the partition (if
                                            no partition of it is held here, it is a table not held here)
a partition's id as its table id            TABLE_NOT_EXIST: no table has that id
a partition of an unpartitioned table       INVALID_REQUEST: leave ``partition_id`` unset
a partition held here of another table      PARTITION_NOT_EXISTS (also for a held table's id as a partition)
a partition not held here                   NOT_LEADER if ZooKeeper has it, of that table (a client's
                                            routing is stale, or the push is on its way: it asks the
                                            coordinator again and retries); else PARTITION_NOT_EXISTS
==========================================  ===============================================================

Only the last case reads ZooKeeper (``partition_table``); the views are replaced whole and read unlocked.
A request is resolved before its caller's access to the table is checked (``tablet/authz.py`` needs the
physical table), so the errors name ids only, never a table's name.
"""

from __future__ import annotations

from typing import Callable, Iterable

from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo


def partition_of(request) -> int | None:
    """A request's ``partition_id`` (None: unset, a bucket of an unpartitioned table)."""
    return request.partition_id if request.HasField("partition_id") else None


def where(table_id: int, partition_id: int | None) -> str:
    """``table 3`` or ``partition 7 of table 3``, for a message about ids no view is held of."""
    return f"table {table_id}" if partition_id is None else f"partition {partition_id} of table {table_id}"


class HeldTables:
    """The views of the physical tables held, by physical id (see the module docstring).

    ``partition_table(partition_id)``: the id of the table ZooKeeper has that partition of, None if it
    has no such partition (may raise RetriableError); None: no ZooKeeper (unit tests), a partition not
    held does not exist."""

    def __init__(self, partition_table: Callable[[int], int | None] | None = None) -> None:
        self.partition_table = partition_table
        self._views: dict[int, TableInfo] = {}

    def get(self, physical_id: int) -> TableInfo | None:
        """The view held of ``physical_id`` (a table's or a partition's), None if none (no ZooKeeper read)."""
        return self._views.get(physical_id)

    def add(self, view: TableInfo) -> None:
        """Hold ``view`` too (before a bucket of it serves: requests find it)."""
        self._views = {**self._views, view.physical_id: view}

    def keep(self, views: Iterable[TableInfo]) -> None:
        """Hold exactly ``views`` (those of the buckets held)."""
        self._views = {view.physical_id: view for view in views}

    def partitions_of(self, table_id: int) -> list[TableInfo]:
        """The views held of partitions of the table ``table_id``."""
        return [v for v in self._views.values() if v.table_id == table_id and v.partition_id is not None]

    def dropped(self, ids: Iterable[int]) -> set[int]:
        """The physical ids a push's dropped ``ids`` name: themselves, and the partitions held of those that
        are partitioned tables' ids."""
        ids = set(ids)
        return ids | {view.physical_id for table_id in ids for view in self.partitions_of(table_id)}

    def bucket_of(self, request) -> TableBucket:
        """The bucket a request names (its ``table_id``, ``bucket`` and ``partition_id``), once :meth:`resolve`
        found its physical table (``TableBucket.physical_id``)."""
        partition_id = partition_of(request)
        self.resolve(request.table_id, partition_id)
        return TableBucket(request.table_id, request.bucket, partition_id)

    def resolve(self, table_id: int, partition_id: int | None) -> int:
        """The physical id a request's ``table_id`` and ``partition_id`` name; raises the error of the module
        docstring's table when they do not agree with what is held."""
        views = self._views
        if partition_id is None:
            view = views.get(table_id)
            if view is not None and view.partition_id is not None:
                raise errors.TableNotExistError(
                    f"table id {table_id} does not exist: it is the id of a partition of table {view.table_id}; "
                    f"name that table's id and the partition's (partition_id)", table_id=table_id)
            if view is None and self.partitions_of(table_id):
                raise errors.PartitionNotExistsError(
                    f"table {table_id} is partitioned: a request for one of its buckets must name the partition "
                    f"(partition_id)", table_id=table_id)
            return table_id
        own = views.get(table_id)
        if own is not None and not own.partitioned:
            raise errors.InvalidRequestError(
                f"table {table_id} is not partitioned: leave partition_id unset (it is {partition_id})",
                table_id=table_id, partition_id=partition_id)
        view = views.get(partition_id)
        if view is not None and view.partition_id == partition_id and view.table_id == table_id:
            return partition_id
        if view is not None:
            of = f"of table {view.table_id}" if view.partition_id is not None else "a table's, not a partition's"
            raise errors.PartitionNotExistsError(
                f"{where(table_id, partition_id)} does not exist: id {partition_id} is {of}",
                table_id=table_id, partition_id=partition_id)
        return self._not_held(table_id, partition_id)

    def _not_held(self, table_id: int, partition_id: int) -> int:
        """NotLeaderError for a partition of ``table_id`` ZooKeeper has, PartitionNotExistsError otherwise."""
        owner = None if self.partition_table is None else self.partition_table(partition_id)
        if owner == table_id:
            raise errors.NotLeaderError(
                f"this tablet server holds no bucket of {where(table_id, partition_id)}: retry on the bucket's "
                f"leader", table_id=table_id, partition_id=partition_id)
        raise errors.PartitionNotExistsError(
            f"{where(table_id, partition_id)} does not exist (never created, or dropped)",
            table_id=table_id, partition_id=partition_id)
