"""Python values -> Arrow arrays of a column's type, for :meth:`kvlease.common.codec.RowCodec.to_batch`.

What each type takes (anything else is an InvalidRowError naming the row and the column):

- BOOLEAN: ``bool``; TINYINT, SMALLINT, INT, BIGINT: ``int`` in range (not ``bool``); FLOAT, DOUBLE: ``float``
  or ``int``; STRING: ``str``; BYTES: ``bytes``, ``bytearray``, ``memoryview``; numpy scalars of those kinds too;
- DECIMAL(p,s): ``decimal.Decimal``, ``int`` or ``str`` (read exactly, never through a float; a ``float`` is
  refused), with at most ``s`` digits after the point and ``p - s`` before it;
- DATE: ``datetime.date`` (not a ``datetime``); TIME: ``datetime.time`` without a zone, or int microseconds
  since midnight;
- TIMESTAMP: ``datetime`` (naive = UTC, aware ones are converted to UTC) or int microseconds since the epoch;
  TIMESTAMP_NTZ: a naive ``datetime`` or int microseconds (an aware one is refused: it has no wall-clock time);
- ARRAY: ``list`` or ``tuple``; MAP: ``dict`` or a list of ``(key, value)`` pairs; STRUCT: ``dict`` of field
  name -> value (missing fields are null). Their elements take what their types take, except that a DECIMAL
  inside a nested value takes ``Decimal`` or ``int`` only.
"""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pyarrow as pa

from kvlease.common.codec_types import arrow_type, layout
from kvlease.common.columns import INT_RANGE
from kvlease.common.errors import show

CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError, decimal.InvalidOperation)
_INTEGER = (int, np.integer)
_NUMBER = (float, int, np.floating, np.integer)
#: The Python types each type name takes.
ALLOWED = {
    "BOOLEAN": (bool, np.bool_), "TINYINT": _INTEGER, "SMALLINT": _INTEGER, "INT": _INTEGER, "BIGINT": _INTEGER,
    "FLOAT": _NUMBER, "DOUBLE": _NUMBER, "STRING": (str,), "BYTES": (bytes, bytearray, memoryview),
    "DECIMAL": (decimal.Decimal, int, np.integer, str), "DATE": (datetime.date,),
    "TIME": (datetime.time, int, np.integer), "TIMESTAMP": (datetime.datetime, int, np.integer),
    "TIMESTAMP_NTZ": (datetime.datetime, int, np.integer), "ARRAY": (list, tuple), "MAP": (dict, list),
    "STRUCT": (dict,),
}


def first_bad_type(values: list, text: str, nullable: bool) -> int | None:
    """Index of the first value whose Python type the column type ``text`` does not take (None if all fit)."""
    name = layout(text).name
    allowed = ALLOWED[name]

    def ok(t: type) -> bool:
        if t is type(None):
            return nullable
        if issubclass(t, (bool, np.bool_)) and name != "BOOLEAN":
            return False
        if name == "DATE" and issubclass(t, datetime.datetime):
            return False
        return issubclass(t, allowed)

    if all(ok(t) for t in set(map(type, values))):  # one pass in C over the values
        return None
    return next(i for i, v in enumerate(values) if not ok(type(v)))


def to_array(values: list, text: str) -> pa.Array:
    """``values`` (of types :func:`first_bad_type` let through) as an Arrow array of the column type ``text``;
    one of :data:`CONVERSION_ERRORS` if one cannot be (out of range, too many digits, an aware TIMESTAMP_NTZ)."""
    name = layout(text).name
    if name == "DECIMAL" and any(type(v) is str for v in values):
        values = [decimal.Decimal(v.strip()) if type(v) is str else v for v in values]
    elif name == "TIMESTAMP_NTZ" and any(isinstance(v, datetime.datetime) and v.tzinfo is not None for v in values):
        raise ValueError("an aware datetime has no wall-clock time: TIMESTAMP_NTZ takes a naive one")
    elif name == "TIME" and any(isinstance(v, datetime.time) and v.tzinfo is not None for v in values):
        raise ValueError("TIME takes a time without a zone")
    if name == "DECIMAL":
        check_decimals(values, text)
    elif name == "STRUCT":
        fields = {field for field, _ in layout(text).type.fields}
        unknown = next((set(v) - fields for v in values if isinstance(v, dict) and not set(v) <= fields), None)
        if unknown:
            raise ValueError(f"no field {', '.join(sorted(map(str, unknown)))} in the STRUCT")
    return pa.array(values, type=arrow_type(text))


def check_decimals(values: list, text: str) -> None:
    """ValueError unless every value fits DECIMAL(p,s) exactly (Arrow's own message is about precisions)."""
    type_ = layout(text).type
    for value in values:
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            value = decimal.Decimal(int(value))
        if not isinstance(value, decimal.Decimal):
            continue
        if not value.is_finite():
            raise ValueError(f"{value} is not a number a DECIMAL holds")
        _, digits, exponent = value.as_tuple() if value else (0, (0,), 0)  # not normalize(): it rounds
        digits = list(digits)
        while exponent < 0 and len(digits) > 1 and digits[-1] == 0:  # 1.50 fits DECIMAL(5,1)
            digits.pop()
            exponent += 1
        scale = max(-exponent, 0)
        integer_digits = max(len(digits) + exponent, 0) if value else 0
        if scale > type_.scale or integer_digits > type_.precision - type_.scale:
            raise ValueError(f"{value} does not fit {type_} (at most {type_.precision - type_.scale} digit(s) "
                             f"before the point and {type_.scale} after it)")


def first_unconvertible(values: list, name: str, text: str) -> tuple[int, str] | None:
    """(row, message) of the first value that cannot be converted to the column type ``text``."""
    type_name = layout(text).name
    for i, value in enumerate(values):
        if type_name in INT_RANGE and isinstance(value, int) and not isinstance(value, bool):
            low, high = INT_RANGE[type_name]
            if not low <= value <= high:
                return i, f"row {i}, column {name!r}: {show(value)} is out of range for {text} ({low}..{high})"
        try:
            to_array([value], text)
        except CONVERSION_ERRORS as e:
            return i, f"row {i}, column {name!r}: expected {text}, got {show(value)} ({e})"
    return None
