"""Row TTL: a table's rows expire a fixed time after their TTL column's value (docs/changelog.md, "Row TTL").

``table create --ttl 7d --ttl-column ts`` makes every row whose ``ts`` is at
least 7 days old *expired*: lookups and scans never return it, and the
bucket's leader deletes it in the background (``tablet/expiry.py``) with a
-D record in the changelog, so every copy fed by the change feed drops it
too. The TTL column is a ``TIMESTAMP`` (``TIMESTAMP_LTZ``: an instant) or a
``BIGINT`` of ms since the epoch; a null there never expires.
``TIMESTAMP_NTZ`` is refused: a wall-clock time without a zone is no instant.

Without ``--ttl-column`` the TTL counts from the row's *write time*: the table
gets the column :data:`WRITE_TIME_COLUMN` (``TIMESTAMP``), which the bucket's
leader sets to its clock on every write of the row (a value a client sends
there is replaced). The time travels inside the row, so the changelog, the
replicas, snapshots and every reader see the same one.

``--ttl-changelog none``: the background deletes still go through the
changelog (followers and rebuilt replicas apply them), but as -D records
without a before-image, which the change feed (the client's log reads and
the Spark stream) skips: a downstream copy keeps the rows, as in Fluss.

A row is expired at ``now`` when ``value + ttl <= now`` (ms): the predicate on
Arrow rows is :mod:`kvlease.common.row_expiry`; this module is the definition
(no pyarrow: the coordinator checks tables without it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlease.common.config import parse_duration_ms
from kvlease.common.errors import InvalidTableError, show

#: The column a write-time TTL table gets, set by the bucket's leader on every write of a row.
WRITE_TIME_COLUMN = "_write_time"
WRITE_TIME_TYPE = "TIMESTAMP"
#: ``--ttl-changelog``: ``delete`` (-D records with the before-image) or ``none`` (records the feed skips).
CHANGELOG_MODES = ("delete", "none")
#: The column types a TTL may count from (canonical type text).
TTL_TYPES = ("TIMESTAMP", "BIGINT")


@dataclass(frozen=True)
class RowTtl:
    """A table's row TTL: rows expire ``ttl_ms`` after their ``column``'s value (ms since the epoch).

    ``write_time``: the column is :data:`WRITE_TIME_COLUMN`, stamped by the leader. ``changelog``: one of
    :data:`CHANGELOG_MODES`."""

    ttl_ms: int
    column: str = WRITE_TIME_COLUMN
    write_time: bool = True
    changelog: str = "delete"

    @property
    def hidden(self) -> bool:
        """Whether its deletes are -D records the change feed skips (``--ttl-changelog none``)."""
        return self.changelog == "none"

    def to_json(self) -> dict:
        return {"ttl_ms": self.ttl_ms, "column": self.column, "write_time": self.write_time,
                "changelog": self.changelog}

    @classmethod
    def from_json(cls, data: dict) -> "RowTtl":
        return cls(int(data["ttl_ms"]), str(data["column"]), bool(data.get("write_time", False)),
                   str(data.get("changelog", "delete")))

    def describe(self) -> str:
        """One line for ``table describe``: ``7d on ts, expired rows deleted with -D records``."""
        on = "the write time (column _write_time)" if self.write_time else f"column {self.column}"
        feed = "with -D records" if not self.hidden else "without change-feed records (--ttl-changelog none)"
        return f"{format_duration(self.ttl_ms)} after {on}; expired rows deleted {feed}"


def row_ttl(ttl: str | int, column: str | None = None, changelog: str | None = None) -> RowTtl:
    """The TTL ``table create --ttl TTL [--ttl-column C] [--ttl-changelog M]`` asks for (not yet checked
    against the table's columns: :func:`check_row_ttl`). ``ttl``: ``7d``, ``12h``, ``30m``, ``90s``,
    ``500ms`` or a number of ms. InvalidTableError for a bad duration or mode."""
    if isinstance(ttl, bool):
        raise InvalidTableError(f"bad --ttl {show(ttl)}: a duration such as 7d, 12h, 30m or 90s")
    try:
        ttl_ms = int(ttl) if isinstance(ttl, int) else parse_duration_ms(str(ttl).strip())
    except ValueError as exc:
        raise InvalidTableError(f"bad --ttl {show(ttl)}: {exc}") from None
    if ttl_ms <= 0:
        raise InvalidTableError(f"bad --ttl {show(ttl)}: a TTL must be above zero")
    mode = "delete" if changelog is None else str(changelog).strip().lower()
    if mode not in CHANGELOG_MODES:
        raise InvalidTableError(f"bad --ttl-changelog {show(changelog)}: one of {', '.join(CHANGELOG_MODES)}")
    if column is None or column == "":
        return RowTtl(ttl_ms, WRITE_TIME_COLUMN, True, mode)
    return RowTtl(ttl_ms, column, False, mode)


def with_ttl_column(ttl: RowTtl | None, columns: tuple, make_column) -> tuple:
    """``columns``, and a write-time TTL's :data:`WRITE_TIME_COLUMN` at the end if they lack it
    (``make_column(name, type)`` makes a column)."""
    if ttl is None or not ttl.write_time or any(c.name == WRITE_TIME_COLUMN for c in columns):
        return columns
    return (*columns, make_column(WRITE_TIME_COLUMN, WRITE_TIME_TYPE))


def check_row_ttl(ttl: RowTtl | None, types: dict[str, str]) -> None:
    """InvalidTableError unless ``ttl`` fits the table's columns (``types``: name -> canonical type)."""
    if ttl is None:
        return
    if ttl.changelog not in CHANGELOG_MODES:
        raise InvalidTableError(f"bad --ttl-changelog {show(ttl.changelog)}: one of {', '.join(CHANGELOG_MODES)}")
    if ttl.ttl_ms <= 0:
        raise InvalidTableError(f"bad --ttl of {ttl.ttl_ms} ms: a TTL must be above zero")
    kind = types.get(ttl.column)
    if kind is None:
        raise InvalidTableError(f"TTL column {show(ttl.column)} is not a column of the table")
    if ttl.write_time and (ttl.column != WRITE_TIME_COLUMN or kind != WRITE_TIME_TYPE):
        raise InvalidTableError(f"a write-time TTL counts from column {WRITE_TIME_COLUMN} {WRITE_TIME_TYPE}, "
                                f"got {show(ttl.column)} {kind}")
    if kind not in TTL_TYPES:
        raise InvalidTableError(f"TTL column {show(ttl.column)} is of type {kind}: a TTL counts from a TIMESTAMP "
                                f"(TIMESTAMP_LTZ) or a BIGINT of ms since the epoch")


_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def format_duration(ms: int) -> str:
    """``604800000`` -> ``7d``: the largest unit that divides it, else ms."""
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
