"""Batches of a live KV scan: values read from a RocksDB iterator into the buffers of an Arrow binary column.

:func:`read_batch` reads at about the speed of rocksdict's own ``items()``
(no Python bytecode per row, see its docstring) but from the session's
snapshot iterator, and keeps no Python object per row beyond the step it is
read in: each step's values are joined into one ``bytes`` (a piece of the
column's data buffer) and their lengths go into one numpy array (its
offsets). :mod:`kvlease.tablet.scan.wire` puts those buffers on the wire;
:func:`records_ipc` makes the ``records`` of a list of values (empty answers,
tests).
"""

from __future__ import annotations

import operator
import sys
from bisect import bisect_right
from dataclasses import dataclass
from array import array
from itertools import accumulate, compress, islice, repeat
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
from rocksdict import RdictIter

from kvlease.common.codec import batch_to_ipc

#: The schema of a response's ``records``: the rows' encoded values (docs/row-encoding.md).
VALUE_SCHEMA = pa.schema([("value", pa.binary())])
ROW_OVERHEAD = 4  # bytes counted per row on top of its value: its Arrow offset
IPC_OVERHEAD = 320  # bytes of an IPC stream of VALUE_SCHEMA besides the rows: schema, header, padding
_FIRST_CHUNK, _MAX_CHUNK = 64, 4096  # rows pulled from RocksDB per step of a batch
_NEXT = RdictIter.next
_MAX_DATA = np.iinfo(np.int32).max  # bytes of values in a batch: Arrow binary offsets are int32


@dataclass(frozen=True, eq=False)
class Batch:
    """The rows of one call, as the buffers of a binary Arrow column ``value``.

    ``chunks`` concatenated are the values in key order (the column's data
    buffer); ``offsets`` (int32, ``count + 1``) where each value starts in it.
    ``last_key``: the key of the last value (``b""`` for none). ``has_more``:
    rows remain (and the row cap was not reached).
    """

    chunks: list[bytes]
    offsets: np.ndarray
    last_key: bytes
    has_more: bool

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def data_size(self) -> int:
        return int(self.offsets[-1])

    def values(self) -> list[bytes]:
        """The values as Python bytes (tests and small batches only: one object per row)."""
        data = b"".join(self.chunks)
        return [data[a:b] for a, b in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist())]


#: A batch of no rows.
EMPTY = Batch([], np.zeros(1, np.int32), b"", False)


def read_batch(it: RdictIter, budget_bytes: int, max_rows: int | None = None) -> Batch:
    """The rows from ``it``'s position on, in key order, as a :class:`Batch`.

    Takes rows while their values plus :data:`ROW_OVERHEAD` each fit in
    ``budget_bytes`` — at least one row if any remain — and at most
    ``max_rows`` (None: no cap); leaves ``it`` on the first row not taken.
    The same position, budget and cap give the same batch (a replay is
    rebuilt this way).

    The rows are pulled in chunks by C-level iteration (no Python bytecode
    per row): ``compress`` calls ``value()``, then ``next()`` (whose ``None``,
    negated, selects the value), and stops at the first ``None`` value, i.e.
    past the end — so ``next()`` never runs on an invalid iterator (RocksDB's
    ``Next()`` there crashes the process). Chunks start
    small and grow with the room left, so a batch overshoots by at most one
    chunk (<= 4096 rows), stepped back with ``prev()``. Each chunk's values
    are joined at once and dropped: a batch holds its data about once, not as
    one object per row.
    """
    pull = compress(iter(it.value, None), map(operator.not_, map(_NEXT, repeat(it))))
    chunks, lengths, rows_left, rest = _fill(lambda n: list(islice(pull, n)), budget_bytes, max_rows)
    _step_back(it, len(rest))
    last_key = b""
    if lengths:  # the key of the last value: one step back and forth
        if it.valid():
            it.prev()
            last_key = it.key()
            it.next()
        else:
            it.seek_to_last()
            last_key = it.key()
            it.next()
    return _batch(chunks, lengths, last_key, rows_left > 0 and it.valid())


class ValueReader:
    """A scan session's forward reads through a rocksdict values iterator (``Rdict.values()``,
    an ``RdictValues``): one C call per row where :func:`read_batch` makes two (``value()``,
    ``next()``), ~25% less CPU per row read.

    The values iterator is the session's snapshot's (:meth:`KvSnapshot.values`, made with its
    seekable iterator under the write lock, so both read the same state); this object holds no
    reference to it, so closing the snapshot frees it. Such an iterator can neither seek, step
    back nor tell keys, hence:

    - the rows pulled past the end of a batch wait in :attr:`pending` for the next one (at most
      one chunk, <= 4096 rows);
    - the key of a batch's last value comes from ``key_of(value)`` (a value holds the whole
      row, docs/row-encoding.md) and is checked on the seekable iterator: the key must be there
      and hold that value. Should the check fail, the key is found by stepping that iterator
      from the batch's start (as slow as :func:`read_batch`, and as exact).

    The batches are those :func:`read_batch` makes from the same place with the same budget
    and cap: the longest run of rows that fits (at least one), so a replay through the seekable
    iterator gives the same bytes.
    """

    def __init__(self, key_of: Callable[[bytes], bytes], start: bytes = b"") -> None:
        self.key_of = key_of
        self.start = start  # where the next batch starts: a key to seek to
        self.pending: list[bytes] = []  # values pulled from the iterator, not yet in a batch
        self.key_misses = 0  # last keys found by stepping because key_of's failed the check

    def read(self, values: Iterator[bytes], it: RdictIter, budget_bytes: int,
             max_rows: int | None = None) -> Batch:
        """The next batch (the rows after the last one read, as :func:`read_batch` takes them);
        ``values``: the snapshot's values iterator, ``it``: its seekable iterator (any position;
        left anywhere)."""
        def take(n: int) -> list[bytes]:
            if not self.pending:
                return list(islice(values, n))
            chunk = self.pending[:n]
            del self.pending[:n]
            if len(chunk) < n:
                chunk.extend(islice(values, n - len(chunk)))
            return chunk

        chunks, lengths, rows_left, rest = _fill(take, budget_bytes, max_rows)
        self.pending[:0] = rest
        if not lengths:
            return EMPTY
        tail = chunks[-1]  # the last value ends the last chunk
        last_key = self._last_key(it, tail[len(tail) - lengths[-1]:], len(lengths))
        self.start = last_key + b"\x00"
        if rows_left > 0 and not self.pending:
            self.pending.extend(islice(values, 1))  # is there one more row?
        return _batch(chunks, lengths, last_key, rows_left > 0 and bool(self.pending))

    def _last_key(self, it: RdictIter, value: bytes, count: int) -> bytes:
        try:
            key = self.key_of(value)
        except Exception:  # noqa: BLE001 - a value key_of cannot read: found by stepping below
            key = None
        if key is not None:
            it.seek(key)
            if it.valid() and it.key() == key and it.value() == value:
                return key
        self.key_misses += 1
        it.seek(self.start)
        for _ in range(count - 1):
            if not it.valid():  # RocksDB's Next() on an invalid iterator crashes the process
                break
            it.next()
        if not it.valid() or it.value() != value:
            raise RuntimeError("a scan's values iterator and its snapshot iterator disagree")
        return it.key()


def _fill(take: Callable[[int], list[bytes]], budget_bytes: int, max_rows: int | None
          ) -> tuple[list[bytes], array, int, list[bytes]]:
    """Values from ``take(n)`` (the next n, fewer at the end) that fit ``budget_bytes`` (see
    :func:`read_batch`): their joined chunks, their lengths, the rows the cap leaves, and the
    values taken beyond the batch (the caller steps back over them or keeps them)."""
    chunks: list[bytes] = []
    lengths = array("I")  # unsigned: its items convert without PyArg_Parse
    used = 0
    rows_left = sys.maxsize if max_rows is None else max_rows
    step = _FIRST_CHUNK
    rest: list[bytes] = []
    while rows_left > 0:
        chunk = take(min(step, rows_left))
        if not chunk:
            break
        joined = b"".join(chunk)
        size = len(joined) + ROW_OVERHEAD * len(chunk)
        room = budget_bytes - used
        if size <= room:
            chunks.append(joined)
            lengths.extend(map(len, chunk))
            used += size
            rows_left -= len(chunk)
            step = max(1, min(_MAX_CHUNK, 2 * step, int((budget_bytes - used) * len(lengths) / used)))
            continue
        del joined
        cost = list(accumulate(map(operator.add, map(len, chunk), repeat(ROW_OVERHEAD))))  # the last chunk only
        fit = bisect_right(cost, room) or (0 if lengths else 1)  # at least one row per batch
        if fit:
            chunks.append(b"".join(chunk[:fit]))
            lengths.extend(map(len, chunk[:fit]))
            used += cost[fit - 1]
        rows_left -= fit
        rest = chunk[fit:]
        break
    if used - ROW_OVERHEAD * len(lengths) > _MAX_DATA:  # one value can be larger than the budget
        raise ValueError(f"a scan batch of {used} bytes does not fit an Arrow binary column")
    return chunks, lengths, rows_left, rest


def _batch(chunks: list[bytes], lengths: array, last_key: bytes, has_more: bool) -> Batch:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(np.frombuffer(lengths, np.int32), out=offsets[1:])
    return Batch(chunks, offsets, last_key, has_more)


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
