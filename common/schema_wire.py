"""Schema evolution on the wire: a change in an ``AlterTableRequest``, a :class:`SchemaVersion` as a
``SchemaVersionPb`` (common/proto/coordinator.proto), both ways."""

from __future__ import annotations

from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.schema_changes import (AddColumn, Change, DropColumn, RenameColumn, SchemaVersion, SetComment,
                                           WidenColumn)
from kvlease.common.wire import columns_from_pb, columns_to_pb

#: An AlterTableRequest's schema fields (one of them, or none: a partitioning alter).
CHANGE_FIELDS = ("add_column", "rename_column", "widen_column", "drop_column", "comment")
#: Its partitioning fields.
PARTITIONING_FIELDS = ("precreate", "retention", "max_partitions")


def change_fields(change: Change) -> dict:
    """The AlterTableRequest fields that ask for ``change``."""
    if isinstance(change, AddColumn):
        return {"add_column": change.definition}
    if isinstance(change, RenameColumn):
        return {"rename_column": pb.RenameColumnPb(old_name=change.old, new_name=change.new)}
    if isinstance(change, WidenColumn):
        return {"widen_column": change.definition}
    if isinstance(change, DropColumn):
        return {"drop_column": change.name}
    if isinstance(change, SetComment):
        return {"comment": change.text}
    raise errors.InvalidRequestError(f"unknown schema change {errors.show(change)}")


def change_from_pb(msg: pb.AlterTableRequest) -> Change | None:
    """The schema change an AlterTableRequest asks for; None: none (it alters the partitioning);
    InvalidRequestError if it asks for more than one thing."""
    asked = [f for f in CHANGE_FIELDS if msg.HasField(f)]
    if not asked:
        return None
    also = [f for f in PARTITIONING_FIELDS if msg.HasField(f)]
    if len(asked) > 1 or also:
        raise errors.InvalidRequestError(f"an alter makes one schema change at a time, and no other: asked "
                                         f"{', '.join(asked + also)}")
    field = asked[0]
    if field == "rename_column":
        return RenameColumn(msg.rename_column.old_name, msg.rename_column.new_name)
    return {"add_column": AddColumn, "widen_column": WidenColumn, "drop_column": DropColumn,
            "comment": SetComment}[field](getattr(msg, field))


def version_to_pb(version: SchemaVersion) -> pb.SchemaVersionPb:
    return pb.SchemaVersionPb(schema_id=version.schema_id, columns=columns_to_pb(version.columns),
                              change=version.change, time_ms=version.time_ms, comment=version.comment)


def version_from_pb(msg: pb.SchemaVersionPb) -> SchemaVersion:
    return SchemaVersion(msg.schema_id, columns_from_pb(msg.columns), msg.change, msg.time_ms, msg.comment)
