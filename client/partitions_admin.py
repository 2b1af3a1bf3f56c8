"""The partition part of the admin client (docs/partitions.md): create, drop and list a partitioned table's
partitions, and change its partitioning settings.

:class:`PartitionsAdmin` is a part of :class:`kvlease.client.admin.AdminClient`. Every call is
safe to resend after a lost answer: a create with ``ignore_if_exists`` answers the partition
there, a drop with ``ignore_if_not_exists`` of one that is gone answers False, an alter to the
settings the table has changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlease.client.coordinator_caller import CoordinatorCall
from kvlease.client.transport import is_int
from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.partition_names import parse_partition_name, partition_name
from kvlease.common.tables import TableInfo, parse_table_path
from kvlease.common.wire import table_from_pb


@dataclass(frozen=True)
class PartitionInfo:
    partition_id: int
    name: str
    created_ms: int = 0
    #: Past the table's retention, kept because these leases hold a snapshot of it.
    held_by: tuple[str, ...] = ()


def partition_info(msg: pb.PartitionPb) -> PartitionInfo:
    return PartitionInfo(msg.partition_id, msg.name, msg.created_ms, tuple(msg.held_by))


def find_partition(admin, table: TableInfo, name: str) -> TableInfo:
    """The view of ``table``'s partition named ``name`` (normalised as the coordinator names it), asked of
    ``admin`` (anything with ``list_partitions(table_id=…)``, e.g. an AdminClient); PartitionNotExistsError
    naming the partitions there, InvalidRequestError if the table is not partitioned or the name is
    malformed."""
    if not table.partitioned:
        raise errors.InvalidRequestError(f"table {table.path} is not partitioned: leave the partition out",
                                         table=table.path)
    wanted = partition_name(table.partition_key, parse_partition_name(table.partition_key, name))
    _table, partitions = admin.list_partitions(table_id=table.table_id)
    for p in partitions:
        if p.name == wanted:
            return table.of_partition(p.partition_id, p.name)
    there = ", ".join(p.name for p in partitions[:10]) or "none"
    raise errors.PartitionNotExistsError(f"partition {wanted} of table {table.path} does not exist (partitions: "
                                         f"{there}{', …' if len(partitions) > 10 else ''})", table=table.path,
                                         partition=wanted)


class PartitionsAdmin:
    """Partitions; a part of :class:`kvlease.client.admin.AdminClient` (``admin.create_partition(...)``)."""

    def __init__(self, call: CoordinatorCall) -> None:
        self._call = call

    def create_partition(self, path: str, partition: str, ignore_if_exists: bool = False
                         ) -> tuple[TableInfo, PartitionInfo]:
        """Create partition ``partition`` (its name: ``20261127``, or ``region=eu/day=20261127`` for several
        partition columns) of table ``path``; returns the table and the partition.
        PartitionAlreadyExistsError if it exists (with ``ignore_if_exists`` it is returned);
        TooManyPartitionsError past the table's ``table.partition.max``; InvalidRequestError for a bad name
        or a table that is not partitioned."""
        db, name = parse_table_path(path)
        _check_text("partition", partition)
        response = self._call("CreatePartition", pb.CreatePartitionRequest(
            database=db, name=name, partition=partition, ignore_if_exists=ignore_if_exists))
        return table_from_pb(response.table), partition_info(response.partition)

    def drop_partition(self, path: str, partition: str, ignore_if_not_exists: bool = False) -> bool:
        """Drop partition ``partition`` of table ``path``: it leaves every lease that holds it, its data,
        snapshots and files are deleted. True if it dropped it; False if there was none (with
        ``ignore_if_not_exists``, else PartitionNotExistsError)."""
        db, name = parse_table_path(path)
        _check_text("partition", partition)
        try:
            self._call("DropPartition", pb.DropPartitionRequest(database=db, name=name, partition=partition))
        except errors.PartitionNotExistsError:
            if ignore_if_not_exists:
                return False
            raise
        return True

    def list_partitions(self, path: str | None = None, *, table_id: int | None = None
                        ) -> tuple[TableInfo, list[PartitionInfo]]:
        """The table (by ``DB.NAME`` or by id) and its partitions, by name."""
        if path is not None:
            db, name = parse_table_path(path)
            request = pb.ListPartitionsRequest(database=db, name=name)
        else:
            request = pb.ListPartitionsRequest(table_id=table_id)
        response = self._call("ListPartitions", request)
        return table_from_pb(response.table), [partition_info(p) for p in response.partitions]

    def alter_table(self, path: str, *, precreate: int | None = None, retention: int | None = None,
                    max_partitions: int | None = None) -> TableInfo:
        """Change a partitioned table's auto-partition ``precreate`` / ``retention`` (a negative retention:
        none) or its ``table.partition.max`` (None: unchanged); returns the table. The coordinator checks the
        table with them at once."""
        db, name = parse_table_path(path)
        fields = {"precreate": precreate, "retention": retention, "max_partitions": max_partitions}
        for what, value in fields.items():
            if value is not None and not is_int(value):
                raise errors.InvalidRequestError(f"{what}: an int, got {errors.show(value)}")
        request = pb.AlterTableRequest(database=db, name=name,
                                       **{k: int(v) for k, v in fields.items() if v is not None})
        return table_from_pb(self._call("AlterTable", request).table)


def _check_text(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise errors.InvalidRequestError(f"{what}: a name, got {errors.show(value)}")
