"""Naming a partition of a partitioned table from its partition-key values.

A partitioned table is split by one or more columns of its primary key, its *partition key* (an
ordered tuple of column names, as Apache Fluss's partitioned primary-key tables are). Every row
belongs to the partition its partition-key values name; a partition is created (by hand or by
auto-partitioning, :mod:`kvlease.common.auto_partition`) before rows are written to it.

- A partition column is a column of the primary key of one of :data:`NAMEABLE_TYPES`; the partition
  key never is the whole primary key (each partition would hold one row per value):
  :func:`check_partition_key`.
- A partition value is a text of a safe alphabet (:data:`PARTITION_VALUE_RULE`): it can be a
  ZooKeeper node name, a directory name and part of a command line as it is. :func:`value_text`
  turns a row's value into it: a STRING as is, an INT or BIGINT in decimal, a BOOLEAN as ``true``
  or ``false``.
- A partition's name: with one partition column, the value itself (``20261127``); with several,
  ``column=value`` for each column in partition-key order, joined by ``/``
  (``region=eu/day=20261127``): :func:`partition_name`, and its inverse for a name a user typed,
  :func:`parse_partition_name`.
"""

from __future__ import annotations

import numbers
import re
from typing import Sequence

from kvlease.common.errors import InvalidRequestError, InvalidTableError, show
from kvlease.common.columns import INT_RANGE, Column

#: The column types whose values can name a partition (a DOUBLE, BYTES or TIMESTAMP value has no one text).
NAMEABLE_TYPES = ("STRING", "INT", "BIGINT", "BOOLEAN")

#: A partition value; always used with fullmatch (``$`` would let a trailing newline through).
_VALUE = re.compile(r"[A-Za-z0-9._-]{1,64}")
PARTITION_VALUE_RULE = "1-64 characters of letters, digits, '.', '_' or '-' (not '.' or '..')"

#: Joins the ``column=value`` parts of a name with several partition columns.
PART_SEPARATOR = "/"


def check_partition_key(columns: Sequence[Column], primary_key: Sequence[str], partition_key: Sequence[str]) -> None:
    """Raise InvalidTableError naming the problem unless ``partition_key`` can partition a table of ``columns``
    and ``primary_key``: each partition column is a column of the table, part of the primary key, named once,
    of one of :data:`NAMEABLE_TYPES`; and the primary key has a column besides them. An empty partition key
    (an unpartitioned table) is fine."""
    if isinstance(partition_key, str):
        raise InvalidTableError(f"partition key {show(partition_key)} must be a list of column names, not a string")
    types = {column.name: column.type.upper() for column in columns}
    seen: set[str] = set()
    for name in partition_key:
        if name not in types:
            raise InvalidTableError(f"partition key column {show(name)} is not a column of the table")
        if name not in primary_key:
            raise InvalidTableError(f"partition key column {show(name)} is not part of the primary key "
                                    f"({', '.join(primary_key)})")
        if name in seen:
            raise InvalidTableError(f"partition key names column {show(name)} twice")
        seen.add(name)
        if types[name] not in NAMEABLE_TYPES:
            raise InvalidTableError(f"partition key column {show(name)} is of type {types[name]}: a partition "
                                    f"column is one of {', '.join(NAMEABLE_TYPES)}")
    if seen and seen == set(primary_key):
        raise InvalidTableError(f"partition key ({', '.join(partition_key)}) is the whole primary key: each "
                                f"partition would hold one row; the primary key needs another column")


def partition_value_problem(value: object) -> str | None:
    """Why ``value`` is not a partition value (a message naming it and the rule), or None if it is one.
    ``.`` and ``..`` are not usable as a ZooKeeper node or a directory name."""
    if isinstance(value, str) and _VALUE.fullmatch(value) and value not in (".", ".."):
        return None
    return f"bad partition value {show(value)}: {PARTITION_VALUE_RULE}"


def _column_words(column: str | None) -> str:
    return f"partition column {show(column)}" if column else "a partition column"


def value_text(column_type: str, value: object, *, column: str | None = None) -> str:
    """The text naming a partition for one partition column's ``value`` in a row: a STRING as is, an INT or
    BIGINT in decimal (any integral number but a bool, in the type's range), a BOOLEAN ``true`` or ``false``.

    Raises InvalidRequestError (one line, naming ``column`` when given) for a missing value (None), a value
    of another Python type, or a text outside :data:`PARTITION_VALUE_RULE`; InvalidTableError for a
    ``column_type`` outside :data:`NAMEABLE_TYPES`."""
    type_ = column_type.upper()
    if type_ not in NAMEABLE_TYPES:
        raise InvalidTableError(f"{_column_words(column)} is of type {show(column_type)}: a partition column "
                                f"is one of {', '.join(NAMEABLE_TYPES)}")
    if value is None:
        raise InvalidRequestError(f"a row has no value for {_column_words(column)}: every row of a partitioned "
                                  f"table names its partition")
    if type_ == "STRING" and isinstance(value, str):
        text = value
    elif type_ in INT_RANGE and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        low, high = INT_RANGE[type_]
        if not low <= int(value) <= high:
            raise InvalidRequestError(f"value {show(value)} of {_column_words(column)} is out of range "
                                      f"for {type_}")
        text = str(int(value))
    elif type_ == "BOOLEAN" and isinstance(value, bool):
        text = "true" if value else "false"
    else:
        raise InvalidRequestError(f"value {show(value)} of {_column_words(column)} is not of type {type_} "
                                  f"(a Python {type(value).__name__})")
    if problem := partition_value_problem(text):
        raise InvalidRequestError(f"{_column_words(column)}: {problem}")
    return text


def partition_name(partition_key: Sequence[str], values: Sequence[str]) -> str:
    """The name of the partition of ``values`` (one per partition-key column, in key order, each a partition
    value): the value itself for one column (``20261127``), ``column=value`` joined by ``/`` in key order
    for several (``region=eu/day=20261127``). Raises InvalidRequestError for a count that does not match
    or a value outside :data:`PARTITION_VALUE_RULE`."""
    if isinstance(values, str):
        raise InvalidRequestError(f"partition values {show(values)} must be a list of values, not a string")
    if not partition_key or len(values) != len(partition_key):
        raise InvalidRequestError(f"partition key ({', '.join(partition_key)}) needs {len(partition_key)} "
                                  f"partition value(s), got {len(values)}")
    for value in values:
        if problem := partition_value_problem(value):
            raise InvalidRequestError(problem)
    if len(partition_key) == 1:
        return values[0]
    return PART_SEPARATOR.join(f"{column}={value}" for column, value in zip(partition_key, values))


def _name_form(partition_key: Sequence[str]) -> str:
    if len(partition_key) == 1:
        return "the partition value itself"
    return PART_SEPARATOR.join(f"{column}=VALUE" for column in partition_key)


def parse_partition_name(partition_key: Sequence[str], name: str) -> tuple[str, ...]:
    """The partition values (in partition-key order) a partition ``name`` stands for: the inverse of
    :func:`partition_name`, for a name a user typed (``--partition P``, ``partition add``). With several
    partition columns each appears exactly once as ``column=value``, in any order.

    Raises InvalidRequestError (one line, stating the expected form) for anything else: an unpartitioned
    table, a part that is not ``column=value``, an unknown, missing or repeated column, a bad value."""
    if not partition_key:
        raise InvalidRequestError(f"the table is not partitioned: no partition is named {show(name)}")
    if not isinstance(name, str):
        raise InvalidRequestError(f"bad partition name {show(name)}: expected a string")

    def bad(why: str) -> InvalidRequestError:
        return InvalidRequestError(f"bad partition name {show(name)}: {why}; expected {_name_form(partition_key)}")

    if len(partition_key) == 1:
        if partition_value_problem(name):
            raise bad(f"not a partition value ({PARTITION_VALUE_RULE})")
        return (name,)
    values: dict[str, str] = {}
    for part in name.split(PART_SEPARATOR):
        column, equals, value = part.partition("=")
        if not equals:
            raise bad(f"{show(part)} is not column=value")
        if column not in partition_key:
            raise bad(f"{show(column)} is not a partition column")
        if column in values:
            raise bad(f"column {show(column)} appears twice")
        if partition_value_problem(value):
            raise bad(f"the value of {column} is not a partition value ({PARTITION_VALUE_RULE})")
        values[column] = value
    if missing := [column for column in partition_key if column not in values]:
        raise bad(f"no value for {', '.join(missing)}")
    return tuple(values[column] for column in partition_key)
