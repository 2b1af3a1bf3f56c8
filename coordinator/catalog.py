"""Table metadata in memory and its ZooKeeper layout.

``/tables/id_counter`` is a versioned counter: ids are never reused, also
after a drop or a failover.
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import errors, zkpaths
from kvlease.common.tables import TableInfo, TableSpec
from kvlease.common.zk import ZkOp, dumps, loads


class TableCatalog:
    def __init__(self) -> None:
        self.by_id: dict[int, TableInfo] = {}
        self.by_name: dict[tuple[str, str], int] = {}
        self.databases: set[str] = set()
        self.last_id = 0
        self.counter_version = -1  # -1: the counter node does not exist yet

    # -- queries ----------------------------------------------------------------

    def bucket_count(self, table_id: int) -> int | None:
        table = self.by_id.get(table_id)
        return table.buckets if table else None

    def table_path(self, table_id: int) -> str | None:
        table = self.by_id.get(table_id)
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
                          spec.buckets, now_ms, replication_factor, min_insync_replicas)
        counter = dumps({"last_id": table.table_id})
        ops = [ZkOp("create", zkpaths.TABLE_ID_COUNTER, counter) if self.counter_version < 0
               else ZkOp("set", zkpaths.TABLE_ID_COUNTER, counter)]
        if spec.database not in self.databases:
            ops += [ZkOp("create", zkpaths.database(spec.database)),
                    ZkOp("create", zkpaths.database_tables(spec.database))]
        ops += [ZkOp("create", zkpaths.table(table.table_id), dumps(table.to_json())),
                ZkOp("create", zkpaths.table_name(spec.database, spec.name), dumps({"table_id": table.table_id})),
                ZkOp("create", zkpaths.table_snapshots(table.table_id))]
        ops += [ZkOp("create", zkpaths.bucket_snapshots(table.table_id, b)) for b in range(spec.buckets)]
        return table, ops

    def add(self, table: TableInfo) -> None:
        self.by_id[table.table_id] = table
        self.by_name[(table.database, table.name)] = table.table_id
        self.databases.add(table.database)
        if table.table_id > self.last_id:
            self.last_id = table.table_id
            self.counter_version += 1

    def drop_ops(self, table: TableInfo) -> list[ZkOp]:
        """Nodes of the table itself (its snapshot handles are deleted before these)."""
        ops = [ZkOp("delete", zkpaths.bucket_snapshots(table.table_id, b)) for b in range(table.buckets)]
        return ops + [ZkOp("delete", zkpaths.table_snapshots(table.table_id)),
                      ZkOp("delete", zkpaths.table_name(table.database, table.name)),
                      ZkOp("delete", zkpaths.table(table.table_id))]

    def remove(self, table: TableInfo) -> None:
        self.by_id.pop(table.table_id, None)
        self.by_name.pop((table.database, table.name), None)

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
        for name, result in [(n, zk.get_async(zkpaths.table(int(n)))) for n in names]:
            data, _ = result.get()
            self.add_loaded(TableInfo.from_json(loads(data)))

    def add_loaded(self, table: TableInfo) -> None:
        self.by_id[table.table_id] = table
        self.by_name[(table.database, table.name)] = table.table_id
        self.databases.add(table.database)
