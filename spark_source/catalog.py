"""Spark catalog tables (``CREATE TABLE t USING kvlease OPTIONS (…)``): what Spark passes, and what it does not.

Spark (4.3) calls the source's ``schema()`` once, when the table is created,
with the OPTIONS twice (``cluster`` and ``option.cluster``) and the catalog's
own properties (``provider``, ``owner``, ``comment``, …). It stores the schema
returned then and, on every later query of the table, hands the source that
schema but not the OPTIONS: the reader of ``SELECT * FROM t`` gets only the
query's own options (``WITH (…)``, usually none). So at creation the source
keeps the OPTIONS in the schema's metadata (:func:`remember`) and a read of
the table takes them back from there (:func:`recall`).

Writes cannot do that: a writer's schema is the query's, whose metadata may be
another table's (``INSERT INTO copy SELECT * FROM orders`` carries ``orders``'
columns), so a write to a catalog table needs its options given with the write
(:data:`WRITE_NEEDS_OPTIONS`).
"""

from __future__ import annotations

import json
from typing import Mapping

from pyspark.sql.types import StructField, StructType

from kvlease.spark_source.options import OptionError

#: Properties Spark's session catalog adds to a ``CREATE TABLE``'s options (TableCatalog.PROP_*, ``path``).
SPARK_PROPERTIES = frozenset({"provider", "owner", "comment", "location", "path", "external", "is_managed_location",
                              "collation"})
#: Spark's prefix of a ``CREATE TABLE``'s OPTIONS among the table's properties.
OPTION_PREFIX = "option."
#: The column metadata key under which a catalog table keeps its OPTIONS (a JSON object).
METADATA_KEY = "kvlease.options"
#: What locates a table; a query that gives none of these reads the catalog table's own.
LOCATING = frozenset({"bootstrap", "cluster", "table"})

WRITE_NEEDS_OPTIONS = (
    "this write names no kvlease table: give options 'table' and 'cluster' (or 'bootstrap') with the write. Spark "
    "(4.3) does not give a Python data source's writer a catalog table's OPTIONS, so a write to a table made with "
    "CREATE TABLE … USING kvlease needs them too: INSERT INTO t WITH ('cluster' = '…', 'table' = 'db.name') …, "
    "df.writeTo('t').option('cluster', …).option('table', …).append(); or write through a temporary view "
    "(CREATE TEMPORARY VIEW v USING kvlease OPTIONS (…); INSERT INTO v …)")


def is_create(options: Mapping[str, str]) -> bool:
    """Whether ``options`` are those of a ``CREATE TABLE … USING kvlease`` (Spark adds ``provider``)."""
    return any(str(k).lower() == "provider" for k in options)


def from_create(options: Mapping[str, str]) -> dict[str, str]:
    """The OPTIONS of a ``CREATE TABLE`` from what Spark passes (lower-case names): the ``option.``-prefixed ones,
    unprefixed; Spark's own properties dropped. A TBLPROPERTIES key means nothing here and is refused."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    out = {k[len(OPTION_PREFIX):]: v for k, v in given.items() if k.startswith(OPTION_PREFIX)}
    for name, value in sorted(given.items()):
        if name.startswith(OPTION_PREFIX) or name in SPARK_PROPERTIES or out.get(name) == value:
            continue
        raise OptionError(f"table property '{name}' means nothing to kvlease: give the source's settings in "
                          "OPTIONS (…), not TBLPROPERTIES")
    if "password" in out:
        raise OptionError("option 'password': a catalog table keeps its options in its schema, where anyone who "
                          "can read the table sees them; use option 'password-file'")
    return out


def remember(schema: StructType, options: Mapping[str, str]) -> StructType:
    """``schema`` with ``options`` kept in its first column's metadata, every column nullable: an ``INSERT INTO t
    (columns)`` or ``BY NAME`` that leaves out the change-feed columns then writes them as null (upserts)."""
    first, *rest = schema.fields
    metadata = {**(first.metadata or {}), METADATA_KEY: json.dumps(dict(sorted(options.items())))}
    return StructType([StructField(first.name, first.dataType, True, metadata),
                       *(StructField(f.name, f.dataType, True, f.metadata) for f in rest)])


def recall(options: Mapping[str, str], schema: StructType) -> dict[str, str]:
    """The options of a read: ``options`` as given if they locate a table; otherwise those the catalog table kept
    in ``schema`` (:func:`remember`), with ``options`` (a query's ``WITH (…)``) on top."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    if given.keys() & LOCATING:
        return given
    kept = next((f.metadata[METADATA_KEY] for f in schema.fields if METADATA_KEY in (f.metadata or {})), None)
    if kept is None:
        return given
    return {**json.loads(kept), **given}


def no_table_hint(options: Mapping[str, str]) -> str:
    """A hint for an error about missing ``bootstrap``/``cluster``/``table``: why a catalog table can lack them."""
    if {str(k).lower() for k in options} & LOCATING:
        return ""
    return (" (a catalog table keeps its OPTIONS only when created as CREATE TABLE t USING kvlease OPTIONS (…), "
            "without a column list: the columns come from the kvlease table)")
