"""Pure checkers of the disk-loss drill: a replica whose data was wiped rebuilt the bucket and rejoined.

No cluster, clock or I/O in here. A replica's table is what it holds below
the high watermark: the rows of the snapshot it was rebuilt from (none when
its changelog starts at offset 0) with its changelog applied on top
(:func:`replica_table`); a wiped replica's table must equal one of a replica
that kept its whole changelog.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from kvlease.ops.drills.failover_checks import AFTER_IMAGES, DELETE, ChangeRecord
from kvlease.ops.check import Check

MAX_LISTED = 20  # differing keys listed per replica


def replica_table(base: Mapping[int, int] | None, records: Iterable[ChangeRecord]) -> dict[int, int]:
    """The table a replica holds: ``base`` (a snapshot's rows, key -> value; None or empty: none) with
    ``records`` applied in order."""
    table = dict(base or {})
    for record in records:
        if record.change in AFTER_IMAGES:
            table[record.key] = record.value
        elif record.change == DELETE:
            table.pop(record.key, None)
    return table


def rebuilt_tables_equal(rebuilt: Mapping[str, Mapping[int, int] | None], reference_name: str,
                         reference: Mapping[int, int]) -> Check:
    """Each rebuilt replica's table (``rebuilt``: name -> key -> value; None: it could not be read, e.g.
    the snapshot it started from is gone) equals ``reference``, the table of a replica that never lost
    its data."""
    violations = []
    for name, table in sorted(rebuilt.items()):
        if table is None:
            violations.append(f"{name}: its table could not be read back (no kept snapshot at its log start)")
            continue
        differ = sorted(k for k in set(table) | set(reference) if table.get(k) != reference.get(k))
        for key in differ[:MAX_LISTED]:
            show = lambda v: "no row" if v is None else str(v)  # noqa: E731
            violations.append(f"{name}: key {key} is {show(table.get(key))}, {reference_name} has "
                              f"{show(reference.get(key))}")
        if len(differ) > MAX_LISTED:
            violations.append(f"{name}: … and {len(differ) - MAX_LISTED} more keys differ")
    return Check.of(f"every wiped replica holds the committed rows ({reference_name}'s)", violations,
                    len(reference) * len(rebuilt))


def rejoined_within(rejoins: Sequence[tuple[str, float | None]], bound_s: float) -> Check:
    """Every wiped replica (``(name, seconds from its restart until every bucket's ISR was full again)``,
    None: it never was) rejoined within ``bound_s``."""
    violations = [f"{name}: not back in the ISR within {bound_s:g}s" if s is None else
                  f"{name}: back in the ISR only after {s:.1f}s" for name, s in rejoins if s is None or s > bound_s]
    return Check.of(f"every wiped replica rebuilt and back in the ISR within {bound_s:g}s", violations, len(rejoins))
