"""A batch column written to a table column: its Arrow type (or a safe widening of it) and values a reader
can turn back into Python values.

Safe widenings (cast on write; anything else is an InvalidRowError naming the column and both types):

- an integer type takes a narrower integer (TINYINT < SMALLINT < INT < BIGINT; an unsigned one narrower
  than it);
- FLOAT takes float16; DOUBLE takes float16 and float32;
- DECIMAL(p,s) takes a decimal with at most ``s`` digits after the point and ``p - s`` before it, and an
  integer type whose every value fits ``p - s`` digits;
- TIMESTAMP takes a timestamp in s, ms or µs (with or without a zone: the values are instants);
  TIMESTAMP_NTZ one in s, ms or µs without a zone; TIME ``time32`` (s, ms) and ``time64('us')``;
- ARRAY, MAP and STRUCT take the same shape (a STRUCT's fields by name, in order) whose parts do.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common import codec_arrays as ca
from kvlease.common.codec_types import arrow_type, to_arrow
from kvlease.common.errors import InvalidRowError
from kvlease.common.types import DataType, parse_type

_INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "BIGINT": 64}
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}  # digits of the largest value of a signed int of each width
_FLOATS = {"FLOAT": (pa.float16(),), "DOUBLE": (pa.float16(), pa.float32())}
_TIME_UNITS = ("s", "ms", "us")
#: The values a reader can turn into Python values: years 1 to 9999 (µs / days since the epoch), a day's µs.
TIMESTAMP_MIN_US = -62_135_596_800_000_000
TIMESTAMP_MAX_US = 253_402_300_799_999_999
DATE_MIN, DATE_MAX = -719_162, 2_932_896
TIME_MAX_US = 86_400_000_000 - 1


def conform(array: pa.Array, name: str, text: str) -> pa.Array:
    """``array`` as the column ``name`` of type ``text`` stores it: as it is, or cast by a safe widening;
    InvalidRowError naming the column and both types otherwise."""
    expected = arrow_type(text)
    if array.type == expected:
        return array
    type_ = parse_type(text)
    if not widens_to(array.type, type_):
        why = " (values could be lost: cast them first)" if _lossy_numbers(array.type, type_) else ""
        raise InvalidRowError(f"column {name!r}: expected {text} ({expected}), got {array.type}{why}")
    try:
        return array.cast(expected)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidRowError(f"column {name!r}: cannot write {array.type} as {text} ({exc})") from None


def widens_to(source: pa.DataType, type_: DataType) -> bool:
    """Values of Arrow type ``source`` fit the column type ``type_`` exactly (see the module docstring)."""
    if source == to_arrow(type_):
        return True
    name, types = type_.name, pa.types
    if name in _INT_BITS:
        return types.is_integer(source) and source.bit_width < _INT_BITS[name]
    if name in _FLOATS:
        return source in _FLOATS[name]
    if name == "DECIMAL":
        if types.is_integer(source):
            digits = _INT_DIGITS[source.bit_width] + (1 if types.is_unsigned_integer(source) and
                                                      source.bit_width == 64 else 0)
            return digits <= type_.precision - type_.scale
        return (types.is_decimal(source) and source.scale <= type_.scale
                and source.precision - source.scale <= type_.precision - type_.scale)
    if name in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return (types.is_timestamp(source) and source.unit in _TIME_UNITS
                and (name == "TIMESTAMP" or source.tz is None))
    if name == "TIME":
        return types.is_time32(source) or (types.is_time64(source) and source.unit == "us")
    return _nested_widens(source, type_)


def _nested_widens(source: pa.DataType, type_: DataType) -> bool:
    types = pa.types
    if type_.name == "ARRAY":
        return (types.is_list(source) or types.is_large_list(source)) and widens_to(source.value_type, type_.element)
    if type_.name == "MAP":
        return types.is_map(source) and widens_to(source.key_type, type_.key) and widens_to(source.item_type,
                                                                                             type_.value)
    if type_.name == "STRUCT":
        return (types.is_struct(source) and [source.field(i).name for i in range(source.num_fields)]
                == [n for n, _ in type_.fields]
                and all(widens_to(source.field(i).type, t) for i, (_, t) in enumerate(type_.fields)))
    return False


def _lossy_numbers(source: pa.DataType, type_: DataType) -> bool:
    numeric = pa.types.is_integer(source) or pa.types.is_floating(source) or pa.types.is_decimal(source)
    return numeric and (type_.name in _INT_BITS or type_.name in _FLOATS or type_.name == "DECIMAL")


def check_values(array: pa.Array, name: str, type_: DataType, nested: bool = False) -> None:
    """InvalidRowError naming the first row whose value of column ``name`` a reader could not turn back into a
    Python value (a TIMESTAMP outside years 1-9999, …) or that does not fit its DECIMAL; nested values too."""
    if type_.name in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        _check_range(array, name, nested, TIMESTAMP_MIN_US, TIMESTAMP_MAX_US, pa.int64(),
                     f"µs since the epoch is outside the {type_.name} range (years 1 to 9999)")
    elif type_.name == "DATE":
        _check_range(array, name, nested, DATE_MIN, DATE_MAX, pa.int32(),
                     "days since the epoch is outside the DATE range (years 1 to 9999)")
    elif type_.name == "TIME":
        _check_range(array, name, nested, 0, TIME_MAX_US, pa.int64(), "µs is not a time of day (0 to 23:59:59.999999)")
    elif type_.name == "DECIMAL":
        try:
            array.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise InvalidRowError(f"column {name!r}: a value does not fit {type_} ({exc})") from None
    elif type_.name == "ARRAY":
        check_values(array.flatten(), name, type_.element, True)
    elif type_.name == "MAP":
        check_values(array.keys, name, type_.key, True)
        check_values(array.items, name, type_.value, True)
    elif type_.name == "STRUCT":
        for field, (_, field_type) in zip(array.flatten(), type_.fields):
            check_values(field, name, field_type, True)


def _check_range(array: pa.Array, name: str, nested: bool, low: int, high: int, as_type: pa.DataType,
                 what: str) -> None:
    numbers = array.view(as_type)
    bounds = pc.min_max(numbers)
    least, most = bounds["min"].as_py(), bounds["max"].as_py()
    if least is None or (least >= low and most <= high):
        return
    values = numbers.fill_null(low).to_numpy()
    i = ca.first((values < low) | (values > high))
    where = f"column {name!r}: an element holds" if nested else f"row {i}, column {name!r}:"
    raise InvalidRowError(f"{where} {int(values[i])} {what}")
