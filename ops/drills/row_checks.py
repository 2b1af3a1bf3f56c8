"""Pure checkers of table data for the drills: rows read back and live scans against the writes made.

Each key is written by one client thread, one call at a time, so its writes
have an order. A write is acknowledged or not (the call failed: it may or may
not have been applied). The row of a key at an instant ``T`` is the value of
the last write applied before ``T``: the last write acknowledged by then, or
any later write already sent. Unacknowledged writes before an acknowledged
one are overwritten by it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from kvlease.ops.check import Check
from kvlease.ops.drills.checks import UNTYPED

INF = float("inf")


@dataclass(frozen=True)
class WriteOp:
    """One upsert (``value``) or delete (``value`` None) of ``key``, sent at ``t0``, ended at ``t1``."""

    key: int
    value: int | None
    t0: float
    t1: float
    acked: bool


def possible_values(writes: Sequence[WriteOp], t_from: float = INF, t_to: float = INF) -> set[int | None]:
    """The values the key may hold at some instant in ``[t_from, t_to]`` (None: no row).

    With the defaults: the values it may hold once every write has ended.
    """
    last = -1
    for i, w in enumerate(writes):
        if w.acked and w.t1 <= t_from:
            last = i
    values = {writes[last].value if last >= 0 else None}
    values.update(w.value for w in writes[last + 1:] if w.t0 <= t_to)
    return values


def _show(values: set[int | None]) -> str:
    return ", ".join("no row" if v is None else str(v) for v in sorted(values, key=lambda v: (v is not None, v or 0)))


def rows_as_acknowledged(history: Mapping[int, Sequence[WriteOp]],
                         readbacks: Mapping[str, Mapping[int, int | None]]) -> Check:
    """Every key reads back (from each source, e.g. ``lookup``, ``scan``) as its writes allow: an
    acknowledged write's value unless a later unacknowledged one may have replaced it; no row
    appears that was never written."""
    violations = []
    for key in sorted(history):
        allowed = possible_values(history[key])
        for source, rows in readbacks.items():
            value = rows.get(key)
            if value not in allowed:
                got = "no row" if value is None else value
                violations.append(f"key {key}: {source} reads {got}, the writes allow {_show(allowed)}")
    for source, rows in readbacks.items():
        for key in sorted(set(rows) - set(history)):
            if rows[key] is not None:
                violations.append(f"key {key}: {source} reads {rows[key]}, but it was never written")
    return Check.of("every acknowledged write present (" + ", ".join(readbacks) + ")", violations, len(history))


@dataclass(frozen=True)
class ScanRecord:
    """One live scan of a bucket, open from ``t_open`` until ``t_end``, and what it returned."""

    name: str
    bucket: int
    t_open: float
    t_end: float
    rows: Sequence[tuple[int, int]]  # (key, value) in the order received
    complete: bool  # read to its end (a lost session resumed counts as complete)
    resume: bool  # opened with resume=True
    resumed: int = 0
    error: str = ""  # the error's type name if it ended with one
    interrupted: bool = False  # the fault struck while it was open


def scans_match(scans: Sequence[ScanRecord], history: Mapping[int, Sequence[WriteOp]],
                bucket_of: Mapping[int, int]) -> Check:
    """No scan returned wrong data: every row's value is one its key may have held while the scan
    was open, each key once and in its own bucket; a complete scan misses no row that must exist."""
    violations, checked = [], 0
    for scan in scans:
        seen = Counter(key for key, _ in scan.rows)
        violations += [f"{scan.name}: key {key} returned {n} times" for key, n in sorted(seen.items()) if n > 1]
        for key, value in scan.rows:
            checked += 1
            if key not in history:
                violations.append(f"{scan.name}: key {key} (value {value}) was never written")
                continue
            if bucket_of.get(key, scan.bucket) != scan.bucket:
                violations.append(f"{scan.name}: key {key} belongs to bucket {bucket_of[key]}, not {scan.bucket}")
            allowed = possible_values(history[key], scan.t_open, scan.t_end)
            if value not in allowed:
                violations.append(f"{scan.name}: key {key} has value {value}, while open it could be {_show(allowed)}")
        if scan.complete:
            for key in sorted(k for k, b in bucket_of.items() if b == scan.bucket and k not in seen):
                allowed = possible_values(history.get(key, ()), scan.t_open, scan.t_end)
                if None not in allowed:
                    violations.append(f"{scan.name}: key {key} missing, while open it was {_show(allowed)}")
    return Check.of("scans return only right data", violations, checked)


def scans_end_cleanly(scans: Sequence[ScanRecord]) -> Check:
    """A scan the fault interrupted ends with a typed error (a resumable one names where it
    stopped) or, opened with ``resume=True``, reads to its end by resuming after ``resume_key``."""
    violations = []
    for scan in scans:
        if scan.complete:
            continue
        if scan.resume:
            violations.append(f"{scan.name}: opened with resume=True but ended with {scan.error or 'nothing'}")
        elif not scan.error or scan.error in UNTYPED or scan.error.startswith("internal:"):
            violations.append(f"{scan.name}: ended without a typed error ({scan.error or 'no error'})")
    return Check.of("open scans get a typed error or resume", violations, len(scans))
