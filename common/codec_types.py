"""The row codec's view of a column type: its Arrow type and how it is stored in keys and values.

Every type of :mod:`kvlease.common.types` has an Arrow type (:func:`arrow_type`, cached per type text) and a
:class:`Layout` (:func:`layout`): the numpy dtype of its fixed-width bytes in a value and in a key, or none
for the variable-width types (STRING, BYTES) and the nested ones (ARRAY, MAP, STRUCT). The layouts are
described in docs/row-encoding.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa

from kvlease.common.types import DataType, parse_type

#: Arrow type of each type without parameters. TIMESTAMP keeps the Arrow type it always had (no zone: the
#: values are UTC), TIMESTAMP_NTZ has the same one; the column's type says which it is.
SIMPLE_ARROW = {
    "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(), "BIGINT": pa.int64(),
    "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "STRING": pa.string(), "BYTES": pa.binary(),
    "DATE": pa.date32(), "TIME": pa.time64("us"), "TIMESTAMP": pa.timestamp("us"),
    "TIMESTAMP_NTZ": pa.timestamp("us"),
}
#: numpy dtype of each fixed-width type as stored in a value (little-endian).
SIMPLE_VALUE_DTYPE = {"BOOLEAN": "u1", "TINYINT": "<i1", "SMALLINT": "<i2", "INT": "<i4", "BIGINT": "<i8",
                      "FLOAT": "<f4", "DOUBLE": "<f8", "DATE": "<i4", "TIME": "<i8", "TIMESTAMP": "<i8",
                      "TIMESTAMP_NTZ": "<i8"}
#: The largest DECIMAL precision stored in 8 bytes (its unscaled values fit an int64); above: 16 bytes.
DECIMAL_IN_8 = 18


@dataclass(frozen=True)
class Layout:
    """How a column of one type is stored."""
    type: DataType
    arrow: pa.DataType
    #: numpy dtype of the stored value of a fixed-width type (``"V16"``: a 16-byte DECIMAL); None otherwise.
    value_dtype: str | None
    #: numpy dtype of its order-preserving key bytes (unsigned big-endian, or ``"V16"``); None otherwise.
    key_dtype: str | None

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def fixed(self) -> bool:
        return self.value_dtype is not None

    @property
    def width(self) -> int:
        return 0 if self.value_dtype is None else _itemsize(self.value_dtype)

    @property
    def key_width(self) -> int:
        return 0 if self.key_dtype is None else _itemsize(self.key_dtype)


def _itemsize(dtype: str) -> int:
    return 16 if dtype == "V16" else int(dtype[-1])


@lru_cache(maxsize=4096)
def arrow_type(text: str) -> pa.DataType:
    """The Arrow type of the column type ``text`` (any spelling :func:`~kvlease.common.types.parse_type`
    reads); InvalidTableError if it is not a type."""
    return to_arrow(parse_type(text))


def to_arrow(type_: DataType) -> pa.DataType:
    if type_.name in SIMPLE_ARROW:
        return SIMPLE_ARROW[type_.name]
    if type_.name == "DECIMAL":
        return pa.decimal128(type_.precision, type_.scale)
    if type_.name == "ARRAY":
        return pa.list_(to_arrow(type_.element))
    if type_.name == "MAP":
        return pa.map_(to_arrow(type_.key), to_arrow(type_.value))
    return pa.struct([pa.field(name, to_arrow(field)) for name, field in type_.fields])


@lru_cache(maxsize=4096)
def layout(text: str) -> Layout:
    """The :class:`Layout` of the column type ``text``."""
    return layout_of(parse_type(text))


@lru_cache(maxsize=4096)
def layout_of(type_: DataType) -> Layout:
    value_dtype = key_dtype = None
    if type_.name in SIMPLE_VALUE_DTYPE:
        value_dtype = SIMPLE_VALUE_DTYPE[type_.name]
        key_dtype = value_dtype if value_dtype == "u1" else ">u" + value_dtype[-1]
    elif type_.name == "DECIMAL":
        value_dtype, key_dtype = ("<i8", ">u8") if type_.precision <= DECIMAL_IN_8 else ("V16", "V16")
    return Layout(type_, to_arrow(type_), value_dtype, key_dtype)


class ArrowTypes(dict):
    """``{type text: Arrow type}`` for every type text: computed (and kept) the first time one is asked for."""

    def __missing__(self, text: str) -> pa.DataType:
        type_ = arrow_type(text)
        self[text] = type_
        return type_


ARROW_TYPES: dict[str, pa.DataType] = ArrowTypes(SIMPLE_ARROW)
