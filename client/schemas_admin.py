"""The schema part of the admin client: alter a table (its columns, its comment, or its partitioning) and
read its schema history (docs/schemas.md, "Schema evolution").

:class:`SchemasAdmin` is a part of :class:`kvlease.client.admin.AdminClient`. An alter is one change per
call; a call whose answer was lost is sent again (the coordinator finds the change made and answers the
table as it is: no second version).
"""

from __future__ import annotations

from typing import Callable

from kvlease.client.coordinator_caller import CoordinatorCall
from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.schema_changes import (AddColumn, Change, DropColumn, RenameColumn, SchemaVersion, SetComment,
                                           WidenColumn)
from kvlease.common.schema_wire import change_fields, version_from_pb
from kvlease.common.tables import TableInfo, parse_table_path
from kvlease.common.wire import table_from_pb


class SchemasAdmin:
    """Schema changes and history; a part of :class:`kvlease.client.admin.AdminClient`
    (``admin.alter_table("db.t", add_column="c BIGINT")``)."""

    def __init__(self, call: CoordinatorCall, alter_partitioning: Callable[..., TableInfo]) -> None:
        """``alter_partitioning(path, precreate=, retention=, max_partitions=)``: the partitioning alter
        (:meth:`kvlease.client.partitions_admin.PartitionsAdmin.alter_table`)."""
        self._call = call
        self._alter_partitioning = alter_partitioning

    def alter_table(self, path: str, *, add_column: str | None = None, rename_column: tuple[str, str] | None = None,
                    widen_column: str | None = None, drop_column: str | None = None, comment: str | None = None,
                    precreate: int | None = None, retention: int | None = None,
                    max_partitions: int | None = None) -> TableInfo:
        """Change one thing of table ``path`` (``DB.NAME``) and return the table: ``add_column="c TYPE [COMMENT
        'text']"`` (a nullable column at the end), ``rename_column=("a", "b")``, ``widen_column="c TYPE"``
        (INT to BIGINT, FLOAT to DOUBLE, a DECIMAL's precision up…), ``drop_column="c"``, ``comment="text"``
        (the table's); each makes the table's ``schema_id`` one more (docs/schemas.md, "Schema evolution").
        Or a partitioned table's ``precreate`` / ``retention`` (a negative retention: none) /
        ``max_partitions`` (table.partition.max), together if you like; the coordinator checks the table with
        them at once. InvalidTableError names a refused change (a key column, a narrowing, a name in use…);
        InvalidRequestError for more than one schema change, or a schema change with partitioning settings."""
        asked = (_change(AddColumn, add_column), _rename(rename_column), _change(WidenColumn, widen_column),
                 _change(DropColumn, drop_column), _change(SetComment, comment))
        changes = [c for c in asked if c is not None]
        partitioning = {"precreate": precreate, "retention": retention, "max_partitions": max_partitions}
        partitioning = {k: v for k, v in partitioning.items() if v is not None}
        if len(changes) > 1 or changes and partitioning:
            raise errors.InvalidRequestError("alter_table makes one schema change at a time, and no other: asked "
                                             + ", ".join([type(c).__name__ for c in changes] + list(partitioning)))
        if not changes:
            return self._alter_partitioning(path, **partitioning)
        db, name = parse_table_path(path)
        request = pb.AlterTableRequest(database=db, name=name, **change_fields(changes[0]))
        return table_from_pb(self._call("AlterTable", request).table)

    def schema_history(self, path: str) -> tuple[TableInfo, list[SchemaVersion]]:
        """Table ``path`` and every version of its schema, oldest first (``schema_id``, columns, the change
        that made it and when; a table never altered has one: version 1, its create)."""
        db, name = parse_table_path(path)
        response = self._call("GetSchemaHistory", pb.GetSchemaHistoryRequest(database=db, name=name))
        return table_from_pb(response.table), [version_from_pb(v) for v in response.versions]


def _change(kind: type, value: object) -> Change | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise errors.InvalidRequestError(f"{kind.__name__}: a text, got {errors.show(value)}")
    return kind(value)


def _rename(value: object) -> RenameColumn | None:
    if value is None:
        return None
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, str) for v in value)):
        raise errors.InvalidRequestError(f"rename_column: (old name, new name), got {errors.show(value)}")
    return RenameColumn(value[0], value[1])
