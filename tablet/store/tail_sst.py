"""A run of changelog entries as one SST file: what applying them to RocksDB writes, ready to ingest.

A follower applies its leader's change records to RocksDB as blind writes
(``KvStore.apply_records``: +I and +U put the record's value, -D deletes the
key, -U changes nothing; the leader resolved merge engines, partial updates
and expiry before it wrote the records). Applied in offset order, each key
ends with its last acting record's effect, whatever RocksDB held before. So
the same effect fits in one SST file holding, per key, the last acting record:
its value, or a deletion (a tombstone). Ingested into RocksDB after its other
files (``KvStore.ingest``), the file's entries are newer than anything there,
as the records applied one by one would be.

:func:`build` makes that file from framed entries (as ``FetchLog`` returns
them: each checked and decoded with :func:`~kvlease.common.logentry.decode_entry`)
while nothing else needs the CPU: a rebuild builds it from the changelog tail
it fetched while the snapshot downloads (``tablet/replication/rebuild.py``),
then ingests it in one step instead of applying the records after the
install. Whatever it cannot represent exactly (entries not contiguous from
the first offset, a put without a value) it leaves to the plain apply:
:func:`build` returns None.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import SstFileWriter

from kvlease.common.fsync import fsync_path
from kvlease.common.logentry import ChangeType, decode_entry
from kvlease.tablet.store.kvstore import sst_options

_ACTS = pa.array([int(ChangeType.INSERT), int(ChangeType.UPDATE_AFTER), int(ChangeType.DELETE)], pa.int8())
_PUTS = pa.array([int(ChangeType.INSERT), int(ChangeType.UPDATE_AFTER)], pa.int8())


@dataclass(frozen=True)
class TailSst:
    """The SST file at ``path`` holds the effect of the records ``from_offset`` … ``next_offset - 1``;
    ``key_range``: the lowest and the highest key of any of those records (None: none acts)."""

    path: str
    from_offset: int
    next_offset: int
    key_range: tuple[bytes, bytes] | None
    keys: int  # entries in the file (one per key)


def build(entries: list[bytes], from_offset: int, path: str, *, fsync: bool = True) -> TailSst | None:
    """The SST file at ``path`` (created; its directory must exist) of the framed ``entries``, which must
    start at ``from_offset`` and follow each other; fsynced with its directory (``fsync``). None, and no
    file, if there is nothing to write or the entries cannot be represented exactly (see the module
    docstring). CorruptLogError for a damaged entry; OSError or rocksdict's error if the file cannot be
    written (it is removed then)."""
    records = _records(entries, from_offset)
    if records is None:
        return None
    batches, next_offset = records
    if not batches:
        return None
    table = pa.Table.from_batches(batches).combine_chunks()
    types, keys, values = (table.column(i).chunk(0) if table.num_rows else table.column(i) for i in range(3))
    key_range = tuple(v.as_py() for v in pc.min_max(keys).values())
    acting = pc.is_in(types, _ACTS)
    if not pc.all(acting).as_py():
        types, keys, values = types.filter(acting), keys.filter(acting), values.filter(acting)
    if len(keys) == 0:
        return None
    last = _last_per_key(keys)
    types, keys, values = types.take(last), keys.take(last), values.take(last)
    puts = pc.is_in(types, _PUTS).to_numpy(zero_copy_only=False)
    if (puts & values.is_null().to_numpy(zero_copy_only=False)).any():
        return None  # the plain apply refuses it with its own error
    _write(path, keys.to_pylist(), values.to_pylist(), puts, fsync)
    return TailSst(path, from_offset, next_offset, key_range, len(keys))


def _records(entries: list[bytes], from_offset: int) -> tuple[list[pa.RecordBatch], int] | None:
    """The entries' record batches and the offset after the last, or None unless they run on from
    ``from_offset`` without a gap or an overlap."""
    batches, expected = [], from_offset
    for frame in entries:
        entry = decode_entry(frame)
        if entry.base_offset != expected:
            return None
        batches.append(entry.records)
        expected = entry.next_offset
    return batches, expected


def _last_per_key(keys: pa.Array) -> pa.Array:
    """The positions in ``keys`` of each key's last occurrence, in key order (bytewise, RocksDB's default)."""
    order = pc.sort_indices(keys)  # stable: a key's occurrences stay in log order
    ordered = keys.take(order)
    n = len(ordered)
    last = np.ones(n, dtype=bool)  # row i is its key's last unless row i + 1 has the same key
    if n > 1:
        last[:-1] = pc.not_equal(ordered.slice(0, n - 1), ordered.slice(1)).to_numpy(zero_copy_only=False)
    return order.filter(pa.array(last))


def _write(path: str, keys: list[bytes], values: list[bytes | None], puts: np.ndarray, fsync: bool) -> None:
    writer = SstFileWriter(sst_options())
    try:
        writer.open(path)
        if puts.all():
            collections.deque(map(writer.__setitem__, keys, values), maxlen=0)  # the loop runs in C
        else:
            for put, key, value in zip(puts.tolist(), keys, values):
                if put:
                    writer[key] = value
                else:
                    del writer[key]
        writer.finish()
        if fsync:
            fsync_path(path)
            fsync_path(os.path.dirname(path) or ".")
    except BaseException:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        raise


__all__ = ["TailSst", "build"]
