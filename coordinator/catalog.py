"""Table and partition metadata in memory and its ZooKeeper layout.

``/tables/id_counter`` is a versioned counter: ids are never reused, also
after a drop or a failover. Tables and partitions draw from it alike: a
partition's node is ``/tables/{partition_id}`` (``{"table_id": …,
"partition_id": …, "partition_name": …, "created_ms": …}``), next to its
table's, and like an unpartitioned table's it holds the ``assignment`` of
the partition's buckets: one id names a *physical table* (common/tables.py).
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import errors, zkpaths
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo, TableSpec
from kvlease.common.zk import ZkOp, dumps, loads
from kvlease.coordinator.schema_history import SchemaHistory
from kvlease.coordinator.zk_reads import DATA, read_many


class TableCatalog:
    def __init__(self) -> None:
        self.by_id: dict[int, TableInfo] = {}
        self.by_name: dict[tuple[str, str], int] = {}
        #: Every physical table (an unpartitioned table, a partition's view of its table) by its id: what the
        #: replica assignments and tablet servers key buckets by.
        self.physical: dict[int, TableInfo] = {}
        #: A partitioned table's partitions: table id -> partition name -> partition id.
        self.partitions: dict[int, dict[str, int]] = {}
        self.partition_created_ms: dict[int, int] = {}
        self.databases: set[str] = set()
        self.last_id = 0
        self.counter_version = -1  # -1: the counter node does not exist yet
        #: Each table's schema versions (coordinator/schema_history.py).
        self.history = SchemaHistory()

    # -- queries ----------------------------------------------------------------

    def bucket_count(self, table_id: int) -> int | None:
        """The buckets of an unpartitioned table or of a partition (by its id); None: no such physical table."""
        table = self.physical.get(table_id)
        return table.buckets if table else None

    def physical_table(self, tb: TableBucket) -> TableInfo | None:
        """The physical table a bucket names: the table's, or its partition's (None: no such table or
        partition, or a partition named of an unpartitioned table)."""
        if tb.partition_id is None:
            table = self.by_id.get(tb.table_id)
            return None if table is None or table.partitioned else table
        view = self.physical.get(tb.partition_id)
        return view if view is not None and view.table_id == tb.table_id and view.partition_id is not None else None

    def resolve(self, table_id: int, partition_id: int | None) -> TableInfo:
        """The physical table a request names by ids: TableNotExistError, PartitionNotExistsError (a partition
        that does not exist, or none of a partitioned table) or InvalidRequestError (a partition of an
        unpartitioned table) otherwise."""
        table = self.get_by_id(table_id)
        if partition_id is None:
            if table.partitioned:
                raise errors.PartitionNotExistsError(f"table {table.path} is partitioned: name one of its partitions",
                                                     table=table.path)
            return table
        if not table.partitioned:
            raise errors.InvalidRequestError(f"table {table.path} is not partitioned (the request names partition id "
                                             f"{partition_id})", table=table.path)
        view = self.physical_table(TableBucket(table_id, 0, partition_id))
        if view is None:
            raise errors.PartitionNotExistsError(f"partition id {partition_id} of table {table.path} does not exist "
                                                 f"(dropped, or never made)", table=table.path,
                                                 partition_id=partition_id)
        return view

    def views(self, table: TableInfo) -> list[TableInfo]:
        """The physical tables of a table: itself, or its partitions' views."""
        return self.partitions_of(table.table_id) if table.partitioned else [table]

    def views_named(self, table_id: int, partition_id: int | None) -> tuple[TableInfo, list[TableInfo]]:
        """The table a request names by ids and the physical tables it means: one partition's view, or every
        one of the table's (:meth:`views`); the errors of :meth:`resolve`."""
        table = self.get_by_id(table_id)
        if partition_id is not None or not table.partitioned:
            return table, [self.resolve(table_id, partition_id)]
        return table, self.views(table)

    def partition(self, table: TableInfo, name: str) -> TableInfo | None:
        """The view of ``table``'s partition ``name``; None if it has none of that name."""
        partition_id = self.partitions.get(table.table_id, {}).get(name)
        return None if partition_id is None else self.physical[partition_id]

    def partitions_of(self, table_id: int) -> list[TableInfo]:
        """A table's partitions' views, by name."""
        return [self.physical[pid] for _, pid in sorted(self.partitions.get(table_id, {}).items())]

    def table_path(self, table_id: int) -> str | None:
        """DB.NAME of a table, or of the table of a partition (by its id)."""
        table = self.by_id.get(table_id) or self.physical.get(table_id)
        return table.path if table else None

    def get(self, database: str, name: str) -> TableInfo:
        table_id = self.by_name.get((database, name))
        if table_id is None:
            path = f"{database}.{name}"
            shown = path if len(path) <= errors.SHOW_LIMIT else errors.show(path)  # a raw request's name: capped
            raise errors.TableNotExistError(f"table {shown} does not exist", table=path)
        return self.by_id[table_id]

    def get_by_id(self, table_id: int) -> TableInfo:
        table = self.by_id.get(table_id)
        if table is None:
            raise errors.TableNotExistError(f"table id {table_id} does not exist", table_id=table_id)
        return table

    def list(self, database: str = "") -> list[TableInfo]:
        tables = [t for t in self.by_id.values() if not database or t.database == database]
        return sorted(tables, key=lambda t: (t.database, t.name))

    # -- changes: ops first, then apply ---------------------------------------------

    def create_ops(self, spec: TableSpec, now_ms: int, replication_factor: int = 1,
                   min_insync_replicas: int = 1) -> tuple[TableInfo, list[ZkOp]]:
        table = TableInfo(self.last_id + 1, spec.database, spec.name, spec.columns, spec.primary_key,
                          spec.buckets, now_ms, replication_factor, min_insync_replicas,
                          partition_key=spec.partition_key, max_partitions=spec.max_partitions,
                          auto_partition=spec.auto_partition, row_ttl=spec.row_ttl, bucket_key=spec.bucket_key,
                          merge_engine=spec.merge_engine)
        ops = [self._counter_op(table.table_id)]
        if spec.database not in self.databases:
            ops += [ZkOp("create", zkpaths.database(spec.database)),
                    ZkOp("create", zkpaths.database_tables(spec.database))]
        ops += [ZkOp("create", zkpaths.table(table.table_id), dumps(table.to_json())),
                ZkOp("create", zkpaths.table_name(spec.database, spec.name), dumps({"table_id": table.table_id})),
                ZkOp("create", zkpaths.table_snapshots(table.table_id))]
        if not table.partitioned:
            ops += [ZkOp("create", zkpaths.bucket_snapshots(table.table_id, b)) for b in range(spec.buckets)]
        return table, ops

    def _counter_op(self, last_id: int) -> ZkOp:
        counter = dumps({"last_id": last_id})
        return (ZkOp("create", zkpaths.TABLE_ID_COUNTER, counter) if self.counter_version < 0
                else ZkOp("set", zkpaths.TABLE_ID_COUNTER, counter))

    def add(self, table: TableInfo) -> None:
        self.add_loaded(table)
        self._count(table.table_id)

    def _count(self, new_id: int) -> None:
        if new_id > self.last_id:
            self.last_id = new_id
            self.counter_version += 1

    def drop_ops(self, table: TableInfo) -> list[ZkOp]:
        """Nodes of the table itself (its partitions, and its snapshot handles, are deleted before these)."""
        ops = ([] if table.partitioned else
               [ZkOp("delete", zkpaths.bucket_snapshots(table.table_id, b)) for b in range(table.buckets)])
        return ops + self.history.drop_ops(table.table_id) + [
            ZkOp("delete", zkpaths.table_snapshots(table.table_id)),
            ZkOp("delete", zkpaths.table_name(table.database, table.name)),
            ZkOp("delete", zkpaths.table(table.table_id))]

    def remove(self, table: TableInfo) -> None:
        self.by_id.pop(table.table_id, None)
        self.by_name.pop((table.database, table.name), None)
        self.physical.pop(table.table_id, None)
        self.partitions.pop(table.table_id, None)
        self.history.forget(table.table_id)

    def alter_ops(self, table: TableInfo) -> list[ZkOp]:
        """Store a table's changed definition (same id and name)."""
        return [ZkOp("set", zkpaths.table(table.table_id), dumps(table.to_json()))]

    def replace(self, table: TableInfo) -> None:
        """Take a table's changed definition (with its earlier schemas, from the history); its partitions' views
        follow it."""
        table = self.history.with_past(table)
        self.add_loaded(table)
        for name, pid in self.partitions.get(table.table_id, {}).items():
            self.physical[pid] = table.of_partition(pid, name)

    # -- partitions ----------------------------------------------------------------

    def create_partition_ops(self, table: TableInfo, name: str, now_ms: int) -> tuple[TableInfo, list[ZkOp]]:
        """A new partition's view (with a fresh id) and the nodes that store it: its own, its buckets'
        snapshot parents (its replica assignment is planned apart, as a table's)."""
        view = table.of_partition(self.last_id + 1, name)
        node = {"table_id": table.table_id, "partition_id": view.partition_id, "partition_name": name,
                "created_ms": now_ms}
        ops = [self._counter_op(view.partition_id), ZkOp("create", zkpaths.table(view.partition_id), dumps(node))]
        ops += [ZkOp("create", zkpaths.bucket_snapshots(table.table_id, b, view.partition_id))
                for b in range(table.buckets)]
        return view, ops

    def add_partition(self, view: TableInfo, created_ms: int) -> None:
        self._add_partition(view, created_ms)
        self._count(view.partition_id)

    def _add_partition(self, view: TableInfo, created_ms: int) -> None:
        self.physical[view.partition_id] = view
        self.partitions.setdefault(view.table_id, {})[view.partition_name] = view.partition_id
        self.partition_created_ms[view.partition_id] = created_ms

    def drop_partition_ops(self, view: TableInfo) -> list[ZkOp]:
        """The partition's own nodes (its snapshot handles and assignment are deleted before or with these)."""
        ops = [ZkOp("delete", zkpaths.bucket_snapshots(view.table_id, b, view.partition_id))
               for b in range(view.buckets)]
        return ops + [ZkOp("delete", zkpaths.table(view.partition_id))]

    def remove_partition(self, view: TableInfo) -> None:
        self.physical.pop(view.partition_id, None)
        self.partitions.get(view.table_id, {}).pop(view.partition_name, None)
        self.partition_created_ms.pop(view.partition_id, None)

    # -- loading ------------------------------------------------------------------

    def load(self, zk: KazooClient) -> None:
        self.__init__()
        try:
            data, stat = zk.get(zkpaths.TABLE_ID_COUNTER)
            self.last_id = int(loads(data)["last_id"])
            self.counter_version = stat.version
        except NoNodeError:
            pass
        try:
            self.databases = set(zk.get_children(zkpaths.DATABASES))
        except NoNodeError:
            self.databases = set()
        try:
            names = [n for n in zk.get_children(zkpaths.TABLES) if n.isdigit()]
        except NoNodeError:
            names = []
        partitions = []
        for answer in read_many(zk, [(DATA, zkpaths.table(int(n))) for n in names]):  # a few requests
            if isinstance(answer, Exception):
                raise answer
            node = loads(answer[0])
            if "partition_id" in node:
                partitions.append(node)
            else:
                self.add_loaded(TableInfo.from_json(node))
        for node in partitions:
            table = self.by_id.get(int(node["table_id"]))
            if table is not None:  # else a partition its table's drop did not reach: the drop goes on
                view = table.of_partition(int(node["partition_id"]), node["partition_name"])
                self._add_partition(view, int(node.get("created_ms", 0)))
        self.history.load(zk, sorted(self.by_id))
        for table_id in list(self.history.by_table):  # the altered tables learn their earlier schemas
            if table_id in self.by_id:
                self.replace(self.by_id[table_id])

    def add_loaded(self, table: TableInfo) -> None:
        self.by_id[table.table_id] = table
        self.by_name[(table.database, table.name)] = table.table_id
        self.databases.add(table.database)
        if not table.partitioned:
            self.physical[table.table_id] = table
