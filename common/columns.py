"""Columns: the types a kvlease table's columns may have, and a column."""

from __future__ import annotations

from dataclasses import dataclass

from kvlease.common.errors import InvalidTableError, show
from kvlease.common.types import NESTED, SIMPLE, parse_type

#: The values an integer column holds, by type.
INT_RANGE = {"TINYINT": (-(1 << 7), (1 << 7) - 1), "SMALLINT": (-(1 << 15), (1 << 15) - 1),
             "INT": (-(1 << 31), (1 << 31) - 1), "BIGINT": (-(1 << 63), (1 << 63) - 1)}

#: The types a table's columns may have: every type of common/types.py (the row codec stores them all:
#: docs/row-encoding.md). ARRAY, MAP and STRUCT may not be in a primary key (common/tables.py checks it).
TYPES = SIMPLE + ("DECIMAL",) + NESTED


def column_type(column: str, text: str) -> str:
    """The canonical text of column ``column``'s type ``text`` (common/types.py); InvalidTableError unless it
    is a type a table may have."""
    try:
        type_ = parse_type(text)
    except InvalidTableError as exc:
        raise InvalidTableError(f"column {show(column)}: {exc.message}") from None
    if type_.name not in TYPES:
        raise InvalidTableError(f"column {show(column)} has type {type_}, which a table cannot have yet "
                                f"(one of {', '.join(TYPES)})")
    return str(type_)


#: The longest comment kept (a column's or a table's).
MAX_COMMENT = 1024

#: A column's field id before its table assigns one (:class:`~kvlease.common.tables.TableInfo` gives such a
#: column its position).
UNASSIGNED = -1


@dataclass(frozen=True)
class Column:
    """A table's column: its ``name``, its ``type`` (canonical text, common/types.py), its field ``id`` and its
    ``comment``. The field id names the column's data for good: a rename keeps it, a column added later gets one
    never used before in its table (docs/schemas.md, "Schema evolution"). ``Column(name, type)`` leaves it
    unassigned: a table made of such columns numbers them 0, 1, … by position."""

    name: str
    type: str
    id: int = UNASSIGNED
    comment: str = ""
