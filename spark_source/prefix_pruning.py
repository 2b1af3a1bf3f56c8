"""Reading only the rows of some bucket-key prefixes: from the filters Spark pushes, or option ``prefix``.

A table with a bucket key (common/bucket_keys.py) keeps every row of one bucket-key value in one bucket, in
one key range. A batch read whose filters hold an equality (``=``, ``<=>``) or ``IN`` on *every* bucket-key
column can only return rows of those values: :func:`filter_prefixes` gives them (every combination), and
:func:`prefix_splits` plans one :class:`~kvlease.spark_source.splits.PrefixSplit` per bucket holding some,
read by prefix lookups on the bucket's leader (the rows as of the read, like ``bootstrap.mode=live``). Other
buckets and other rows are not read. Spark still applies every filter to the rows read, so the answer is
the plain read's.

Only values that compare in Spark as they do as keys prune: a filter value must be of the column's own
Python type (an ``int`` for TINYINT..BIGINT, a ``str`` for STRING, a ``bool`` for BOOLEAN); a FLOAT or
DOUBLE column never prunes (Spark's ``-0.0 = 0.0`` finds a key this one would not), nor do other types.
Anything else (a filter on other columns, a range, an ``OR`` Spark did not push) keeps the plain plan.
Pushed filters arrive only where pushdown is on (spark_source/batch.py: not on Spark 4.3, where a plan made
for one query's filters would be reused for the next); option ``prefix`` works on every Spark.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Mapping, Sequence

from pyspark.sql.datasource import EqualNullSafe, EqualTo, Filter, In

from kvlease.common import errors
from kvlease.common.codec import RowCodec
from kvlease.common.partition_names import partition_name, value_text
from kvlease.common.prefix_codec import PrefixCodec
from kvlease.common.tables import TableInfo
from kvlease.spark_source.splits import PrefixSplit

#: The most prefixes a read is narrowed to (an IN of more values reads the table as usual).
MAX_PREFIXES = 1000
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")


def _python_type(column_type: str) -> type | None:
    kind = column_type.upper()
    return int if kind in _INTEGERS else str if kind == "STRING" else bool if kind == "BOOLEAN" else None


def filter_prefixes(table: TableInfo, filters: Sequence[Filter]) -> list[tuple] | None:
    """The bucket-key values ``filters`` allow (tuples in bucket-key order), or None: they do not pin every
    bucket-key column to values that prune (module docstring)."""
    if not table.bucket_key:
        return None
    types = {c.name.lower(): _python_type(c.type) for c in table.columns}
    allowed: dict[str, set] = {}
    for filter_ in filters:
        attribute = getattr(filter_, "attribute", ())
        if len(attribute) != 1 or type(filter_) not in (EqualTo, EqualNullSafe, In):
            continue
        name = attribute[0].lower()
        values = list(filter_.value) if isinstance(filter_, In) else [filter_.value]
        kind = types.get(name)
        if kind is None or not all(type(v) is kind for v in values if v is not None):
            continue
        values = {v for v in values if v is not None}  # a key value is never null
        allowed[name] = allowed[name] & values if name in allowed else values
    columns = [name.lower() for name in table.bucket_key]
    if not all(name in allowed for name in columns):
        return None
    count = 1
    for name in columns:
        count *= len(allowed[name])
    if count > MAX_PREFIXES:
        return None
    return sorted(itertools.product(*(sorted(allowed[name]) for name in columns)))


def parse_prefix_option(table: TableInfo, text: str) -> list[tuple]:
    """Option ``prefix``: ``col=value[,col=value]`` naming every bucket-key column (an INT..BIGINT, STRING or
    BOOLEAN value as text), or a JSON array of objects ``[{"col": value, …}, …]`` for several prefixes or
    values with commas. OptionError-worthy InvalidRequestError naming the problem."""
    if not table.bucket_key:
        raise errors.InvalidRequestError(f"table {table.path} has no bucket key (table create --bucket-key)")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise errors.InvalidRequestError(f"not a JSON array of objects: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise errors.InvalidRequestError("expected a JSON array of objects (bucket-key column -> value)")
    else:
        items = [_pairs(table, text)]
    codec = PrefixCodec(RowCodec(table))
    batch = codec.to_batch(items)  # InvalidRowError naming a missing, unknown or mistyped column
    return list(dict.fromkeys(zip(*(batch.column(name).to_pylist() for name in codec.names))))


def _pairs(table: TableInfo, text: str) -> dict[str, Any]:
    types = {c.name: c.type for c in table.columns}
    out: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in types:
            raise errors.InvalidRequestError(f"expected COL=VALUE for each bucket-key column "
                                             f"({', '.join(table.bucket_key)}), got {errors.show(part)}")
        kind = _python_type(types[name])
        if kind is None:
            raise errors.InvalidRequestError(f"column {name!r} is {types[name]}: give its value in the JSON form "
                                             f"'[{{\"{name}\": …}}]'")
        out[name] = (int(value) if value.strip().lstrip("-").isdigit() else value) if kind is int else (
            value.strip().lower() == "true" if kind is bool and value.strip().lower() in ("true", "false")
            else value)
    return out


def prefix_splits(table: TableInfo, prefixes: Sequence[tuple],
                  partitions: Mapping[str, int] | None = None) -> list[PrefixSplit]:
    """One split per bucket (of each partition: ``partitions`` maps the table's partition names to their ids;
    a prefix of a partition that does not exist has no rows) holding some of ``prefixes``."""
    codec = PrefixCodec(RowCodec(table))
    groups: dict[tuple[int | None, str | None, int], list[tuple]] = {}
    for prefix in prefixes:
        partition_id = name = None
        if table.partitioned:
            values = dict(zip(table.bucket_key, prefix))
            types = {c.name: c.type for c in table.columns}
            name = partition_name(table.partition_key, [value_text(types[k], values[k]) for k in table.partition_key])
            partition_id = (partitions or {}).get(name)
            if partition_id is None:
                continue
        bucket = int(codec.buckets(codec.encode(codec.to_batch([prefix])))[0])
        groups.setdefault((partition_id, name, bucket), []).append(tuple(prefix))
    return [PrefixSplit(bucket, tuple(found), partition_id, name)
            for (partition_id, name, bucket), found in sorted(groups.items(), key=lambda g: (g[0][0] or 0, g[0][2]))]
