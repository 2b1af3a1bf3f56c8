"""The table part of the admin client: create and drop tables (partitioned ones too: docs/partitions.md).

:class:`TablesAdmin` is a part of :class:`kvlease.client.admin.AdminClient`. A create is checked
client-side by the coordinator's own rules (:func:`kvlease.common.tables.validate_spec`) before it is
sent; neither call is resent blindly after a lost answer (``ignore_if_exists`` /
``ignore_if_not_exists`` make a resend safe).
"""

from __future__ import annotations

from typing import Sequence

from kvlease.client.coordinator_caller import CoordinatorCall
from kvlease.client.transport import is_int
from kvlease.common import errors
from kvlease.common.auto_partition import AutoPartition
from kvlease.common.merge_engine import MergeEngine
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.row_ttl import RowTtl
from kvlease.common.tables import DEFAULT_MAX_PARTITIONS, Column, TableInfo, TableSpec, parse_table_path, validate_spec
from kvlease.common.wire import table_from_pb, table_spec_to_pb


class TablesAdmin:
    """Table DDL; a part of :class:`kvlease.client.admin.AdminClient` (``admin.create_table(...)``)."""

    def __init__(self, call: CoordinatorCall) -> None:
        self._call = call

    def create_table(self, path: str, columns: Sequence[Column], primary_key: Sequence[str], buckets: int,
                     ignore_if_exists: bool = False, *, replication_factor: int | None = None,
                     min_insync_replicas: int | None = None, partition_key: Sequence[str] = (),
                     auto_partition: AutoPartition | None = None,
                     max_partitions: int = DEFAULT_MAX_PARTITIONS, row_ttl: RowTtl | None = None,
                     bucket_key: Sequence[str] = (), merge_engine: MergeEngine | None = None) -> TableInfo:
        """Create table ``path`` (``DB.NAME``); returns it. ``columns``: :class:`kvlease.common.tables.Column`
        objects; ``primary_key``: column names; ``buckets``: how many (per partition, for a partitioned
        table); ``replication_factor`` / ``min_insync_replicas`` (None: the coordinator's
        default.replication-factor / min.insync-replicas); ``partition_key``: the primary-key columns whose
        values name a partition, ``auto_partition`` (:class:`kvlease.common.auto_partition.AutoPartition`)
        and ``max_partitions`` (table.partition.max) its partitioning (docs/partitions.md); ``row_ttl``
        (:func:`kvlease.common.row_ttl.row_ttl`, e.g. ``row_ttl("7d", "ts")``) its row TTL (docs/changelog.md); ``bucket_key``: the
        first primary-key columns whose values pick a row's bucket (default: the whole key), for
        ``TableClient.lookup_prefix`` (docs/python-api.md); ``merge_engine``
        (:class:`kvlease.common.merge_engine.MergeEngine`, e.g. ``parse_engine("aggregation", aggregates={"n":
        "sum"})``; None: the last write wins) what a write to an existing key does (docs/merge-engines.md).
        TableAlreadyExistError if it exists (with ``ignore_if_exists``, only if its definition differs: an
        equal one is returned); InvalidTableError for a bad definition; InvalidRequestError if the
        replication factor is more than the live tablet servers."""
        db, name = parse_table_path(path)
        if isinstance(primary_key, str):  # list("id") would be the key ('i', 'd')
            raise errors.InvalidTableError(f"primary_key: a list of column names, e.g. [{errors.show(primary_key)}], not a "
                                           f"string")
        if not all(isinstance(c, Column) for c in columns):
            raise errors.InvalidTableError("columns: common.tables.Column(name, type) objects, e.g. "
                                           "Column('id', 'BIGINT')")
        if row_ttl is not None and not isinstance(row_ttl, RowTtl):
            raise errors.InvalidTableError(f"row_ttl: a common.row_ttl.row_ttl('7d', 'ts'), got {errors.show(row_ttl)}")
        if not is_int(buckets):
            raise errors.InvalidTableError(f"buckets: an int, got {errors.show(buckets)}")
        buckets = int(buckets)
        if isinstance(partition_key, str):
            raise errors.InvalidTableError(f"partition_key: a list of column names, e.g. [{errors.show(partition_key)}], "
                                           f"not a string")
        for what, value in (("replication_factor", replication_factor), ("min_insync_replicas", min_insync_replicas),
                            ("max_partitions", max_partitions)):
            if value is not None and not is_int(value):
                raise errors.InvalidTableError(f"{what}: an int, got {errors.show(value)}")
        spec = validate_spec(TableSpec(db, name, tuple(columns), tuple(primary_key), buckets, tuple(partition_key),
                                       int(max_partitions), auto_partition, row_ttl=row_ttl,  # the coordinator's rules
                                       bucket_key=bucket_key if isinstance(bucket_key, str) else tuple(bucket_key),
                                       merge_engine=merge_engine))
        response = self._call("CreateTable", table_spec_to_pb(
            spec, ignore_if_exists=ignore_if_exists, replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas))
        return table_from_pb(response.table)

    def drop_table(self, path: str, ignore_if_not_exists: bool = False) -> bool:
        """True if it dropped the table; False if there was none (with ``ignore_if_not_exists``, else
        TableNotExistError). The coordinator is asked without its own ignore flag, so it says which."""
        db, name = parse_table_path(path)
        try:
            self._call("DropTable", pb.DropTableRequest(database=db, name=name))
        except errors.TableNotExistError:
            if ignore_if_not_exists:
                return False
            raise
        return True

