"""Schema evolution's rules: what a change of a table's columns makes of it, or why it is refused.

Pure: no ZooKeeper, no clock (the time is passed in). The coordinator applies them
(coordinator/schemas.py) and stores what they return; docs/schemas.md, "Schema evolution", is the user's
account. A change is one of :class:`AddColumn`, :class:`RenameColumn`, :class:`WidenColumn`,
:class:`DropColumn` and :class:`SetComment`; :func:`apply` takes the table, its schema history (every
:class:`SchemaVersion`, oldest first) and the change, and answers either the altered table and the version
that records it (``schema_id`` + 1), or the table as it is and no version: the change is there already.

That second answer is what makes a change safe to send again after its answer was lost: the same request
finds its own outcome and answers it, without a second version. How each change knows its outcome:

- add ``c T``: a live column ``c`` of type ``T`` with the same comment (another type or comment: refused);
- rename ``a`` to ``b``: no live ``a``, and the live ``b`` has the field id a column ``a`` had in an
  earlier version (field ids are never reused, so that was this rename);
- widen ``c`` to ``T``: ``c`` is of type ``T``;
- drop ``c``: no live ``c``, and an earlier version had one;
- comment: the table's comment is that text.

Refused (InvalidTableError naming the column and why): an unknown or malformed type, a name in use, a
dropped column's name with another type, retyping or renaming or dropping a key or partition column, any
type change that is not a widening (:func:`kvlease.common.types.widens`, here with the DECIMAL scale kept),
dropping the last column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence, Union

from kvlease.common.columns import MAX_COMMENT, Column, column_type
from kvlease.common.errors import InvalidTableError, show
from kvlease.common.tables import TableInfo, check_name, columns_from_json, columns_to_json
from kvlease.common.types import parse_type, widens

#: ``name TYPE COMMENT 'text'`` ('' inside the text is one quote); the type is what is between.
_COMMENT = re.compile(r"\s+COMMENT\s+'((?:[^']|'')*)'\s*$", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class SchemaVersion:
    """One version of a table's schema: its columns, the table's comment, what made it and when."""

    schema_id: int
    columns: tuple[Column, ...]
    change: str
    time_ms: int
    comment: str = ""

    def to_json(self) -> dict:
        return {"schema_id": self.schema_id, "schema": columns_to_json(self.columns), "change": self.change,
                "time_ms": self.time_ms, **({"comment": self.comment} if self.comment else {})}

    @classmethod
    def from_json(cls, data: dict) -> "SchemaVersion":
        return cls(int(data["schema_id"]), columns_from_json(data["schema"]), str(data["change"]),
                   int(data["time_ms"]), str(data.get("comment", "")))

    @classmethod
    def current(cls, table: TableInfo, change: str = "create") -> "SchemaVersion":
        """The version a table is at, as its own node has it (a table never altered has no history stored:
        this is its version 1)."""
        return cls(table.schema_id, table.columns, change, table.created_ms, table.comment)


@dataclass(frozen=True)
class AddColumn:
    """``"c TYPE [COMMENT 'text']"``: a nullable column appended."""
    definition: str


@dataclass(frozen=True)
class RenameColumn:
    old: str
    new: str


@dataclass(frozen=True)
class WidenColumn:
    """``"c TYPE"``: column ``c`` takes the wider ``TYPE``."""
    definition: str


@dataclass(frozen=True)
class DropColumn:
    name: str


@dataclass(frozen=True)
class SetComment:
    text: str


Change = Union[AddColumn, RenameColumn, WidenColumn, DropColumn, SetComment]


@dataclass(frozen=True)
class Outcome:
    """The table after the change; ``version``: what to store, None if the change was there already."""
    table: TableInfo
    version: SchemaVersion | None


def apply(table: TableInfo, history: Sequence[SchemaVersion], change: Change, now_ms: int) -> Outcome:
    """``change`` applied to ``table`` (whose schema versions, oldest first, are ``history``; empty: only the
    current one); InvalidTableError if it is refused (see the module docstring)."""
    history = list(history) or [SchemaVersion.current(table)]
    rule = _RULES.get(type(change))
    if rule is None:
        raise InvalidTableError(f"unknown schema change {show(change)}")
    made = rule(table, history, change)
    if made is None:
        return Outcome(table, None)
    columns, comment, text = made
    altered = replace(table, columns=columns, comment=comment, schema_id=table.schema_id + 1)
    return Outcome(altered, SchemaVersion(altered.schema_id, columns, text, now_ms, comment))


def parse_definition(text: str) -> tuple[str, str, str]:
    """``"c TYPE [COMMENT 'text']"`` -> (name, canonical type, comment); InvalidTableError naming the problem."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidTableError(f"bad column definition {show(text)}: expected 'NAME TYPE [COMMENT '…']'")
    comment = ""
    match = _COMMENT.search(text)
    if match:
        comment, text = match.group(1).replace("''", "'"), text[:match.start()]
    words = text.strip().split(None, 1)
    if len(words) != 2:
        raise InvalidTableError(f"bad column definition {show(text.strip())}: expected 'NAME TYPE [COMMENT '…']'")
    check_name("column", words[0])
    check_comment(f"column {words[0]}'s comment", comment)
    return words[0], column_type(words[0], words[1]), comment


def check_comment(what: str, text: str) -> None:
    if not isinstance(text, str):
        raise InvalidTableError(f"{what}: a text, got {show(text)}")
    if len(text) > MAX_COMMENT:
        raise InvalidTableError(f"{what} is {len(text)} characters, more than {MAX_COMMENT}")


# -- the rules: (columns, comment, what changed), or None when the change is there already ----------------

def _add(table: TableInfo, history: list[SchemaVersion], change: AddColumn):
    name, type_, comment = parse_definition(change.definition)
    live = table.column(name)
    if live is not None:
        if live.type == type_ and live.comment == comment:
            return None  # added already (a retry)
        raise InvalidTableError(f"column {name} exists already in table {table.path} ({live.type}): "
                                f"pick another name, or rename it first")
    _check_dropped_name(table, history, name, type_)
    next_id = 1 + max(c.id for version in [*history, SchemaVersion.current(table)] for c in version.columns)
    column = Column(name, type_, next_id, comment)
    return (*table.columns, column), table.comment, f"add column {name} {type_}"


def _rename(table: TableInfo, history: list[SchemaVersion], change: RenameColumn):
    check_name("column", change.old)
    check_name("column", change.new)
    live = table.column(change.old)
    if live is None:
        target = table.column(change.new)
        if target is not None and any(c.name == change.old and c.id == target.id
                                      for version in history for c in version.columns):
            return None  # renamed already (a retry)
        raise InvalidTableError(f"table {table.path} has no column {change.old}")
    if change.old == change.new:
        raise InvalidTableError(f"column {change.old} is named {change.new} already")
    _check_not_key(table, change.old, "renamed")
    _check_not_merged(table, change.old, "renamed")
    if table.column(change.new) is not None:
        raise InvalidTableError(f"cannot rename column {change.old} to {change.new}: table {table.path} has a "
                                f"column {change.new}")
    _check_dropped_name(table, history, change.new, live.type)
    columns = tuple(replace(c, name=change.new) if c.name == change.old else c for c in table.columns)
    return columns, table.comment, f"rename column {change.old} to {change.new}"


def _widen(table: TableInfo, history: list[SchemaVersion], change: WidenColumn):
    name, type_, comment = parse_definition(change.definition)
    if comment:
        raise InvalidTableError(f"widen column {name}: takes 'NAME TYPE', no comment")
    live = table.column(name)
    if live is None:
        raise InvalidTableError(f"table {table.path} has no column {name}")
    if live.type == type_:
        return None  # widened already (a retry), or asked to stay the same: nothing to do
    _check_not_key(table, name, "retyped")
    old, new = parse_type(live.type), parse_type(type_)
    if not widens(old, new) or (old.name == "DECIMAL" and new.scale != old.scale):
        raise InvalidTableError(f"cannot change column {name} from {live.type} to {type_}: only a widening is "
                                f"allowed (TINYINT -> SMALLINT -> INT -> BIGINT, FLOAT -> DOUBLE, a DECIMAL's "
                                f"precision up with the same scale)")
    columns = tuple(replace(c, type=type_) if c.name == name else c for c in table.columns)
    return columns, table.comment, f"widen column {name} {live.type} to {type_}"


def _drop(table: TableInfo, history: list[SchemaVersion], change: DropColumn):
    check_name("column", change.name)
    if table.column(change.name) is None:
        if change.name in _dropped(table, history):
            return None  # dropped already (a retry)
        raise InvalidTableError(f"table {table.path} has no column {change.name}")
    _check_not_key(table, change.name, "dropped")
    _check_not_merged(table, change.name, "dropped")
    if len(table.columns) == 1:
        raise InvalidTableError(f"cannot drop column {change.name}: it is the last column of table {table.path}")
    columns = tuple(c for c in table.columns if c.name != change.name)
    return columns, table.comment, f"drop column {change.name}"


def _comment(table: TableInfo, _history: list[SchemaVersion], change: SetComment):
    check_comment(f"table {table.path}'s comment", change.text)
    if table.comment == change.text:
        return None
    return table.columns, change.text, "comment"


_RULES = {AddColumn: _add, RenameColumn: _rename, WidenColumn: _widen, DropColumn: _drop, SetComment: _comment}


def _check_not_key(table: TableInfo, name: str, what: str) -> None:
    if name in table.partition_key:
        raise InvalidTableError(f"column {name} of table {table.path} is a partition key column: it cannot be {what}")
    if name in table.primary_key:
        raise InvalidTableError(f"column {name} of table {table.path} is a primary key column: it cannot be {what}")
    if table.row_ttl is not None and name == table.row_ttl.column:
        raise InvalidTableError(f"column {name} of table {table.path} is its row TTL column: it cannot be {what}")


def _check_not_merged(table: TableInfo, name: str, what: str) -> None:
    """InvalidTableError if the table's merge engine names column ``name`` (its version column, or a column
    with an aggregate function of its own): the engine keeps the name (docs/merge-engines.md)."""
    engine = table.merge_engine
    if engine is not None and (name == engine.version_column or name in dict(engine.aggregates)):
        raise InvalidTableError(f"column {name} of table {table.path} is named by its merge engine "
                                f"({engine.describe()}): it cannot be {what}")


def _dropped(table: TableInfo, history: list[SchemaVersion]) -> dict[str, Column]:
    """The columns dropped since ``history`` began, by their last name (and with their last type)."""
    last: dict[int, Column] = {}
    for version in history:
        last.update((c.id, c) for c in version.columns)
    live_ids = {c.id for c in table.columns}
    return {c.name: c for field_id, c in last.items() if field_id not in live_ids}


def _check_dropped_name(table: TableInfo, history: list[SchemaVersion], name: str, type_: str) -> None:
    """InvalidTableError if ``name`` was a column's dropped since with another type than ``type_``."""
    dropped = _dropped(table, history).get(name)
    if dropped is not None and dropped.type != type_:
        raise InvalidTableError(f"column name {name} was a dropped column of type {dropped.type} in table "
                                f"{table.path}: it cannot be used for a column of type {type_}")
