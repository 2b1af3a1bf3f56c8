"""Which partitions of a partitioned table a batch read keeps, from the filters Spark pushes (docs/spark.md).

Spark (4.3) hands a Python source's reader the filters of a query it can
express (``pyspark.sql.datasource``: ``EqualTo``, ``EqualNullSafe``,
``GreaterThan``, ``GreaterThanOrEqual``, ``LessThan``, ``LessThanOrEqual``,
``In``, ``IsNull``, ``IsNotNull``, ``Not``, ``StringStartsWith``,
``StringEndsWith``, ``StringContains``), ANDed, once per planning, and only
with ``spark.sql.python.filterPushdown.enabled`` on (an ``OR`` of two columns
is never pushed). :func:`keeps` evaluates each filter that names a partition
column on a partition's value, three-valued: True, False, or None (unknown: a
value of another Python type than the column's, a nested column, a filter
this module does not know). A partition is left out only if some filter is
False for it: then no row of it can pass that filter, since every row of a
partition has the partition's values (the partition is named by them). A
partition column's value is never null.

Pruning never decides a row: the reader gives every filter back to Spark,
which applies it to the rows read as if nothing had been pushed.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable, Mapping, Sequence

from pyspark.sql.datasource import (EqualNullSafe, EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, IsNotNull,
                                    IsNull, LessThan, LessThanOrEqual, Not, StringContains, StringEndsWith,
                                    StringStartsWith)

from kvlease.common import errors
from kvlease.common.partition_names import parse_partition_name
from kvlease.common.tables import TableInfo

_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    EqualTo: operator.eq, EqualNullSafe: operator.eq, GreaterThan: operator.gt, GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt, LessThanOrEqual: operator.le,
}
_TEXT: dict[type, Callable[[str, str], bool]] = {
    StringStartsWith: str.startswith, StringEndsWith: str.endswith, StringContains: operator.contains,
}


def partition_values(table: TableInfo, name: str) -> dict[str, Any]:
    """``partition column (lower case) -> its value`` of partition ``name``, typed as the column is (a STRING
    a str, an INT or BIGINT an int, a BOOLEAN a bool)."""
    types = {c.name: c.type.upper() for c in table.columns}
    values = parse_partition_name(table.partition_key, name)
    return {column.lower(): _typed(types[column], text) for column, text in zip(table.partition_key, values)}


def _typed(type_: str, text: str) -> Any:
    if type_ in ("INT", "BIGINT"):
        return int(text)
    if type_ == "BOOLEAN":
        return text == "true"
    return text


def _same_type(column_value: Any, value: Any) -> bool:
    """Whether ``value`` compares with ``column_value`` as Spark compares them (a bool is not an int here)."""
    return type(column_value) is type(value)


def evaluate(filter_: Filter, values: Mapping[str, Any]) -> bool | None:
    """``filter_`` on a partition whose partition columns have ``values``: True, False, or None (unknown)."""
    if isinstance(filter_, Not):
        inner = evaluate(filter_.child, values)
        return None if inner is None else not inner
    attribute = getattr(filter_, "attribute", ())
    if len(attribute) != 1 or attribute[0].lower() not in values:
        return None  # not a partition column (or a nested field)
    column_value = values[attribute[0].lower()]
    if isinstance(filter_, IsNull):
        return False
    if isinstance(filter_, IsNotNull):
        return True
    if isinstance(filter_, In):
        candidates = [v for v in filter_.value if v is not None]
        if not all(_same_type(column_value, v) for v in candidates):
            return None
        return column_value in candidates or (None if len(candidates) < len(filter_.value) else False)
    value = getattr(filter_, "value", None)
    if type(filter_) in _COMPARE:
        if value is None:  # x = NULL is never true; x <=> NULL is false for a value that is never null
            return False
        return _COMPARE[type(filter_)](column_value, value) if _same_type(column_value, value) else None
    if type(filter_) in _TEXT and isinstance(column_value, str) and isinstance(value, str):
        return _TEXT[type(filter_)](column_value, value)
    return None


def keeps(filters: Sequence[Filter], values: Mapping[str, Any]) -> bool:
    """Whether a partition with partition-column ``values`` may hold rows that pass every one of ``filters``."""
    return all(evaluate(f, values) is not False for f in filters)


def kept(table: TableInfo, partitions: Iterable[tuple[int, str]], filters: Sequence[Filter]) -> dict[int, str]:
    """``partition id -> name`` of ``partitions`` (id, name) that ``filters`` keep. A name that is not one of
    the table's partition key (there is none) is kept."""
    out = {}
    for partition_id, name in partitions:
        try:
            values = partition_values(table, name)
        except (errors.KvLeaseError, ValueError):  # not a name of this key: nothing to judge it by
            out[partition_id] = name
            continue
        if keeps(filters, values):
            out[partition_id] = name
    return out
