"""A table's merge engine: what a write to an existing key does (docs/merge-engines.md).

No engine (``TableInfo.merge_engine is None``): the last write wins, today's semantics. Otherwise:

- ``first_row``: the first row of a key is kept; later writes to it are ignored (no change record) and
  deletes are refused: the change feed is insert-only.
- ``versioned``: a write applies when its ``version_column`` (INT, BIGINT or TIMESTAMP, never null) is >= the
  stored one, else it is ignored. Deletes by key follow ``delete_behavior``.
- ``aggregation``: each non-key column folds the written value into the stored one with its function
  (:data:`FUNCTIONS`; default :data:`DEFAULT_FUNCTION`); sum, product and last_value(_ignore_nulls) also take
  a *retract* row that takes its values back. Deletes by key follow ``delete_behavior``.

This module is the definition only (immutable, checked against the table's columns, JSON for ZooKeeper);
the fold itself is the tablet server's (``tablet/store/merge_fold.py``). Nothing here imports pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvlease.common.columns import Column
from kvlease.common.errors import InvalidTableError, show
from kvlease.common.types import INTEGERS, parse_type


class EngineKind(str, Enum):
    FIRST_ROW = "first_row"
    VERSIONED = "versioned"
    AGGREGATION = "aggregation"


class DeleteBehavior(str, Enum):
    ALLOW = "allow"  # a delete by key deletes the row (-D)
    IGNORE = "ignore"  # a delete by key is dropped without a change record
    DISABLE = "disable"  # a delete by key is refused (InvalidRequestError)


_NUMERIC = (*INTEGERS, "FLOAT", "DOUBLE", "DECIMAL")
_ORDERED = (*_NUMERIC, "STRING", "BYTES", "DATE", "TIME", "TIMESTAMP", "TIMESTAMP_NTZ", "BOOLEAN")
#: function -> the type names (``DataType.name``) it takes; None: any type.
FUNCTIONS: dict[str, tuple[str, ...] | None] = {
    "sum": _NUMERIC, "product": _NUMERIC, "max": _ORDERED, "min": _ORDERED,
    "last_value": None, "last_value_ignore_nulls": None, "first_value": None, "first_value_ignore_nulls": None,
    "listagg": ("STRING",), "bool_and": ("BOOLEAN",), "bool_or": ("BOOLEAN",),
}
#: The functions a retract row may name a (non-null) value of.
RETRACTABLE = frozenset({"sum", "product", "last_value", "last_value_ignore_nulls"})
DEFAULT_FUNCTION = "last_value_ignore_nulls"
#: listagg's separator.
LISTAGG_DELIMITER = ","
VERSION_TYPES = ("INT", "BIGINT", "TIMESTAMP")


@dataclass(frozen=True)
class MergeEngine:
    kind: EngineKind
    #: versioned: the column whose higher (or equal) value wins.
    version_column: str | None = None
    #: aggregation: ``(column, function)`` of the columns not on the default function, in column order once checked.
    aggregates: tuple[tuple[str, str], ...] = ()
    #: versioned and aggregation: what a delete by key does (first_row: always refused).
    delete_behavior: DeleteBehavior = DeleteBehavior.ALLOW

    def function(self, column: str) -> str:
        """The aggregate function of ``column`` (aggregation engine)."""
        return dict(self.aggregates).get(column, DEFAULT_FUNCTION)

    @property
    def deletes(self) -> DeleteBehavior:
        return DeleteBehavior.DISABLE if self.kind is EngineKind.FIRST_ROW else self.delete_behavior

    def describe(self) -> str:
        """One line: ``aggregation (total=sum, n=max; deletes allow)``."""
        parts = []
        if self.version_column:
            parts.append(f"version column {self.version_column}")
        parts += [f"{c}={f}" for c, f in self.aggregates]
        if self.kind is not EngineKind.FIRST_ROW:
            parts.append(f"deletes {self.delete_behavior.value}")
        return f"{self.kind.value} ({', '.join(parts)})" if parts else self.kind.value

    def to_json(self) -> dict:
        return {"kind": self.kind.value,
                **({"version_column": self.version_column} if self.version_column else {}),
                **({"aggregates": {c: f for c, f in self.aggregates}} if self.aggregates else {}),
                "delete_behavior": self.delete_behavior.value}

    @classmethod
    def from_json(cls, data: dict) -> "MergeEngine":
        return cls(EngineKind(data["kind"]), data.get("version_column") or None,
                   tuple((c, f) for c, f in (data.get("aggregates") or {}).items()),
                   DeleteBehavior(data.get("delete_behavior", "allow")))


def parse_aggregates(items) -> dict[str, str]:
    """``COL=FUNCTION`` items (the CLI's ``--agg`` options, the Spark option ``agg`` split at commas) as
    ``{column: function}``; InvalidTableError for an item without a column or a function, or a column named
    twice. The functions are checked by :func:`parse_engine`, the columns by :func:`check_engine`."""
    aggregates: dict[str, str] = {}
    for item in items:
        column, sep, function = (part.strip() for part in item.partition("="))
        if not sep or not column or not function:
            raise InvalidTableError(f"{show(item)}: expected COL=FUNCTION, e.g. total=sum")
        if column in aggregates:
            raise InvalidTableError(f"column {column!r} is named twice")
        aggregates[column] = function
    return aggregates


def parse_engine(kind: str | None, version_column: str | None = None, aggregates: dict[str, str] | None = None,
                 delete_behavior: str | None = None) -> MergeEngine | None:
    """The engine a user's options name (None: last write wins); InvalidTableError for an unknown name or an
    option of another engine. Checked against the columns by :func:`check_engine`."""
    if kind is None or kind in ("", "last_write_wins", "none"):
        for option, given in (("--version-column", version_column), ("--agg", aggregates),
                              ("--delete-behavior", delete_behavior)):
            if given:
                raise InvalidTableError(f"{option} needs a merge engine (--merge-engine), the table has none")
        return None
    try:
        engine = EngineKind(str(kind).lower())
    except ValueError:
        raise InvalidTableError(f"unknown merge engine {show(kind)}: first_row, versioned or aggregation") from None
    if version_column and engine is not EngineKind.VERSIONED:
        raise InvalidTableError(f"a version column is an option of the versioned merge engine, not {engine.value}")
    if aggregates and engine is not EngineKind.AGGREGATION:
        raise InvalidTableError(f"aggregate functions (--agg) are options of the aggregation merge engine, "
                                f"not {engine.value}")
    if delete_behavior and engine is EngineKind.FIRST_ROW:
        raise InvalidTableError("the first_row merge engine refuses every delete: it takes no --delete-behavior")
    try:
        behavior = DeleteBehavior(str(delete_behavior or "allow").lower())
    except ValueError:
        raise InvalidTableError(f"unknown delete behavior {show(delete_behavior)}: allow, ignore or disable") from None
    return MergeEngine(engine, version_column or None,
                       tuple((c, str(f).lower()) for c, f in (aggregates or {}).items()), behavior)


def check_engine(engine: MergeEngine | None, columns: tuple[Column, ...], primary_key: tuple[str, ...]) -> None:
    """InvalidTableError (one line, naming the column) unless ``engine`` fits the table's columns."""
    if engine is None:
        return
    types = {c.name: parse_type(c.type) for c in columns}
    if engine.kind is EngineKind.VERSIONED:
        if not engine.version_column:
            raise InvalidTableError("the versioned merge engine needs a version column (--version-column)")
        type_ = types.get(engine.version_column)
        if type_ is None:
            raise InvalidTableError(f"version column {show(engine.version_column)} is not a column of the table")
        if type_.name not in VERSION_TYPES:
            raise InvalidTableError(f"version column {engine.version_column!r} is {type_}: it must be one of "
                                    f"{', '.join(VERSION_TYPES)}")
    seen = set()
    for column, function in engine.aggregates:
        if column in seen:
            raise InvalidTableError(f"column {show(column)} has two aggregate functions")
        seen.add(column)
        if column not in types:
            raise InvalidTableError(f"aggregate function for {show(column)}: not a column of the table")
        if column in primary_key:
            raise InvalidTableError(f"column {column!r} is a primary key column: it takes no aggregate function")
        if function not in FUNCTIONS:
            raise InvalidTableError(f"column {column!r}: unknown aggregate function {show(function)} "
                                    f"({', '.join(FUNCTIONS)})")
        takes = FUNCTIONS[function]
        if takes is not None and types[column].name not in takes:
            raise InvalidTableError(f"column {column!r} is {types[column]}: {function} takes "
                                    f"{', '.join(takes)}")


def normalized(engine: MergeEngine | None, columns: tuple[Column, ...]) -> MergeEngine | None:
    """``engine`` with its aggregates in column order (two specs naming the same functions compare equal)."""
    if engine is None or not engine.aggregates:
        return engine
    order = {c.name: i for i, c in enumerate(columns)}
    return MergeEngine(engine.kind, engine.version_column,
                       tuple(sorted(engine.aggregates, key=lambda a: order.get(a[0], len(order)))),
                       engine.delete_behavior)

