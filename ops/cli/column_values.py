"""Column values of the ``kvlease`` command line: from JSON or text (``put``, ``get``, ``delete``, CSV cells) to
what :meth:`kvlease.common.codec.RowCodec.to_batch` takes, and from rows read back to JSON (``--json``).

JSON forms (input; the output uses the first form of each, docs/schemas.md):

- DECIMAL: a string (``"12.50"``) or a JSON number, read exactly (never through a float);
- DATE: ``"YYYY-MM-DD"``; TIME: ``"HH:MM:SS.ffffff"`` (or integer microseconds since midnight);
- TIMESTAMP: ISO 8601 text (no zone = UTC; a zone is converted to UTC) or integer microseconds since the
  epoch; TIMESTAMP_NTZ: ISO 8601 text without a zone, or integer microseconds;
- BYTES: base64 text; FLOAT / DOUBLE: a number, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
- ARRAY: a JSON array; STRUCT: a JSON object of field -> value; MAP: a JSON object (its keys are text, read
  as the MAP's key type) or an array of ``[key, value]`` pairs. Output: a MAP with STRING keys is an
  object, any other MAP an array of ``[key, value]`` pairs (an empty MAP prints as ``[]``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any

from kvlease.common import errors
from kvlease.common.columns import INT_RANGE
from kvlease.common.types import DataType, parse_type

_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")  # fullmatch; [0-9], not \d: int() rejects some Unicode digits
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
#: The texts a NaN or infinite FLOAT / DOUBLE prints as (JSON has no such numbers); ``put`` takes them back.
DOUBLE_TEXTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def loads(text: str) -> Any:
    """JSON text with every non-integer number as an exact ``Decimal`` (:func:`convert_value` turns it into
    a float where the column is FLOAT or DOUBLE)."""
    return json.loads(text, parse_float=Decimal)


def convert_value(value: Any, type_: str | DataType) -> Any:
    """A column value from a JSON value (as :func:`loads` reads it) or command-line text -> what
    ``RowCodec.to_batch`` takes; ValueError saying what was expected."""
    if value is None:
        return None
    kind = parse_type(type_) if isinstance(type_, str) else type_
    if kind.nested:
        if isinstance(value, str):
            try:
                value = loads(value)
            except ValueError:
                raise ValueError(f"expected JSON text for {kind}, got {errors.show(value)}") from None
        return _nested(value, kind)
    converted = _simple(value, kind)
    if converted is _BAD:
        raise ValueError(f"expected {kind}, got {errors.show(value)}")
    return converted


_BAD = object()


def _simple(value: Any, kind: DataType) -> Any:
    text = isinstance(value, str)
    name = kind.name
    if name == "BOOLEAN":
        if isinstance(value, bool):
            return value
        if text and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
    elif name in INT_RANGE:
        number = int(value) if text and _INTEGER.fullmatch(value) else value
        if isinstance(number, int) and not isinstance(number, bool):
            lo, hi = INT_RANGE[name]
            if not lo <= number <= hi:
                raise ValueError(f"{number} is out of range for {name}")
            return number
    elif name in ("FLOAT", "DOUBLE"):
        if text:
            return DOUBLE_TEXTS[value] if value in DOUBLE_TEXTS else _float(value)
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            return float(value)
    elif name == "DECIMAL":
        return _decimal(value)
    elif name == "STRING":
        if text:
            return value
    elif name == "BYTES":
        if text:
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"expected base64 text for BYTES, got {errors.show(value)}") from None
    else:
        return _temporal(value, name)
    return _BAD


def _float(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return _BAD


def _decimal(value: Any) -> Any:
    if isinstance(value, (Decimal, int)) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"expected a decimal number (text or a JSON number), got {errors.show(value)}") from None
    if isinstance(value, float):
        raise ValueError(f"a DECIMAL is read exactly, never through a float: give {value!r} as text")
    return _BAD


_TEMPORAL_FORMS = {"DATE": "YYYY-MM-DD text", "TIME": "HH:MM:SS[.ffffff] text or integer microseconds",
                   "TIMESTAMP": "ISO-8601 text or integer microseconds",
                   "TIMESTAMP_NTZ": "ISO-8601 text without a zone or integer microseconds"}


def _temporal(value: Any, name: str) -> Any:
    """DATE, TIME, TIMESTAMP, TIMESTAMP_NTZ."""
    if name != "DATE" and (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        text = value.strip()
        if name != "DATE" and _INTEGER.fullmatch(text):
            return int(text)
        try:
            parsed = {"DATE": date.fromisoformat, "TIME": time.fromisoformat}.get(name, datetime.fromisoformat)(text)
        except ValueError:
            parsed = None
        if parsed is not None and name == "TIMESTAMP_NTZ" and parsed.tzinfo is not None:
            raise ValueError(f"a TIMESTAMP_NTZ has no zone, got {errors.show(value)}")
        if parsed is not None and not (name == "TIME" and parsed.tzinfo is not None):
            return parsed
    raise ValueError(f"expected {_TEMPORAL_FORMS[name]} for {name}, got {errors.show(value)}")


def _nested(value: Any, kind: DataType) -> Any:
    if kind.name == "ARRAY":
        if not isinstance(value, list):
            raise ValueError(f"expected a JSON array for {kind}, got {errors.show(value)}")
        return [convert_value(item, kind.element) for item in value]
    if kind.name == "STRUCT":
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object for {kind}, got {errors.show(value)}")
        fields = dict(kind.fields)
        unknown = [name for name in value if name not in fields]
        if unknown:
            raise ValueError(f"{kind} has no field {errors.show(unknown[0])}")
        return {name: convert_value(item, fields[name]) for name, item in value.items()}
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        pairs = value
    else:
        raise ValueError(f"expected a JSON object or an array of [key, value] pairs for {kind}, "
                         f"got {errors.show(value)}")
    return [(convert_value(k, kind.key), convert_value(v, kind.value)) for k, v in pairs]


def json_value(value: Any) -> Any:
    """A column value read back (a Python value of ``to_pylist``) as JSON: DECIMAL -> text, DATE ->
    ``YYYY-MM-DD``, TIME -> ``HH:MM:SS.ffffff``, TIMESTAMP / TIMESTAMP_NTZ -> ISO 8601 with microseconds (no
    zone; a TIMESTAMP is UTC), BYTES -> base64 text, a NaN or infinite float -> ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``, a MAP (a list of pairs) -> an object when its keys are text, else ``[key, value]``
    pairs; ARRAY and STRUCT values element by element."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime, time)):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {name: json_value(item) for name, item in value.items()}
    if isinstance(value, list):
        if value and all(type(item) is tuple for item in value):  # a MAP
            if all(isinstance(k, str) for k, _ in value):
                return {k: json_value(v) for k, v in value}
            return [[json_value(k), json_value(v)] for k, v in value]
        return [json_value(item) for item in value]
    return value
