"""Column types: their grammar, their canonical text, and which change of a column's type is a widening.

A column's type is kept and sent as its canonical text (``Column.type``: ``"BIGINT"``,
``"DECIMAL(12,2)"``, ``"ARRAY<STRING>"``, ``"MAP<STRING,BIGINT>"``, ``"STRUCT<a INT,b DATE>"``);
:func:`parse_type` reads any accepted spelling (case-insensitive, the aliases of :data:`ALIASES`) into a
:class:`DataType`, whose ``str()`` is that canonical text. The grammar and what each type holds are in
docs/schemas.md. Nothing here imports pyarrow: the coordinator checks types without it (the Arrow type of
each is the codec's business, ``common/codec_arrays.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from kvlease.common.errors import InvalidTableError, show

#: Types without parameters, canonical names.
SIMPLE = ("BOOLEAN", "TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "STRING", "BYTES", "DATE", "TIME",
          "TIMESTAMP", "TIMESTAMP_NTZ")
NESTED = ("ARRAY", "MAP", "STRUCT")
#: Other spellings accepted on input (never written back).
ALIASES = {"INTEGER": "INT", "BOOL": "BOOLEAN", "REAL": "FLOAT", "VARCHAR": "STRING", "TEXT": "STRING",
           "BINARY": "BYTES", "VARBINARY": "BYTES", "TIMESTAMP_LTZ": "TIMESTAMP", "NUMERIC": "DECIMAL",
           "DEC": "DECIMAL"}
MAX_DECIMAL_PRECISION = 38
DEFAULT_DECIMAL = (10, 0)  # DECIMAL without a precision, as Spark and Fluss take it
#: The integer types by width: each widens to any after it.
INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
#: Most nesting a type may have (ARRAY<ARRAY<…>>): deeper is refused, not recursed into.
MAX_DEPTH = 16
#: The longest type text read (longer is refused before it is parsed).
MAX_TEXT = 1000
KNOWN = ", ".join(SIMPLE) + ", DECIMAL(p,s), ARRAY<T>, MAP<K,V>, STRUCT<name T, …>"

_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(.))")


@dataclass(frozen=True)
class DataType:
    """One type: ``name`` (of :data:`SIMPLE`, ``DECIMAL`` or :data:`NESTED`) and its parameters."""
    name: str
    precision: int = 0  # DECIMAL
    scale: int = 0  # DECIMAL
    element: "DataType | None" = None  # ARRAY
    key: "DataType | None" = None  # MAP
    value: "DataType | None" = None  # MAP
    fields: tuple[tuple[str, "DataType"], ...] = ()  # STRUCT, in order

    def __str__(self) -> str:
        if self.name == "DECIMAL":
            return f"DECIMAL({self.precision},{self.scale})"
        if self.name == "ARRAY":
            return f"ARRAY<{self.element}>"
        if self.name == "MAP":
            return f"MAP<{self.key},{self.value}>"
        if self.name == "STRUCT":
            return "STRUCT<" + ",".join(f"{name} {type_}" for name, type_ in self.fields) + ">"
        return self.name

    @property
    def nested(self) -> bool:
        return self.name in NESTED

    @property
    def keyable(self) -> bool:
        """It may be a primary-key column (and a MAP's key): anything but ARRAY, MAP and STRUCT."""
        return not self.nested


def parse_type(text: str) -> DataType:
    """The type ``text`` spells; InvalidTableError saying what is wrong and where otherwise."""
    if not isinstance(text, str):
        raise InvalidTableError(f"a column type is text, got {show(text)}")
    if len(text) > MAX_TEXT:
        raise InvalidTableError(f"bad column type {show(text)}: longer than {MAX_TEXT} characters")
    return _parse(text)


def canonical(text: str) -> str:
    """The canonical text of the type ``text`` spells (``"decimal(12, 2)"`` -> ``"DECIMAL(12,2)"``)."""
    return str(parse_type(text))


@lru_cache(maxsize=1024)
def _parse(text: str) -> DataType:
    tokens = _tokens(text)
    parser = _Parser(text, tokens)
    type_ = parser.type_(0)
    if parser.pos != len(tokens):
        raise parser.error("unexpected text after the type")
    return type_


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        word, number, other = match.groups()
        out.append(word or number or other)
        pos = match.end()
    return out


class _Parser:
    def __init__(self, text: str, tokens: list[str]) -> None:
        self.text, self.tokens, self.pos = text, tokens, 0

    def error(self, what: str) -> InvalidTableError:
        near = " ".join(self.tokens[self.pos:self.pos + 3]) or "the end"
        where = "" if len(self.tokens) == 1 else f" (at {show(near)})"
        return InvalidTableError(f"bad column type {show(self.text)}: {what}{where}; types are {KNOWN}")

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if not token or (expected is not None and token != expected):
            raise self.error(f"expected {show(expected)}" if expected else "the type ends too soon")
        self.pos += 1
        return token

    def number(self) -> int:
        token = self.take()
        if not token.isdigit():
            raise self.error("expected a number")
        return int(token)

    def type_(self, depth: int) -> DataType:
        if depth > MAX_DEPTH:
            raise self.error(f"types nest at most {MAX_DEPTH} deep")
        word = self.take().upper()
        name = ALIASES.get(word, word)
        if name in SIMPLE:
            return DataType(name)
        if name == "DECIMAL":
            return self.decimal()
        if name == "ARRAY":
            self.take("<")
            element = self.type_(depth + 1)
            self.take(">")
            return DataType("ARRAY", element=element)
        if name == "MAP":
            self.take("<")
            key = self.type_(depth + 1)
            if not key.keyable:
                raise self.error(f"a MAP's key is not of a nested type, got {key}")
            self.take(",")
            value = self.type_(depth + 1)
            self.take(">")
            return DataType("MAP", key=key, value=value)
        if name == "STRUCT":
            return self.struct(depth)
        self.pos -= 1
        raise self.error("unknown type")

    def decimal(self) -> DataType:
        precision, scale = DEFAULT_DECIMAL
        if self.peek() == "(":
            self.take("(")
            precision, scale = self.number(), 0
            if self.peek() == ",":
                self.take(",")
                scale = self.number()
            self.take(")")
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise self.error(f"a DECIMAL's precision is 1 to {MAX_DECIMAL_PRECISION}, got {precision}")
        if not 0 <= scale <= precision:
            raise self.error(f"a DECIMAL's scale is 0 to its precision ({precision}), got {scale}")
        return DataType("DECIMAL", precision=precision, scale=scale)

    def struct(self, depth: int) -> DataType:
        self.take("<")
        fields: list[tuple[str, DataType]] = []
        while True:
            name = self.take()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise self.error("expected a field name")
            if name in {n for n, _ in fields}:
                raise self.error(f"field {name} appears twice")
            if self.peek() == ":":
                self.take(":")
            fields.append((name, self.type_(depth + 1)))
            if self.peek() != ",":
                break
            self.take(",")
        self.take(">")
        return DataType("STRUCT", fields=tuple(fields))


def widens(old: DataType, new: DataType) -> bool:
    """``new`` holds every value of ``old`` exactly, and a stored ``old`` value reads as ``new``: a wider
    integer, FLOAT to DOUBLE, a DECIMAL with as many digits before and after the point or more. The same type
    is not a widening. ``table alter --widen-column`` takes these but keeps a DECIMAL's scale
    (common/schema_changes.py)."""
    if old == new:
        return False
    if old.name in INTEGERS and new.name in INTEGERS:
        return INTEGERS.index(new.name) > INTEGERS.index(old.name)
    if (old.name, new.name) == ("FLOAT", "DOUBLE"):
        return True
    if old.name == new.name == "DECIMAL":
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return False
