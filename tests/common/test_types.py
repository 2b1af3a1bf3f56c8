"""Column type grammar (common/types.py): canonical text, aliases, nesting, bad input, widening."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kvlease.common.errors import InvalidTableError
from kvlease.common.types import MAX_DEPTH, SIMPLE, canonical, parse_type, widens

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, expected", [
    ("int", "INT"), ("Integer", "INT"), ("bigint", "BIGINT"), ("real", "FLOAT"), ("varchar", "STRING"),
    ("binary", "BYTES"), ("timestamp_ltz", "TIMESTAMP"), ("timestamp_ntz", "TIMESTAMP_NTZ"),
    ("decimal", "DECIMAL(10,0)"), ("decimal(12)", "DECIMAL(12,0)"), ("numeric( 12 , 2 )", "DECIMAL(12,2)"),
    ("array<int>", "ARRAY<INT>"), ("map<string, array<decimal(5,1)>>", "MAP<STRING,ARRAY<DECIMAL(5,1)>>"),
    ("struct<a: int, b date>", "STRUCT<a INT,b DATE>"),
    ("array<struct<tags array<string>, m map<int,bool>>>", "ARRAY<STRUCT<tags ARRAY<STRING>,m MAP<INT,BOOLEAN>>>"),
])
def test_each_spelling_reads_as_its_canonical_text(text, expected):
    assert canonical(text) == expected
    assert canonical(expected) == expected  # the canonical text reads back as itself


@pytest.mark.parametrize("text, says", [
    ("decimal(39,2)", "precision is 1 to 38"), ("decimal(0)", "precision is 1 to 38"),
    ("decimal(5,6)", "scale is 0 to its precision (5)"), ("map<array<int>,int>", "MAP's key is not of a nested"),
    ("uuid", "unknown type"), ("array<int", "expected '>'"), ("int int", "unexpected text after the type"),
    ("struct<a int, a int>", "field a appears twice"), ("struct<>", "expected a field name"), ("", "ends too soon"),
    ("decimal(x)", "expected a number"), ("array<" * (MAX_DEPTH + 2) + "int" + ">" * (MAX_DEPTH + 2), "nest at most"),
])
def test_a_bad_type_is_one_error_naming_what_is_wrong(text, says):
    with pytest.raises(InvalidTableError) as caught:
        parse_type(text)
    assert says in caught.value.message and "\n" not in caught.value.message


def test_nested_types_are_not_keyable_and_simple_ones_are():
    assert all(parse_type(name).keyable for name in SIMPLE) and parse_type("decimal(3,1)").keyable
    assert not any(parse_type(t).keyable for t in ("array<int>", "map<int,int>", "struct<a int>"))


@pytest.mark.parametrize("old, new, ok", [
    ("TINYINT", "SMALLINT", True), ("TINYINT", "BIGINT", True), ("INT", "BIGINT", True), ("BIGINT", "INT", False),
    ("INT", "INT", False), ("FLOAT", "DOUBLE", True), ("DOUBLE", "FLOAT", False), ("INT", "DOUBLE", False),
    ("DECIMAL(5,2)", "DECIMAL(7,2)", True), ("DECIMAL(5,2)", "DECIMAL(7,4)", True),
    ("DECIMAL(5,2)", "DECIMAL(6,4)", False), ("DECIMAL(5,2)", "DECIMAL(5,1)", False), ("STRING", "BYTES", False),
    ("ARRAY<INT>", "ARRAY<BIGINT>", False),
])
def test_widening_is_lossless_only(old, new, ok):
    assert widens(parse_type(old), parse_type(new)) is ok


_simple = st.sampled_from(SIMPLE + ("DECIMAL(12,2)", "DECIMAL(38,0)"))
_types = st.recursive(_simple, lambda inner: st.one_of(
    inner.map(lambda t: f"ARRAY<{t}>"),
    st.tuples(_simple, inner).map(lambda kv: f"MAP<{kv[0]},{kv[1]}>"),
    st.lists(inner, min_size=1, max_size=3).map(lambda ts: "STRUCT<" + ",".join(f"f{i} {t}" for i, t in enumerate(ts)) + ">"),
), max_leaves=8)


@given(_types)
def test_canonical_text_round_trips(text):
    assert str(parse_type(text)) == text
    assert parse_type(text.lower().replace(",", ", ")) == parse_type(text)
