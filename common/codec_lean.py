"""A few rows without Arrow: primary keys encoded and stored values decoded one row at a time in Python.

The vectorized codec (:mod:`kvlease.common.codec`) costs a fixed ~0.3 ms per call in numpy and Arrow set-up,
which is most of a single-key lookup's client time. For a handful of keys the table client
(:mod:`kvlease.client.lean_lookup`) uses these instead; they produce exactly the bytes and the Python values
of the vectorized codec (what ``RowCodec.encode_checked_key_array`` makes and what
``RowCodec.decode_values(...).to_pylist()`` returns) and take only what they are sure of: anything else is
``None`` and the caller goes the vectorized way, which gives the answer or the error (layouts:
docs/row-encoding.md).

- :class:`LeanKeys`: keys whose columns are integers (TINYINT..BIGINT), STRING or BYTES, given as ``int``
  (not ``bool``) in range, ``str`` (encodable as UTF-8) or ``bytes``; other key types or values: None.
- :class:`LeanValues`: values of format 2 with the codec's own schema id, of a table without nested
  columns (ARRAY, MAP, STRUCT), whose reader reads the table's columns (no ``read_as``); a value of
  another schema id or format, malformed or with invalid UTF-8: None.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any, Sequence

from kvlease.common.codec_types import DECIMAL_IN_8, layout
from kvlease.common.columns import INT_RANGE

#: struct codes of the fixed-width types in a value (little-endian); a 16-byte DECIMAL: ``16s``.
_VALUE_CODES = {"BOOLEAN": "B", "TINYINT": "b", "SMALLINT": "h", "INT": "i", "BIGINT": "q", "FLOAT": "f",
                "DOUBLE": "d", "DATE": "i", "TIME": "q", "TIMESTAMP": "q", "TIMESTAMP_NTZ": "q"}
_KEY_WIDTHS = {"TINYINT": 1, "SMALLINT": 2, "INT": 4, "BIGINT": 8}
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_HEADER = struct.Struct("<BI")
_VERSION = 2


class LeanKeys:
    """Encodes keys of a table whose primary-key columns all have a lean encoding (else :attr:`usable` is
    False)."""

    def __init__(self, columns: Sequence[Any]) -> None:
        self.kinds = [layout(c.type).name for c in columns]
        self.usable = all(kind in _KEY_WIDTHS or kind in ("STRING", "BYTES") for kind in self.kinds)

    def encode(self, keys: Sequence[Any]) -> list[bytes] | None:
        """The encoded keys of scalars (a one-column key) or tuples / lists (primary-key order); None if one
        is of another form or holds a value this does not take."""
        if not self.usable:
            return None
        single = len(self.kinds) == 1
        out = []
        for key in keys:
            if single and type(key) not in (tuple, list, dict):
                parts = (key,)
            elif type(key) in (tuple, list) and len(key) == len(self.kinds):
                parts = key
            else:
                return None
            pieces = [_key_part(kind, part) for kind, part in zip(self.kinds, parts)]
            if None in pieces:
                return None
            out.append(b"".join(pieces))
        return out


def _key_part(kind: str, value: Any) -> bytes | None:
    """One key column's bytes; None if ``value`` is not a value of ``kind`` this encodes."""
    width = _KEY_WIDTHS.get(kind)
    if width is not None:
        if type(value) is not int:
            return None
        low, high = INT_RANGE[kind]
        if not low <= value <= high:
            return None
        return (value - low).to_bytes(width, "big")  # the sign bit flipped, big-endian
    if kind == "STRING":
        if type(value) is not str:
            return None
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:
            return None
    elif type(value) is bytes:
        raw = value
    else:
        return None
    return raw.replace(b"\x00", b"\x00\xff") + b"\x00\x01"


class LeanValues:
    """Decodes values of the table's own schema id into rows (dicts in table order), as the vectorized codec
    does; :attr:`usable` is False for a table it cannot decode."""

    def __init__(self, columns: Sequence[Any], schema_id: int, usable: bool) -> None:
        self.schema_id = schema_id
        self.names = [c.name for c in columns]
        layouts = [layout(c.type) for c in columns]
        self.usable = usable and all(lay.fixed or lay.name in ("STRING", "BYTES") for lay in layouts)
        self._bitmap = (len(columns) + 7) // 8
        fixed = [j for j, lay in enumerate(layouts) if lay.fixed]
        self._var = [j for j, lay in enumerate(layouts) if not lay.fixed]
        self._var_set = frozenset(self._var)
        codes = "".join(_VALUE_CODES.get(layouts[j].name) or _decimal_code(layouts[j]) for j in fixed)
        self._fixed = struct.Struct("<" + codes + "I" * len(self._var)) if self.usable else None
        self._order = fixed + self._var  # the column of each item the struct unpacks
        self._convert = [_converter(lay) for lay in layouts]
        self._start = _HEADER.size + self._bitmap

    def decode(self, values: Sequence[bytes]) -> list[dict] | None:
        """The rows of ``values``; None if one is not a value this decodes."""
        if not self.usable:
            return None
        try:
            return [self._row(value) for value in values]
        except (struct.error, ValueError, OverflowError, _NotLean):  # UnicodeDecodeError is a ValueError
            return None

    def _row(self, value: bytes) -> dict:
        version, schema_id = _HEADER.unpack_from(value, 0)
        if version != _VERSION or schema_id != self.schema_id:
            raise _NotLean()
        bitmap = int.from_bytes(value[_HEADER.size:self._start], "little")
        items = self._fixed.unpack_from(value, self._start)
        cells: list[Any] = [None] * len(self.names)
        pos = self._start + self._fixed.size
        for j, item in zip(self._order, items):
            if j in self._var_set:
                cells[j] = value[pos:pos + item]
                if len(cells[j]) != item:
                    raise _NotLean()
                pos += item
            else:
                cells[j] = item
        if pos != len(value):
            raise _NotLean()
        return {name: None if bitmap >> j & 1 else convert(cell)
                for j, (name, convert, cell) in enumerate(zip(self.names, self._convert, cells))}


class _NotLean(Exception):
    """A value :class:`LeanValues` leaves to the vectorized codec."""


def _decimal_code(lay) -> str:
    return "q" if lay.type.precision <= DECIMAL_IN_8 else "16s"


def _converter(lay):
    """The Python value Arrow's ``to_pylist`` gives for a column of this layout, from the unpacked item."""
    name = lay.name
    if name == "BOOLEAN":
        return lambda item: item != 0
    if name == "DECIMAL":
        scale = lay.type.scale
        if lay.type.precision > DECIMAL_IN_8:
            return lambda item: _decimal(int.from_bytes(item, "little", signed=True), scale)
        return lambda item: _decimal(item, scale)
    if name == "DATE":
        return lambda item: datetime.date.fromordinal(_EPOCH_ORDINAL + item)
    if name == "TIME":
        return _time
    if name in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return lambda item: _EPOCH + datetime.timedelta(microseconds=item)
    if name == "STRING":
        return lambda item: item.decode("utf-8")
    return _same


def _same(item: Any) -> Any:
    return item


def _decimal(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(unscaled) if not scale else decimal.Decimal(f"{unscaled}E-{scale}")


def _time(micros: int) -> datetime.time:
    if not 0 <= micros < 86_400_000_000:
        raise _NotLean()
    seconds, micro = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return datetime.time(hour, minute, second, micro)
