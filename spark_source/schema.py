"""Spark's view of a table: its columns, the change-feed metadata columns, and Arrow batches as Spark takes them.

Each kvlease type has one Spark type (:func:`spark_type`; docs/schemas.md): TINYINT ``tinyint``, SMALLINT
``smallint``, INT ``int``, BIGINT ``bigint``, FLOAT ``float``, DOUBLE ``double``, DECIMAL(p,s)
``decimal(p,s)``, BOOLEAN ``boolean``, STRING ``string``, BYTES ``binary``, DATE ``date``, TIME ``bigint``
(microseconds since midnight: Spark 4.3 has a ``time`` type, but refuses a streaming query with a column
of it, ``UNSUPPORTED_TIME_TYPE``, and a source gives batch and streaming reads one schema), TIMESTAMP
``timestamp``, TIMESTAMP_NTZ ``timestamp_ntz``, ARRAY/MAP/STRUCT ``array``/``map``/``struct`` of those. A
kvlease TIMESTAMP is int64 microseconds since the epoch (UTC); Spark's TIMESTAMP is the same with a time
zone, so timestamp columns (also inside nested ones) travel as Arrow ``timestamp[us, tz=UTC]``, and TIME
ones as ``int64`` (:func:`spark_arrow_type`; a write casts them back).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, ByteType, DataType, DateType, DecimalType,
                               DoubleType, FloatType, IntegerType, LongType, MapType, ShortType, StringType,
                               StructField, StructType, TimestampNTZType, TimestampType)

from kvlease.client.log_records import LOG_COLUMNS
from kvlease.common.codec_types import SIMPLE_ARROW, to_arrow
from kvlease.common.logentry import ChangeType
from kvlease.common.tables import TableInfo
from kvlease.common.types import DataType as KvType, parse_type

_SIMPLE_SPARK = {
    "BOOLEAN": BooleanType(), "TINYINT": ByteType(), "SMALLINT": ShortType(), "INT": IntegerType(),
    "BIGINT": LongType(), "FLOAT": FloatType(), "DOUBLE": DoubleType(), "STRING": StringType(),
    "BYTES": BinaryType(), "DATE": DateType(), "TIME": LongType(), "TIMESTAMP": TimestampType(),
    "TIMESTAMP_NTZ": TimestampNTZType(),
}


@lru_cache(maxsize=1024)
def spark_type(text: str) -> DataType:
    """The Spark type of the kvlease column type ``text``."""
    return _spark(parse_type(text))


def _spark(type_: KvType) -> DataType:
    if type_.name in _SIMPLE_SPARK:
        return _SIMPLE_SPARK[type_.name]
    if type_.name == "DECIMAL":
        return DecimalType(type_.precision, type_.scale)
    if type_.name == "ARRAY":
        return ArrayType(_spark(type_.element), True)
    if type_.name == "MAP":
        return MapType(_spark(type_.key), _spark(type_.value), True)
    return StructType([StructField(name, _spark(field), True) for name, field in type_.fields])


class SparkTypes(dict):
    """``{kvlease type text: Spark type}`` for every type text, computed the first time one is asked for."""

    def __missing__(self, text: str) -> DataType:
        self[text] = spark_type(text)
        return self[text]


SPARK_TYPES: dict[str, DataType] = SparkTypes()


@lru_cache(maxsize=1024)
def spark_arrow_type(text: str) -> pa.DataType:
    """The Arrow type of a column of type ``text`` in the batches Spark takes and gives: the codec's, with
    timestamps in UTC and TIME as int64 microseconds."""
    return _spark_arrow(parse_type(text))


def _spark_arrow(type_: KvType) -> pa.DataType:
    if type_.name == "TIMESTAMP":
        return UTC_MICROS
    if type_.name == "TIME":
        return pa.int64()
    if type_.name in SIMPLE_ARROW or type_.name == "DECIMAL":
        return to_arrow(type_)
    if type_.name == "ARRAY":
        return pa.list_(pa.field("element", _spark_arrow(type_.element)))
    if type_.name == "MAP":
        return pa.map_(_spark_arrow(type_.key), _spark_arrow(type_.value))
    return pa.struct([pa.field(name, _spark_arrow(field)) for name, field in type_.fields])


CHANGE_TYPE, BUCKET, LOG_OFFSET, COMMIT_TIMESTAMP = "_change_type", "_bucket", "_log_offset", "_commit_timestamp"
METADATA = (CHANGE_TYPE, BUCKET, LOG_OFFSET, COMMIT_TIMESTAMP)
#: ``_change_type`` of each changelog record type, as in Delta's change data feed.
CHANGE_NAMES = {ChangeType.INSERT: "insert", ChangeType.UPDATE_BEFORE: "update_preimage",
                ChangeType.UPDATE_AFTER: "update_postimage", ChangeType.DELETE: "delete"}
UTC_MICROS = pa.timestamp("us", tz="UTC")
_NAMES = pa.array([CHANGE_NAMES[ct] for ct in sorted(CHANGE_NAMES)], pa.string())


def table_schema(table: TableInfo, *, with_changes: bool) -> StructType:
    """The table's columns; with ``with_changes``, then the four metadata columns. A partition column of a
    partitioned table carries a comment saying so (``DESCRIBE`` shows it)."""
    fields = [StructField(c.name, spark_type(c.type), True, _comment(table, c.name)) for c in table.columns]
    if with_changes:
        fields += [StructField(CHANGE_TYPE, StringType(), False), StructField(BUCKET, IntegerType(), False),
                   StructField(LOG_OFFSET, LongType(), False), StructField(COMMIT_TIMESTAMP, TimestampType(), True)]
    return StructType(fields)


def _comment(table: TableInfo, column: str) -> dict | None:
    if column not in table.partition_key:
        return None
    return {"comment": f"partition key ({', '.join(table.partition_key)}) of kvlease table {table.path}"}


def read_columns(table: TableInfo, requested: StructType) -> tuple[str, ...]:
    """The columns of a schema the user gave (``.schema(...)``): any of the table's and the metadata
    columns, with their types. Raises ValueError naming the first column that is not one."""
    known = {f.name.lower(): f for f in table_schema(table, with_changes=True).fields}
    names = []
    for f in requested.fields:
        ours = known.get(f.name.lower())
        if ours is None:
            raise ValueError(f"column '{f.name}' is not a column of table {table.path} nor one of {', '.join(METADATA)}")
        if f.dataType != ours.dataType:
            raise ValueError(f"column '{f.name}' is {ours.dataType.simpleString()} in table {table.path}, "
                             f"not {f.dataType.simpleString()}")
        names.append(ours.name)
    return tuple(names)


def spark_arrow_schema(table: TableInfo, *, with_changes: bool) -> pa.Schema:
    """The Arrow schema of the batches a reader yields (matches :func:`table_schema`)."""
    fields = [pa.field(c.name, spark_arrow_type(c.type)) for c in table.columns]
    if with_changes:
        fields += [pa.field(CHANGE_TYPE, pa.string(), False), pa.field(BUCKET, pa.int32(), False),
                   pa.field(LOG_OFFSET, pa.int64(), False), pa.field(COMMIT_TIMESTAMP, UTC_MICROS)]
    return pa.schema(fields)


def rows_for_spark(rows: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Table rows (the codec's schema) as Spark takes them: timestamps with a zone, TIME as int64 (no copy)."""
    columns = [rows.column(i) if rows.column(i).type == field.type else rows.column(i).cast(field.type)
               for i, field in enumerate(schema.field(n) for n in rows.schema.names)]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema([schema.field(n) for n in rows.schema.names]))


def changes_for_spark(records: pa.RecordBatch, bucket: int, schema: pa.Schema) -> pa.RecordBatch:
    """Decoded changelog records (:func:`kvlease.client.log_records.log_schema`: ``offset``, ``change_type``,
    ``timestamp``, then the table's columns) as change rows: the table's columns, then ``_change_type``,
    ``_bucket``, ``_log_offset``, ``_commit_timestamp``. Columns are taken by position: a table
    column may be named like a record column."""
    n = records.num_rows
    width = len(LOG_COLUMNS)
    columns = [records.column(width + i) for i in range(len(schema) - len(METADATA))]
    columns = [c if c.type == schema.field(i).type else c.cast(schema.field(i).type)
               for i, c in enumerate(columns)]
    change_type = pc.take(_NAMES, records.column(1).cast(pa.int32()))
    committed = pc.multiply(records.column(2), pa.scalar(1000, pa.int64())).cast(UTC_MICROS)
    metadata = [change_type, pa.array(np.full(n, bucket, dtype=np.int32)), records.column(0), committed]
    return pa.RecordBatch.from_arrays(columns + metadata, schema=schema)


def state_rows_as_changes(rows: pa.RecordBatch, bucket: int, log_offset: int, schema: pa.Schema) -> pa.RecordBatch:
    """Bootstrap rows (the state of a bucket up to ``log_offset``, exclusive) as change rows: ``insert``,
    ``_log_offset`` = ``log_offset - 1`` (the last record they contain), no commit timestamp."""
    n = rows.num_rows
    table = rows_for_spark(rows, schema)
    metadata = [pa.repeat(pa.scalar("insert"), n), pa.array(np.full(n, bucket, dtype=np.int32)),
                pa.array(np.full(n, log_offset - 1, dtype=np.int64)), pa.nulls(n, UTC_MICROS)]
    return pa.RecordBatch.from_arrays(list(table.columns) + metadata, schema=schema)
