"""Pure checkers of the tablet-failover drill (issue 30): what the clients were told and saw, against
the replicas' changelogs and tables read back at the end.

No cluster, clock or I/O in here: the drill records its acknowledged writes
(with the offsets the server answered), the values its readers saw, the
Spark stream's change rows, every replica's changelog and table, and the
kill times and first successes after them; each checker compares and returns
a :class:`~kvlease.ops.drills.report.Check` whose violations say what broke in plain
words. Keys and values are ints (a value is unique per write in the drill, so
a write's after-image names it); a delete has value None.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Mapping, Sequence

from kvlease.ops.check import Check
from kvlease.ops.drills.row_checks import WriteOp, rows_as_acknowledged

INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = "+I", "-U", "+U", "-D"
AFTER_IMAGES = (INSERT, UPDATE_AFTER)
MAX_LISTED = 50  # violations of one kind listed per check: a broken run names the first ones


@dataclass(frozen=True)
class ChangeRecord:
    """One record of a bucket's changelog: at ``offset``, ``change`` (+I, -U, +U, -D) of ``key``;
    ``value`` is the after-image (+I, +U) or the before-image (-U, -D; None if not kept)."""

    offset: int
    change: str
    key: int
    value: int | None


@dataclass(frozen=True)
class AckedWrite:
    """One acknowledged write of one bucket: ``rows`` (key -> value, None: delete) at the changelog
    offsets ``[base_offset, next_offset)`` the server answered."""

    bucket: int
    base_offset: int
    next_offset: int
    rows: Mapping[int, int | None]


@dataclass(frozen=True)
class Read:
    """A value a reader saw: ``source`` (lookup, scan, …) read ``key`` as ``value`` (None: no row)."""

    source: str
    key: int
    value: int | None
    t: float = 0.0


@dataclass(frozen=True)
class Outage:
    """A leader killed (kill -9) or paused (SIGSTOP) at ``at``, leading ``buckets`` then."""

    name: str  # e.g. "round 2: kill -9 tablet 1"
    at: float
    buckets: frozenset[int]


Changelogs = Mapping[int, Sequence[ChangeRecord]]  # bucket -> records in offset order


def _capped(violations: list[str]) -> list[str]:
    if len(violations) <= MAX_LISTED:
        return violations
    return violations[:MAX_LISTED] + [f"… and {len(violations) - MAX_LISTED} more"]


# -- acknowledged writes ---------------------------------------------------------------------------------------


def _write_problems(write: AckedWrite, records: Sequence[ChangeRecord], offsets: Sequence[int],
                    seen: Counter) -> list[str]:
    """What is wrong with one acknowledged write in its bucket's changelog ``records`` (at ``offsets``)."""
    where = f"write at {write.base_offset}..{write.next_offset - 1} of bucket {write.bucket}"
    inside = records[bisect_left(offsets, write.base_offset):bisect_left(offsets, write.next_offset)]
    problems = [f"{where}: the changelog has a record of key {r.key}, which it did not write"
                for r in inside if r.key not in write.rows]
    for key, value in sorted(write.rows.items()):
        if value is None:
            continue  # a delete of a missing key writes no record: its effect is checked on the tables
        mine = [r for r in inside if r.key == key and r.change in AFTER_IMAGES and r.value == value]
        if not mine:
            problems.append(f"{where}: key {key} = {value} is not in the changelog at those offsets")
        elif seen[(key, value)] > 1:
            problems.append(f"{where}: key {key} = {value} is in the changelog {seen[(key, value)]} times")
    return problems


def acknowledged_writes_in_changelog(acked: Sequence[AckedWrite], changelogs: Mapping[str, Changelogs],
                                     log_starts: Mapping[str, Mapping[int, int]] | None = None) -> Check:
    """Every acknowledged write is in every replica's changelog exactly once, at the offsets the server
    answered: each upsert's after-image there (once in the whole bucket), no other key's record there.
    ``log_starts`` (replica -> bucket -> first offset of its changelog; default 0): a replica rebuilt from a
    snapshot keeps its changelog from the snapshot's offset, and is not asked for the writes before it."""
    violations: list[str] = []
    for replica, buckets in sorted(changelogs.items()):
        for bucket, records in sorted(buckets.items()):
            records = sorted(records, key=lambda r: r.offset)
            offsets = [r.offset for r in records]
            seen = Counter((r.key, r.value) for r in records if r.change in AFTER_IMAGES)
            start = (log_starts or {}).get(replica, {}).get(bucket, 0)
            for write in (w for w in acked if w.bucket == bucket and w.base_offset >= start):
                violations += [f"{replica}: {p}" for p in _write_problems(write, records, offsets, seen)]
        missing = sorted({w.bucket for w in acked} - set(buckets))
        violations += [f"{replica}: no changelog of bucket {b}, which has acknowledged writes" for b in missing]
    return Check.of("every acknowledged write in every replica's changelog exactly once", _capped(violations),
                    len(acked) * len(changelogs))


def tables_as_acknowledged(history: Mapping[int, Sequence[WriteOp]],
                           tables: Mapping[str, Mapping[int, int | None]]) -> Check:
    """Every replica's final table holds what the writes say (an acknowledged write's value unless a later
    write, acknowledged or not, may have replaced it): :func:`kvlease.ops.drills.row_checks.rows_as_acknowledged`
    with each replica's table as a source."""
    check = rows_as_acknowledged(history, tables)
    return Check.of("every acknowledged write's effect in the table of every replica", _capped(list(check.violations)),
                    check.checked)


# -- readers ------------------------------------------------------------------------------------------------------


def reads_committed(reads: Iterable[Read], changelog: Changelogs) -> Check:
    """No value a reader saw is missing from the history afterwards: every value read (other than "no row")
    is the after-image of some record of its key in the final changelog (a failover took back nothing a
    reader saw)."""
    written = {(r.key, r.value) for records in changelog.values() for r in records if r.change in AFTER_IMAGES}
    reads = list(reads)
    violations = [f"{read.source} read key {read.key} = {read.value}"
                  + (f" at {read.t:.3f}" if read.t else "") + ", which no committed change record wrote"
                  for read in reads if read.value is not None and (read.key, read.value) not in written]
    return Check.of("every value a reader saw is in the committed changelog", _capped(violations), len(reads))


# -- the stream -------------------------------------------------------------------------------------------------------


def apply_changes(rows: Iterable[ChangeRecord]) -> dict[int, int]:
    """The table the change rows leave, applied in order (-U rows change nothing: their +U follows)."""
    table: dict[int, int] = {}
    for row in rows:
        if row.change in AFTER_IMAGES:
            table[row.key] = row.value
        elif row.change == DELETE:
            table.pop(row.key, None)
    return table


def stream_equals_table(stream: Mapping[int, Sequence[ChangeRecord]], table: Mapping[int, int | None]) -> Check:
    """The stream's change rows (per bucket, in the order received; bootstrap rows as +I at offset -1)
    applied in order equal the final table, and no changelog record came twice (a failover neither
    repeated nor skipped a change: a skipped one shows as a difference)."""
    violations = []
    for bucket, rows in sorted(stream.items()):
        twice = Counter((r.offset, r.change, r.key) for r in rows if r.offset >= 0)
        violations += [f"bucket {bucket}: record {change} of key {key} at offset {offset} came {n} times"
                       for (offset, change, key), n in sorted(twice.items()) if n > 1]
    got = apply_changes(r for rows in stream.values() for r in rows)
    want = {k: v for k, v in table.items() if v is not None}
    for key in sorted(set(got) | set(want)):
        if got.get(key) != want.get(key):
            show = lambda v: "no row" if v is None else str(v)  # noqa: E731
            violations.append(f"key {key}: the stream applied in order gives {show(got.get(key))}, "
                              f"the table has {show(want.get(key))}")
    return Check.of("the stream's changes applied in order equal the table", _capped(violations), len(want))


# -- replicas ----------------------------------------------------------------------------------------------------------


def replicas_identical(logs: Mapping[str, Mapping[int, Sequence[tuple[int, Hashable]]]],
                       high_watermarks: Mapping[int, int],
                       describe: Callable[[Hashable], str] = lambda fingerprint: "") -> Check:
    """Every replica's changelog of a bucket is the same below the bucket's high watermark: the same
    entries ``(base offset, fingerprint: entry bytes or CRC)`` from the highest log start of them (retention
    may differ by a moment) up to the HW, and none misses an entry the others have there. ``describe``
    names an entry by its fingerprint in a violation (e.g. its leader epoch and writer)."""
    violations, checked = [], 0
    for bucket, hw in sorted(high_watermarks.items()):
        per_replica = {name: list(buckets.get(bucket, ())) for name, buckets in sorted(logs.items())}
        start = max((entries[0][0] for entries in per_replica.values() if entries), default=0)
        below = {name: [e for e in entries if start <= e[0] < hw] for name, entries in per_replica.items()}
        if not below:
            continue
        reference_name, reference = next(iter(below.items()))
        checked += len(reference)
        for name, entries in below.items():
            if entries == reference:
                continue
            diverge = next((i for i, (a, b) in enumerate(zip(entries, reference)) if a != b),
                           min(len(entries), len(reference)))
            at = (entries[diverge][0] if diverge < len(entries) else reference[diverge][0]
                  if diverge < len(reference) else hw)
            there = [f"{n} has {describe(e[diverge][1]) or 'an entry'} at {e[diverge][0]}" if diverge < len(e)
                     else f"{n} has none" for n, e in ((name, entries), (reference_name, reference))]
            violations.append(f"bucket {bucket}: {name}'s changelog differs from {reference_name}'s at offset {at} "
                              f"(below the high watermark {hw}: {len(entries)} vs {len(reference)} entries; "
                              f"{', '.join(there)})")
    return Check.of("replicas' changelogs identical below the high watermark", _capped(violations), checked)


# -- availability ------------------------------------------------------------------------------------------------------


def leaders_served_within(outages: Sequence[Outage], successes: Mapping[int, Sequence[tuple[float, float]]],
                          bound_s: float) -> tuple[Check, list[float | None]]:
    """Every bucket a killed or paused leader led was served again within ``bound_s``
    (``zookeeper.session-timeout`` + 2 s) of the outage: a call to it sent after the outage was answered
    (``successes``: bucket -> ``(sent, answered)`` times of the calls that succeeded; a call sent before
    may have been answered by the old leader). Also the seconds until the last of its buckets came back,
    per outage (None: one never did)."""
    violations, delays = [], []
    for outage in outages:
        worst: float | None = 0.0
        for bucket in sorted(outage.buckets):
            after = [answered for sent, answered in successes.get(bucket, ()) if sent > outage.at]
            if not after:
                violations.append(f"{outage.name}: bucket {bucket} was never served again")
                worst = None
                continue
            delay = min(after) - outage.at
            if delay > bound_s:
                violations.append(f"{outage.name}: bucket {bucket} served again only after {delay:.1f}s")
            worst = None if worst is None else max(worst, delay)
        delays.append(None if worst is None else round(worst, 3))
    return Check.of(f"new leaders serve within {bound_s:g}s of each kill or pause", violations,
                    sum(len(o.buckets) for o in outages)), delays
