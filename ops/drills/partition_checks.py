"""Pure checkers of the partitions drill: what its writers, its reader and its watch of the partition list saw,
against the partitions, local bucket dirs and remote files there at the end.

No cluster, clock or I/O in here: the drill records each partition it saw listed (:class:`Seen`: its id, name,
when it was first and last listed, when it was first missing), the writers' acknowledged rows and errors, and
the paths it found; each checker returns a :class:`~kvlease.ops.check.Check` whose violations name the
partition, the path and when the partition was dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from kvlease.ops.check import Check

MAX_LISTED = 20


@dataclass
class Seen:
    """A partition the drill's watch listed: ``first``/``last`` listed, ``gone`` first listing without it."""

    partition_id: int
    name: str
    first: float
    last: float
    gone: float | None = None


def clock(at: float | None) -> str:
    if at is None:
        return "?"
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at * 10) % 10}"


def describe(partition_id: int, seen: Mapping[int, Seen]) -> str:
    """``partition 20261129200501 (id 57), dropped between 20:05:09.1 and 20:05:09.6``."""
    entry = seen.get(partition_id)
    if entry is None:
        return f"partition id {partition_id} (never listed by the drill)"
    if entry.gone is None:
        return f"partition {entry.name} (id {partition_id}), last listed {clock(entry.last)}"
    return f"partition {entry.name} (id {partition_id}), dropped between {clock(entry.last)} and {clock(entry.gone)}"


def _capped(violations: list[str]) -> list[str]:
    if len(violations) <= MAX_LISTED:
        return violations
    return violations[:MAX_LISTED] + [f"… and {len(violations) - MAX_LISTED} more"]


def kept_within_retention(expected: Iterable[str], listed: Iterable[str], acked: Mapping[str, int],
                          found: Mapping[str, int]) -> Check:
    """Every partition written and within retention at the end is listed and holds every acknowledged row
    (``acked``/``found``: rows per partition name)."""
    listed = set(listed)
    expected = sorted(expected)
    problems = [f"partition {name} (within retention, {acked.get(name, 0)} rows acknowledged) does not exist"
                for name in expected if name not in listed]
    problems += [f"partition {name}: {found.get(name, 0)} of {acked[name]} acknowledged rows found"
                 for name in expected if name in listed and found.get(name, 0) != acked.get(name, 0)]
    return Check.of("no partition within retention lost (each listed, its acknowledged rows found)",
                    _capped(problems), len(expected))


def leased_kept(name: str, listed_while_held: bool, held_by: Iterable[str], lease_id: str,
                reads: Iterable[int | str], first_rows: int) -> Check:
    """The leased partition outlived its retention while the lease held it, and every read of its snapshot
    (rows read, or the error) gave the rows the first read did."""
    problems = [] if listed_while_held else [f"partition {name} was dropped while lease {lease_id} held it"]
    if listed_while_held and lease_id not in set(held_by):
        problems.append(f"partition {name} is not shown as held by lease {lease_id} (held by: "
                        f"{', '.join(held_by) or 'none'})")
    reads = list(reads)
    problems += [f"read {i + 1} of its snapshot: {r if isinstance(r, str) else f'{r} rows, not {first_rows}'}"
                 for i, r in enumerate(reads) if r != first_rows]
    return Check.of(f"the leased partition {name} and its snapshot stay readable while the lease holds them",
                    problems, len(reads) + 1)


def dropped_after_release(name: str, took_s: float | None, bound_s: float) -> Check:
    problems = [] if took_s is not None else [f"partition {name} still exists {bound_s:g}s after the release"]
    return Check.of(f"the held partition is dropped within {bound_s:g}s of the lease's release", problems, 1)


def no_orphans(local: Mapping[str, int], remote: Mapping[str, int], seen: Mapping[int, Seen],
               checked: int) -> Check:
    """No local bucket dir and no remote dir (path -> partition id) of a partition that no longer exists."""
    problems = [f"local {path}: {describe(pid, seen)}" for path, pid in sorted(local.items())]
    problems += [f"remote {path}: {describe(pid, seen)}" for path, pid in sorted(remote.items())]
    return Check.of("no local bucket dir or remote file of a dropped partition is left", _capped(problems), checked)


def writers_only_retriable(errors: Iterable[str], calls: int) -> Check:
    """The writers saw no error but retriable ones (``errors``: the others, one line each)."""
    return Check.of("writers saw no error but retriable ones during the failovers", _capped(list(errors)), calls)
