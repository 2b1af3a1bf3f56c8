"""Batches of a live KV scan: values read from a RocksDB iterator, as an Arrow IPC stream.

:func:`read_batch` reads at about the speed of rocksdict's own ``items()``
(no Python bytecode per row, see its docstring) but from the session's
snapshot iterator; :func:`records_ipc` makes a response's ``records``.
"""

from __future__ import annotations

import operator
import sys
from bisect import bisect_right
from itertools import accumulate, islice, repeat

import pyarrow as pa
from rocksdict import RdictIter

from common.codec import batch_to_ipc

#: The schema of a response's ``records``: the rows' encoded values (docs/row-encoding.md).
VALUE_SCHEMA = pa.schema([("value", pa.binary())])
ROW_OVERHEAD = 4  # bytes counted per row on top of its value: its Arrow offset
IPC_OVERHEAD = 320  # bytes of an IPC stream of VALUE_SCHEMA besides the rows: schema, header, padding
_FIRST_CHUNK, _MAX_CHUNK = 64, 4096  # rows pulled from RocksDB per step of a batch
_NEXT = RdictIter.next
_FIRST = operator.itemgetter(0)


def read_batch(it: RdictIter, budget_bytes: int, max_rows: int | None = None) -> tuple[list[bytes], bytes, bool]:
    """``(values, last_key, has_more)``: the values from ``it``'s position on, in key order.

    Takes rows while their values plus :data:`ROW_OVERHEAD` each fit in
    ``budget_bytes`` — at least one row if any remain — and at most
    ``max_rows`` (None: no cap); leaves ``it`` on the first row not taken.
    ``last_key`` is the key of the last value (``b""`` for none); ``has_more``
    tells whether rows remain (and ``max_rows`` was not reached).

    The rows are pulled in chunks by C-level iteration (no Python bytecode
    per row): ``zip`` calls ``value()`` then ``next()``, and stops at the first
    ``None`` value, i.e. past the end — so ``next()`` never runs on an invalid
    iterator (RocksDB's ``Next()`` there crashes the process). Chunks start
    small and grow with the room left, so a batch overshoots by at most one
    chunk (<= 4096 rows), stepped back with ``prev()``.
    """
    values: list[bytes] = []
    used = 0
    rows_left = sys.maxsize if max_rows is None else max_rows
    step = _FIRST_CHUNK
    pull = zip(iter(it.value, None), map(_NEXT, repeat(it)))
    while rows_left > 0:
        chunk = list(map(_FIRST, islice(pull, min(step, rows_left))))
        if not chunk:
            break
        size = sum(map(len, chunk)) + ROW_OVERHEAD * len(chunk)
        room = budget_bytes - used
        if size <= room:
            values += chunk
            used += size
            rows_left -= len(chunk)
            step = max(1, min(_MAX_CHUNK, 2 * step, int((budget_bytes - used) * len(values) / used)))
            continue
        cost = list(accumulate(map(operator.add, map(len, chunk), repeat(ROW_OVERHEAD))))  # the last chunk only
        fit = bisect_right(cost, room) or (0 if values else 1)  # at least one row per batch
        values += chunk[:fit]
        rows_left -= fit
        _step_back(it, len(chunk) - fit)
        break
    last_key = b""
    if values:  # the key of the last value: one step back and forth
        if it.valid():
            it.prev()
            last_key = it.key()
            it.next()
        else:
            it.seek_to_last()
            last_key = it.key()
            it.next()
    return values, last_key, rows_left > 0 and it.valid()


def _step_back(it: RdictIter, rows: int) -> None:
    if not rows:
        return
    if not it.valid():  # past the end: the last row is one step back
        it.seek_to_last()
        rows -= 1
    for _ in range(rows):
        it.prev()


def records_ipc(values: list[bytes]) -> bytes:
    """``values`` as an Arrow IPC stream of one binary column ``value``."""
    return batch_to_ipc(pa.record_batch([pa.array(values, pa.binary())], schema=VALUE_SCHEMA))
