"""Changelog records as one RocksDB WriteBatch: what a follower's applier and a replay write
(:meth:`kvlease.tablet.store.kvstore.KvStore.apply_records`; ``docs/bucket-store.md``, "Replication").
:func:`key_order` also orders a leader's large write of distinct keys (``tablet/bucket/writes.py``).

+I and +U put their value, -D deletes its key, -U changes nothing (the +U after it carries the row).

A large step (at least :data:`SORTED_MIN` acting records) is written in key
order, each key once, by its last acting record: a key's records act in
offset order, so its last one decides what the row is afterwards, and the
rows are the same as from the records one by one (a test compares the two on
random records with repeated keys and deletes). RocksDB's memtable takes a
sorted batch several times faster: its skiplist resumes each insert from the
last one's place (measured here: 100,000 puts of 100-byte values in random
key order 75-105 ms, the same sorted 11 ms; the sort costs ~7 ms). A step
already in key order, each key once, is not sorted again; smaller steps go in
log order: for a few records the sort costs more than it saves.
"""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import WriteBatch

from kvlease.common.errors import show
from kvlease.common.logentry import ChangeType
from kvlease.tablet.store.change_records import increasing

#: Acting records (+I, +U, -D) of one step from which it is written in key order.
SORTED_MIN = 1024
_PUT_TYPES = (int(ChangeType.INSERT), int(ChangeType.UPDATE_AFTER))
_DELETE = int(ChangeType.DELETE)


class RecordWithoutValue(ValueError):
    """A +I or +U record without a value: the changelog is damaged (nothing of the step is written)."""


def write_batch(records: list[pa.RecordBatch]) -> WriteBatch:
    """The puts and deletes of ``records`` (changelog batches, in offset order) as one WriteBatch (see the
    module docstring). Raises :class:`RecordWithoutValue`."""
    acting = [_acting(entry) for entry in records]
    if sum(entry.num_rows for entry in acting) >= SORTED_MIN:
        acting = [last_per_key(acting)]
    batch = WriteBatch(raw_mode=True)
    for entry in acting:
        _add(batch, entry)
    return batch


def last_per_key(entries: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The acting records of ``entries`` (in offset order) in key order, each key once: its last record."""
    records = entries[0] if len(entries) == 1 else pa.concat_batches(entries)
    n, keys = records.num_rows, records.column(1)
    if increasing(keys):  # already in key order, each key once (a tail of updates in key order)
        return records
    order = key_order(keys)  # stable: a key's records stay in offset order
    ordered = keys.take(order)
    last = np.ones(n, bool)  # the last of each run of equal keys
    last[:-1] = pc.not_equal(ordered.slice(0, n - 1), ordered.slice(1)).to_numpy(zero_copy_only=False)
    return records.take(pa.array(order[last]))


def key_order(keys: pa.BinaryArray) -> np.ndarray:
    """The stable sort of ``keys`` (bytewise, RocksDB's order) as indices. Keys of one width of at most 8
    bytes (a BIGINT or INT key) are sorted as big-endian integers, ~2.5x faster than Arrow's sort of bytes."""
    n = len(keys)
    if keys.type != pa.binary() or keys.null_count:
        return pc.sort_indices(keys).to_numpy()
    offsets = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset:keys.offset + n + 1]
    width = int(offsets[1] - offsets[0]) if n else 0
    if not 0 < width <= 8 or not (np.diff(offsets) == width).all():
        return pc.sort_indices(keys).to_numpy()
    data = np.frombuffer(keys.buffers()[2], np.uint8)[offsets[0]:offsets[-1]].reshape(n, width)
    padded = np.zeros((n, 8), np.uint8)  # zeros after the key: the same order as the bytes
    padded[:, :width] = data
    return np.argsort(padded.view(">u8").ravel(), kind="stable")


def _acting(entry: pa.RecordBatch) -> pa.RecordBatch:
    """``entry`` without its -U records; RecordWithoutValue if a put has no value."""
    types = entry.column(0).to_numpy(zero_copy_only=False)
    puts = np.isin(types, _PUT_TYPES)
    acts = puts | (types == _DELETE)
    if not acts.all():  # left out before their keys and values are converted
        entry, types, puts = entry.filter(pa.array(acts)), types[acts], puts[acts]
    values = entry.column(2)
    if values.null_count and (bad := puts & values.is_null().to_numpy(zero_copy_only=False)).any():
        i = int(bad.argmax())
        raise RecordWithoutValue(f"changelog record {ChangeType(int(types[i]))} of key "
                                 f"{show(entry.column(1)[i].as_py())} has no value")
    return entry


def _add(batch: WriteBatch, entry: pa.RecordBatch) -> None:
    keys, values = entry.column(1).to_pylist(), entry.column(2).to_pylist()
    deletes = entry.column(0).to_numpy(zero_copy_only=False) == _DELETE
    if not deletes.any():  # inserts and updates only: one pass, no per-record branch
        collections.deque(map(batch.put, keys, values), maxlen=0)  # the loop runs in C
        return
    for delete, key, value in zip(deletes.tolist(), keys, values):
        if delete:
            batch.delete(key)
        else:
            batch.put(key, value)
