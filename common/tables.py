"""Table metadata: columns, primary key, buckets, partitioning; validation and (de)serialization.

A partitioned table (docs/partitions.md) has no buckets of its own: each of
its partitions has the table's bucket count and replication, and its own
buckets, snapshots and changelogs. Partition ids come from the counter table
ids come from (``/tables/id_counter``), so one number names the buckets of an
unpartitioned table or of one partition: its *physical table*. The
:class:`TableInfo` of a partition is its table's with ``partition_id`` and
``partition_name`` set (:meth:`TableInfo.of_partition`); the coordinator's
replica assignments and the tablet servers key buckets by
:attr:`TableInfo.physical_id`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property

from kvlease.common.bucket_keys import check_bucket_key
from kvlease.common.auto_partition import AutoPartition, check_auto_partition_key
from kvlease.common.columns import MAX_COMMENT, UNASSIGNED, Column, column_type
from kvlease.common.types import parse_type
from kvlease.common.errors import InvalidRequestError, InvalidTableError, show
from kvlease.common.merge_engine import MergeEngine, check_engine, normalized
from kvlease.common.model import TableBucket
from kvlease.common.partition_names import check_partition_key
from kvlease.common.row_ttl import RowTtl, check_row_ttl, with_ttl_column

#: A database, table or column name; always used with fullmatch (``$`` also matches before a final newline).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
NAME_RULE = "1-128 letters, digits and _, not starting with a digit"
MAX_BUCKETS = 1024
#: ``table.partition.max``: the most partitions a table has at once, unless its definition says otherwise.
DEFAULT_MAX_PARTITIONS = 1000
#: The most ``table.partition.max`` may be.
MAX_PARTITIONS = 10_000


@dataclass(frozen=True)
class TableInfo:
    table_id: int
    database: str
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    buckets: int
    created_ms: int = 0
    #: Replicas per bucket (docs/bucket-store.md, "Replication"), and the in-sync replicas a write needs.
    replication_factor: int = 1
    min_insync_replicas: int = 1
    #: The columns (of the primary key) whose values name a partition; empty: not partitioned.
    partition_key: tuple[str, ...] = ()
    #: ``table.partition.max``: the most partitions it has at once.
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    #: Partitions made ahead and dropped past retention by the coordinator (None: only by hand and by writes).
    auto_partition: AutoPartition | None = None
    #: Set on a partition's view of its table (:meth:`of_partition`): the partition's id and name.
    partition_id: int | None = None
    partition_name: str | None = None
    #: The version of its columns (docs/schemas.md, "Schema evolution"): 1 when made, + 1 by every alter of them.
    schema_id: int = 1
    #: The table's comment (``table alter --comment``).
    comment: str = ""
    #: The leading primary-key columns whose values pick a row's bucket (``table create --bucket-key``;
    #: docs/row-encoding.md, "Buckets"); empty: the whole primary key.
    bucket_key: tuple[str, ...] = ()
    #: ``(schema_id, columns)`` of each earlier version of its columns, oldest first: the rows stored then carry
    #: that schema id and are read through it (docs/schemas.md, "Reading rows of earlier schemas"). Filled by the
    #: coordinator from the table's history; not part of its stored definition nor of its equality.
    past_schemas: tuple[tuple[int, tuple[Column, ...]], ...] = field(default=(), compare=False, repr=False)
    #: Rows expire this long after a column's value or their write time (common/row_ttl.py); None: never.
    row_ttl: RowTtl | None = None
    #: What a write to an existing key does (common/merge_engine.py); None: the last write wins.
    merge_engine: MergeEngine | None = None

    def __post_init__(self) -> None:
        """Columns without a field id (``Column(name, type)``) get one: their position if none has one, else
        the next ids after the highest there is."""
        if any(c.id == UNASSIGNED for c in self.columns):
            assigned = [c.id for c in self.columns if c.id != UNASSIGNED]
            ids = iter(range(len(self.columns)) if not assigned else range(max(assigned) + 1, 1 << 31))
            columns = tuple(c if c.id != UNASSIGNED else replace(c, id=next(ids)) for c in self.columns)
            object.__setattr__(self, "columns", columns)

    @property
    def path(self) -> str:
        return f"{self.database}.{self.name}"

    @property
    def partitioned(self) -> bool:
        return bool(self.partition_key)

    @property
    def physical_id(self) -> int:
        """The id of the buckets this names: the partition's id on a partition's view, else the table's."""
        return self.table_id if self.partition_id is None else self.partition_id

    def bucket(self, bucket: int) -> TableBucket:
        return TableBucket(self.table_id, bucket, self.partition_id)

    @cached_property
    def all_buckets(self) -> tuple[TableBucket, ...]:
        """Every bucket of this physical table, by number (made once per table or partition view: a listing
        of a 1,000-partition table's latest snapshots walks 4,000)."""
        return tuple(TableBucket(self.table_id, bucket, self.partition_id) for bucket in range(self.buckets))

    def of_partition(self, partition_id: int, partition_name: str) -> "TableInfo":
        """This (partitioned) table's view of one of its partitions."""
        return replace(self, partition_id=partition_id, partition_name=partition_name)

    @property
    def where(self) -> str:
        """The table, and the partition on a partition's view, for messages: ``table shop.orders`` or
        ``table shop.orders partition 20261127``."""
        table = f"table {self.path}"
        return table if self.partition_name is None else f"{table} partition {self.partition_name}"

    def schema_string(self) -> str:
        return ", ".join(f"{c.name} {c.type}" for c in self.columns)

    def columns_of(self, schema_id: int) -> tuple[Column, ...] | None:
        """The columns of its schema ``schema_id`` (the current one or an earlier one); None if unknown here."""
        if schema_id == self.schema_id:
            return self.columns
        return next((columns for sid, columns in self.past_schemas if sid == schema_id), None)

    def column(self, name: str) -> Column | None:
        """The column named ``name``; None if it has none."""
        return next((c for c in self.columns if c.name == name), None)

    def to_json(self) -> dict:
        return {
            "table_id": self.table_id,
            "db": self.database,
            "name": self.name,
            "schema": columns_to_json(self.columns),
            "schema_id": self.schema_id,
            **({"comment": self.comment} if self.comment else {}),
            "primary_key": list(self.primary_key),
            "buckets": self.buckets,
            "created_ms": self.created_ms,
            "replication_factor": self.replication_factor,
            "min_insync_replicas": self.min_insync_replicas,
            **({"partition_key": list(self.partition_key), "max_partitions": self.max_partitions}
               if self.partitioned else {}),
            **({"auto_partition": self.auto_partition.to_json()} if self.auto_partition else {}),
            **({"row_ttl": self.row_ttl.to_json()} if self.row_ttl else {}),
            **({"bucket_key": list(self.bucket_key)} if self.bucket_key else {}),
            **({"merge_engine": self.merge_engine.to_json()} if self.merge_engine else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> "TableInfo":
        return cls(
            table_id=int(data["table_id"]),
            database=data["db"],
            name=data["name"],
            columns=columns_from_json(data["schema"]),
            primary_key=tuple(data["primary_key"]),
            buckets=int(data["buckets"]),
            created_ms=int(data.get("created_ms", 0)),
            replication_factor=int(data.get("replication_factor", 1)),
            min_insync_replicas=int(data.get("min_insync_replicas", 1)),
            partition_key=tuple(data.get("partition_key", ())),
            max_partitions=int(data.get("max_partitions", DEFAULT_MAX_PARTITIONS)),
            auto_partition=AutoPartition.from_json(data["auto_partition"]) if data.get("auto_partition") else None,
            schema_id=int(data.get("schema_id", 1)),
            comment=str(data.get("comment", "")),
            row_ttl=RowTtl.from_json(data["row_ttl"]) if data.get("row_ttl") else None,
            bucket_key=tuple(data.get("bucket_key", ())),
            merge_engine=MergeEngine.from_json(data["merge_engine"]) if data.get("merge_engine") else None,
        )


def columns_to_json(columns: tuple[Column, ...]) -> list[dict]:
    """Columns as stored in ZooKeeper: name, type, field id, and the comment if it has one."""
    return [{"name": c.name, "type": c.type, "id": c.id, **({"comment": c.comment} if c.comment else {})}
            for c in columns]


def columns_from_json(data: list[dict]) -> tuple[Column, ...]:
    """What :func:`columns_to_json` stored; a column stored before field ids existed takes its position."""
    return tuple(Column(c["name"], c["type"], int(c.get("id", i)), str(c.get("comment", "")))
                 for i, c in enumerate(data))


@dataclass(frozen=True)
class TableSpec:
    """A table as a user asks for it (before it has an id)."""

    database: str
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    buckets: int = field(default=1)
    partition_key: tuple[str, ...] = ()
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    auto_partition: AutoPartition | None = None
    #: ``--ttl``: see :attr:`TableInfo.row_ttl` (a write-time TTL's column is added by :func:`validate_spec`).
    row_ttl: RowTtl | None = None
    bucket_key: tuple[str, ...] = ()
    merge_engine: MergeEngine | None = None


def check_name(what: str, name: str | None) -> None:
    """InvalidTableError stating the rule unless ``name`` is a valid ``what`` (database, table, column) name."""
    if not _NAME.fullmatch(name or ""):
        raise InvalidTableError(f"bad {what} name {show(name)}: {NAME_RULE}")


def parse_table_path(path: str) -> tuple[str, str]:
    """``'db.name'`` -> ``('db', 'name')``; raises InvalidRequestError otherwise."""
    if not isinstance(path, str):
        raise InvalidRequestError(f"bad table name {show(path)}: expected a string DB.NAME")
    parts = path.split(".")
    if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise InvalidRequestError(f"bad table name {show(path)}: expected DB.NAME, each {NAME_RULE}")
    return parts[0], parts[1]


def parse_schema(text: str) -> tuple[Column, ...]:
    """``'id BIGINT, price DECIMAL(12,2), tags ARRAY<STRING>'`` -> columns (types in canonical text); raises
    InvalidTableError naming the bad part."""
    columns = []
    for part in split_top_level(text):
        words = part.split(None, 1)
        if len(words) != 2:
            raise InvalidTableError(f"bad column definition {show(part.strip())}: expected 'NAME TYPE'")
        check_name("column", words[0])
        columns.append(Column(words[0], column_type(words[0], words[1])))
    return tuple(columns)


def split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside ``<>`` and ``()`` (``DECIMAL(12,2)``, ``MAP<K,V>`` stay whole)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def validate_spec(spec: TableSpec) -> TableSpec:
    """The spec with normalized types; raises InvalidTableError naming the problem."""
    for part, what in ((spec.database, "database"), (spec.name, "table")):
        check_name(what, part)
    if not spec.columns:
        raise InvalidTableError("a table needs at least one column")
    spec = replace(spec, columns=with_ttl_column(spec.row_ttl, tuple(spec.columns), Column))
    seen: set[str] = set()
    columns = []
    for column in spec.columns:
        check_name("column", column.name)
        if column.name in seen:
            raise InvalidTableError(f"duplicate column {show(column.name)}")
        seen.add(column.name)
        if not isinstance(column.comment, str) or len(column.comment) > MAX_COMMENT:
            raise InvalidTableError(f"column {column.name}'s comment: a text of at most {MAX_COMMENT} characters, "
                                    f"got {show(column.comment)}")
        columns.append(replace(column, type=column_type(column.name, column.type), id=UNASSIGNED))  # 0..n-1 at create
    if not spec.primary_key:
        raise InvalidTableError("a table needs a primary key")
    types = {column.name: column.type for column in columns}
    for key in spec.primary_key:
        if key not in seen:
            raise InvalidTableError(f"primary key column {show(key)} is not a column of the table")
        if not parse_type(types[key]).keyable:
            raise InvalidTableError(f"primary key column {show(key)} is of type {types[key]}: a key column cannot "
                                    f"be an ARRAY, a MAP or a STRUCT")
    if len(set(spec.primary_key)) != len(spec.primary_key):
        raise InvalidTableError("primary key names a column twice")
    if not 1 <= spec.buckets <= MAX_BUCKETS:
        raise InvalidTableError(f"bucket count must be between 1 and {MAX_BUCKETS}, got {spec.buckets}")
    columns = tuple(columns)
    _check_partitioning(spec, columns)
    check_row_ttl(spec.row_ttl, {c.name: c.type for c in columns})
    check_bucket_key(spec.primary_key, spec.partition_key, spec.bucket_key)
    check_engine(spec.merge_engine, columns, tuple(spec.primary_key))
    return replace(spec, columns=columns, primary_key=tuple(spec.primary_key), partition_key=tuple(spec.partition_key),
                   bucket_key=tuple(spec.bucket_key), merge_engine=normalized(spec.merge_engine, columns))


def _check_partitioning(spec: TableSpec, columns: tuple[Column, ...]) -> None:
    """InvalidTableError unless the spec's partitioning fits its columns and keys (docs/partitions.md)."""
    check_partition_key(columns, spec.primary_key, spec.partition_key)
    if not spec.partition_key:
        if spec.auto_partition is not None:
            raise InvalidTableError("auto-partitioning needs a partition key (--partition-by)")
        return
    if not 1 <= spec.max_partitions <= MAX_PARTITIONS:
        raise InvalidTableError(f"table.partition.max must be between 1 and {MAX_PARTITIONS}, "
                                f"got {spec.max_partitions}")
    if spec.auto_partition is not None:
        check_auto_partition_key(columns, spec.partition_key)
        spec.auto_partition.check_fits(spec.max_partitions)
