"""The write options about what a write means (docs/spark.md, "Merge engines and partial updates").

- ``merge-engine``, ``version-column``, ``agg`` (``col=function,col=function``) and ``delete-behavior``: a
  ``CREATE TABLE … USING kvlease OPTIONS (…)`` may state the table's merge engine; a write refuses them when
  they disagree with the table's (the table's engine is made by ``kvlease table create``; the options only
  say what the Spark table expects). A read ignores them.
- ``partial-update`` (``true``/``false``, default false): the DataFrame may lack columns (never the primary
  key); the columns it has are written, the others keep their stored values.
"""

from __future__ import annotations

from typing import Mapping

from kvlease.common import errors
from kvlease.common.merge_engine import normalized, parse_aggregates, parse_engine
from kvlease.common.tables import TableInfo
from kvlease.spark_source.options import ENGINE_OPTIONS, OptionError


def check_engine(given: Mapping[str, str], table: TableInfo) -> None:
    """OptionError unless the engine options ``given`` (lower-cased names) state ``table``'s merge engine."""
    stated = {name: given[name] for name in ENGINE_OPTIONS if name in given}
    if not stated:
        return
    try:
        engine = normalized(parse_engine(stated.get("merge-engine"), stated.get("version-column"),
                                         _aggregates(stated.get("agg", "")), stated.get("delete-behavior")),
                            table.columns)
    except errors.InvalidTableError as exc:
        raise OptionError(f"option 'merge-engine': {exc.message}") from None
    there = table.merge_engine
    if there is not None and "delete-behavior" not in stated:  # not stated: whatever the table's is
        engine = engine and type(engine)(engine.kind, engine.version_column, engine.aggregates, there.delete_behavior)
    if engine != there:
        def said(e):
            return e.describe() if e else "none (the last write wins)"
        raise OptionError(f"the write's merge engine options say {said(engine)}, but table {table.path} has "
                          f"{said(there)}: a table's engine is set when it is made (kvlease table create)")


def _aggregates(text: str) -> dict[str, str]:
    """Option ``agg`` (``'total=sum,n=max'``) as ``{column: function}``."""
    try:
        return parse_aggregates(filter(None, (part.strip() for part in text.split(","))))
    except errors.InvalidTableError as exc:
        raise OptionError(f"option 'agg': {exc.message}") from None


def partial_update(given: Mapping[str, str]) -> bool:
    """The ``partial-update`` option; OptionError unless ``true`` or ``false``."""
    value = given.get("partial-update", "false").strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option 'partial-update': true or false, got {errors.show(given['partial-update'])}")
    return value == "true"
