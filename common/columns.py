"""Columns: the types a kvlease table's columns may have, and a column."""

from __future__ import annotations

from dataclasses import dataclass

#: The values an INT and a BIGINT column hold.
INT_RANGE = {"INT": (-(1 << 31), (1 << 31) - 1), "BIGINT": (-(1 << 63), (1 << 63) - 1)}

TYPES = ("BOOLEAN", "INT", "BIGINT", "DOUBLE", "STRING", "BYTES", "TIMESTAMP")


@dataclass(frozen=True)
class Column:
    name: str
    type: str
