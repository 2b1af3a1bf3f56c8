"""The aggregate functions of the aggregation merge engine, per column, vectorized (docs/merge-engines.md).

Pure functions on Arrow arrays: :func:`combine` folds written values into stored ones, :func:`retract`
takes retracted values back out. ``stored`` is null where the key has no row yet (or the column is
null); a null written value leaves the stored one (but last_value, which takes it). The semantics, per
function (``s`` stored, ``v`` written):

=========================  ==============================  ==========================================
function                   write                           retract (``v`` not null)
=========================  ==============================  ==========================================
sum                        s + v (nulls skipped)           s - v (a null s counts as 0)
product                    s * v (nulls skipped)           s / v: refused if v is 0, s is null, or the
                                                           quotient is not exact in the column's type
max, min                   the larger / smaller            refused (no history is kept)
last_value                 v, even null                    null
last_value_ignore_nulls    v unless null                   null
first_value                s if the row existed, else v    refused
first_value_ignore_nulls   s unless null                   refused
listagg                    s + "," + v (nulls skipped)     refused
bool_and, bool_or          s and/or v (nulls skipped)      refused
=========================  ==============================  ==========================================

A result that does not fit the column's type (an overflow, a DECIMAL beyond its precision) is an
InvalidRowError naming the column: the whole write is refused, nothing changes.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.errors import InvalidRowError
from kvlease.common.merge_engine import LISTAGG_DELIMITER, RETRACTABLE


def combine(function: str, column: str, stored: pa.Array, written: pa.Array, existed: pa.Array) -> pa.Array:
    """``function`` of the stored and the written values; ``existed``: a boolean array, the row existed."""
    if function == "last_value":
        return written
    if function == "last_value_ignore_nulls":
        return pc.coalesce(written, stored)
    if function == "first_value":
        return pc.if_else(existed, stored, written)
    if function == "first_value_ignore_nulls":
        return pc.coalesce(stored, written)
    both = _both(function, column, stored, written)
    return pc.coalesce(both, stored, written)  # a null on either side: the other one


def _both(function: str, column: str, stored: pa.Array, written: pa.Array) -> pa.Array:
    """``function`` where both sides are set (null elsewhere), cast back to the column's type."""
    try:
        if function == "sum":
            return _fit(pc.add_checked(stored, written), stored.type, column, function)
        if function == "product":
            return _fit(_product(stored, written), stored.type, column, function)
        if function in ("max", "min"):
            take_written = (pc.greater if function == "max" else pc.less)(written, stored)
            return pc.if_else(take_written, written, stored)
        if function == "listagg":
            return pc.binary_join_element_wise(stored, written, LISTAGG_DELIMITER)
        if function == "bool_and":
            return pc.and_(stored, written)
        if function == "bool_or":
            return pc.or_(stored, written)
    except pa.ArrowInvalid as exc:
        raise InvalidRowError(f"column {column!r}: {function} overflows its type {stored.type} ({exc})",
                              column=column) from None
    raise InvalidRowError(f"column {column!r}: unknown aggregate function {function!r}", column=column)


def _product(stored: pa.Array, written: pa.Array) -> pa.Array:
    if pa.types.is_decimal(stored.type):  # the product's scale is the sum of both: round back to the column's
        return pc.round(pc.multiply_checked(stored, written), ndigits=stored.type.scale, round_mode="half_to_even")
    return pc.multiply_checked(stored, written)


def _fit(values: pa.Array, type_: pa.DataType, column: str, function: str) -> pa.Array:
    if values.type == type_:
        return values
    try:
        return pc.cast(values, type_, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidRowError(f"column {column!r}: {function} does not fit its type {type_} ({exc})",
                              column=column) from None


def retract(function: str, column: str, stored: pa.Array, retracted: pa.Array) -> pa.Array:
    """The stored values with the ``retracted`` ones taken back (a null retracted value: unchanged);
    InvalidRowError for a function that keeps no history or a product that cannot be divided."""
    given = retracted.is_valid()
    if not pc.any(given).as_py():
        return stored
    if function not in RETRACTABLE:
        raise InvalidRowError(f"column {column!r}: {function} cannot take a retract (it keeps no history); leave "
                              f"the column out of the retract rows or null", column=column)
    if function in ("last_value", "last_value_ignore_nulls"):
        return pc.if_else(given, pa.nulls(len(stored), stored.type), stored)
    try:
        if function == "sum":
            taken = pc.coalesce(pc.subtract_checked(stored, retracted), pc.negate_checked(retracted))
            return pc.if_else(given, _fit(taken, stored.type, column, function), stored)
        return pc.if_else(given, _divide(column, stored, retracted, given), stored)
    except pa.ArrowInvalid as exc:
        raise InvalidRowError(f"column {column!r}: retracting from its {function} overflows its type "
                              f"{stored.type} ({exc})", column=column) from None


def _divide(column: str, stored: pa.Array, retracted: pa.Array, given: pa.Array) -> pa.Array:
    """``stored / retracted`` where a retract is given; InvalidRowError unless every such quotient is exact."""
    if pc.any(pc.and_(given, stored.is_null())).as_py():
        raise InvalidRowError(f"column {column!r}: cannot retract from a null product", column=column)
    if pc.any(pc.and_(given, pc.equal(retracted, pc.cast(0, retracted.type)))).as_py():
        raise InvalidRowError(f"column {column!r}: cannot retract a product of 0 (no division by zero)",
                              column=column)
    safe = pc.if_else(given, retracted, pc.cast(1, retracted.type))
    if pa.types.is_floating(stored.type):
        return pc.divide(stored, safe)
    quotient = pc.divide(stored, safe)
    if pa.types.is_decimal(stored.type):
        try:
            quotient = pc.cast(quotient, stored.type, safe=True)
        except pa.ArrowInvalid:
            quotient = None
    if quotient is None or not pc.all(pc.equal(_fit(pc.multiply_checked(quotient, safe), stored.type, column,
                                                    "product"), stored)).as_py():
        raise InvalidRowError(f"column {column!r}: the stored product is not divisible by the retracted value",
                              column=column)
    return quotient
