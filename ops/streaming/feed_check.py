"""Checking a streaming query's output against the table it read: the pure checkers of ``kvlease demo``
and the ``spark-failover`` drill.

The output is what a bootstrap-then-tail query wrote (one Arrow table): the
table's columns, ``_change_type``, ``_bucket``, ``_log_offset`` and
``_batch`` (the micro-batch id; 0 is the bootstrap). Each checker takes
plain values (Arrow tables, offset maps, dicts) and returns an
:class:`kvlease.ops.check.Check`, so a test can feed it a planted violation.

- :func:`check_state`: the rows applied in ``(_bucket, _log_offset)`` order
  (upsert ``insert`` and ``update_postimage``, delete ``delete``, skip
  ``update_preimage``; docs/spark.md, "Output columns") equal the table.
- :func:`check_tail`: every changelog record after the bootstrap is in the
  output exactly once: bucket b's change rows have offsets
  ``bootstrap_end[b] .. final_end[b] - 1``, each once.
- :func:`check_bootstrap`: the bootstrap has one ``insert`` row per key, each
  below the bootstrap's end offset.
- :func:`check_written`: the table holds what the writer was acknowledged.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.ops.check import Check

UPSERTS = frozenset({"insert", "update_postimage"})
DELETE = "delete"
PREIMAGE = "update_preimage"
#: Violations a check lists in full; past that, one last entry counts the rest.
MAX_VIOLATIONS = 100

Row = tuple  # a row's values in column order
Key = tuple  # a row's primary-key values


def rows_by_key(table: pa.Table, key: Sequence[str], columns: Sequence[str]) -> dict[Key, Row]:
    """``key -> row`` of ``table`` (rows as tuples of ``columns``)."""
    keys = list(zip(*(table.column(k).to_pylist() for k in key)))
    values = list(zip(*(table.column(c).to_pylist() for c in columns))) if columns else [()] * len(keys)
    return dict(zip(keys, values))


def apply_changes(output: pa.Table, key: Sequence[str], columns: Sequence[str]) -> dict[Key, Row]:
    """The table ``output`` describes: its rows applied in ``(_bucket, _log_offset)`` order."""
    order = output.sort_by([("_bucket", "ascending"), ("_log_offset", "ascending")])
    kinds = order.column("_change_type").to_pylist()
    keys = list(zip(*(order.column(k).to_pylist() for k in key)))
    values = list(zip(*(order.column(c).to_pylist() for c in columns)))
    state: dict[Key, Row] = {}
    for kind, k, row in zip(kinds, keys, values):
        if kind in UPSERTS:
            state[k] = row
        elif kind == DELETE:
            state.pop(k, None)
        elif kind != PREIMAGE:
            raise ValueError(f"unknown _change_type {kind!r} at key {k}")
    return state


def diff_states(got: Mapping[Key, Row], want: Mapping[Key, Row], columns: Sequence[str], *,
                got_name: str, want_name: str, key: Sequence[str]) -> list[str]:
    """One line per key whose row differs between the two states, in key order."""
    lines = []
    for k in sorted(set(got) | set(want), key=_sortable):
        a, b = got.get(k), want.get(k)
        if a == b:
            continue
        name = _key_text(key, k)
        if a is None:
            lines.append(f"{name}: not in {got_name}; in {want_name}: {_row_text(columns, b)}")
        elif b is None:
            lines.append(f"{name}: in {got_name}: {_row_text(columns, a)}; not in {want_name}")
        else:
            lines.append(f"{name}: {got_name} {_row_text(columns, a)}, {want_name} {_row_text(columns, b)}")
    return lines


def check_state(output: pa.Table, table: pa.Table, key: Sequence[str], columns: Sequence[str]) -> Check:
    """The output's rows, applied in offset order, equal ``table`` (the table read after the query)."""
    want = rows_by_key(table, key, columns)
    got = apply_changes(output, key, columns)
    lines = diff_states(got, want, columns, got_name="the output", want_name="the table", key=key)
    return Check.of("the change rows applied in (bucket, offset) order equal the table", _capped(lines),
                    checked=len(set(got) | set(want)))


def check_tail(output: pa.Table, bootstrap_ends: Mapping[int, int], final_ends: Mapping[int, int]) -> Check:
    """Every changelog record after the bootstrap is in the output once: bucket b's change rows (micro-batches
    after 0) have the offsets ``bootstrap_ends[b] .. final_ends[b] - 1``, each exactly once."""
    tail = output.filter(pc.greater(output.column("_batch"), 0))
    buckets = np.asarray(tail.column("_bucket").to_numpy(zero_copy_only=False), dtype=np.int64)
    offsets = np.asarray(tail.column("_log_offset").to_numpy(zero_copy_only=False), dtype=np.int64)
    lines: list[str] = []
    checked = 0
    for bucket in sorted(set(final_ends) | set(int(b) for b in np.unique(buckets))):
        start, end = bootstrap_ends.get(bucket), final_ends.get(bucket)
        mine = np.sort(offsets[buckets == bucket])
        if start is None or end is None:
            lines.append(f"bucket {bucket}: {len(mine)} change row(s), but the table has no such bucket")
            continue
        checked += end - start
        present, counts = np.unique(mine, return_counts=True)
        for offset, count in zip(present[counts > 1], counts[counts > 1]):
            lines.append(f"bucket {bucket}: offset {offset} is in the output {count} times")
        outside = present[(present < start) | (present >= end)]
        if len(outside):
            lines.append(f"bucket {bucket}: offset(s) {_ranges(outside)} outside the tail [{start}, {end})")
        missing = np.setdiff1d(np.arange(start, end, dtype=np.int64), present, assume_unique=True)
        if len(missing):
            lines.append(f"bucket {bucket}: offset(s) {_ranges(missing)} missing ({len(missing)} of the "
                         f"tail [{start}, {end}))")
    return Check.of("every change after the bootstrap is in the output exactly once", _capped(lines), checked)


def check_bootstrap(output: pa.Table, key: Sequence[str], bootstrap_ends: Mapping[int, int]) -> Check:
    """The bootstrap (micro-batch 0) has one ``insert`` row per key, each below its bucket's end offset."""
    boot = output.filter(pc.equal(output.column("_batch"), 0))
    keys = list(zip(*(boot.column(k).to_pylist() for k in key)))
    lines = [f"{_key_text(key, k)}: {n} rows in the bootstrap" for k, n in Counter(keys).items() if n > 1]
    kinds = Counter(boot.column("_change_type").to_pylist())
    lines += [f"{n} bootstrap row(s) of type {kind!r}, not 'insert'" for kind, n in kinds.items() if kind != "insert"]
    for bucket, offset in zip(boot.column("_bucket").to_pylist(), boot.column("_log_offset").to_pylist()):
        end = bootstrap_ends.get(bucket)
        if end is None or offset >= end:
            lines.append(f"bucket {bucket}: a bootstrap row at offset {offset}, past the bootstrap's end {end}")
    return Check.of("the bootstrap has one row per key, as of its planned offsets", _capped(lines), len(keys))


def check_written(expected: Mapping[Key, Row], table: pa.Table, key: Sequence[str],
                  columns: Sequence[str]) -> Check:
    """The table holds exactly what the writer was acknowledged (``expected``: key -> row)."""
    lines = diff_states(rows_by_key(table, key, columns), expected, columns, got_name="the table",
                        want_name="the acknowledged writes", key=key)
    return Check.of("the table holds every acknowledged write", _capped(lines), len(expected))


# -- text ------------------------------------------------------------------------------------------


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= MAX_VIOLATIONS:
        return lines
    return lines[:MAX_VIOLATIONS] + [f"… and {len(lines) - MAX_VIOLATIONS} more"]


def _ranges(values: np.ndarray) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"`` (at most 5 ranges shown)."""
    runs: list[list[int]] = []
    for v in (int(x) for x in np.sort(values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:5]]
    return ", ".join(shown) + (f", … ({len(runs) - 5} more ranges)" if len(runs) > 5 else "")


def _key_text(key: Sequence[str], k: Key) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in zip(key, k))


def _row_text(columns: Sequence[str], row: Row) -> str:
    return "{" + ", ".join(f"{c}: {v!r}" for c, v in zip(columns, row)) + "}"


def _sortable(k: Key) -> tuple[Any, ...]:
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in k)
