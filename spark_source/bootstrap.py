"""A bucket's rows as of a changelog offset: a remote KV snapshot with a changelog range merged on top.

The snapshot is fetched through the remote storage interface into a
task-local temp dir, opened read-only and iterated in key order, in chunks.
The changelog range ``[snapshot log_offset, end)`` is first reduced to the
final state of each key it touches (memory bounded by the range, not the
snapshot); each chunk of snapshot rows then drops the keys the range changed
and takes in their new values and the keys it inserted, in key order. Chunks
the range does not touch pass through untouched. The temp dir goes when the
iteration ends, also on failure or when the consumer stops early.
"""

from __future__ import annotations

import bisect
import itertools
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from common import errors
from common.kvsnapshot import download, manifest_path, open_read_only
from common.model import TableBucket
from common.storage import RemoteStorage, StorageNotFound

CHUNK_ROWS = 1 << 16


class SnapshotGoneError(errors.SnapshotNotFoundError):
    """The snapshot a split was planned on was released or reclaimed before the split read it."""


def task_temp_dir() -> str:
    """A fresh temp dir on the executor's local disk (Spark's local dir when it names one)."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
    return tempfile.mkdtemp(prefix="kvlease-split-", dir=local if local and os.path.isdir(local) else None)


@contextmanager
def open_snapshot(storage: RemoteStorage, tb: TableBucket, snapshot_id: int, *, what: str) -> Iterator[
        tuple[int, Iterator[tuple[list[bytes], list[bytes]]]]]:
    """``(log_offset, chunks of (keys, values) in key order)`` of the snapshot, while in the ``with``.

    ``what`` names the split in errors. The temp dir is removed on leaving.
    """
    target = task_temp_dir()
    db = None
    try:
        try:
            manifest = download(storage, manifest_path(tb, snapshot_id), os.path.join(target, "db"))
        except StorageNotFound as exc:
            raise SnapshotGoneError(f"{what}: snapshot {snapshot_id} is gone from {storage.uri} ({exc}); its lease "
                                    "was released or expired and the snapshot reclaimed: run the read again"
                                    ) from None
        db = open_read_only(os.path.join(target, "db"))
        yield manifest.log_offset, _chunks(db)
    finally:
        if db is not None:
            db.close()
        shutil.rmtree(target, ignore_errors=True)


def _chunks(db) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Keys and values in chunks, from two iterators in lockstep (the snapshot is read-only, so both
    see the same rows in the same order): about twice as fast as ``items()`` and its tuples."""
    keys, values = iter(db.keys()), iter(db.values())
    while chunk := list(itertools.islice(keys, CHUNK_ROWS)):
        yield chunk, list(itertools.islice(values, len(chunk)))


def merge(chunks: Iterator[tuple[list[bytes], list[bytes]]], changes: dict[bytes, bytes | None]) -> Iterator[pa.Array]:
    """Values (binary arrays) of the snapshot chunks with ``changes`` applied, in key order."""
    change_keys = sorted(changes)
    done = 0
    for keys, values in chunks:
        upto = bisect.bisect_right(change_keys, keys[-1], lo=done)
        if upto == done:
            yield pa.array(values, pa.binary())
            continue
        window = change_keys[done:upto]
        done = upto
        yield _apply(pa.array(keys, pa.binary()), pa.array(values, pa.binary()), window, changes)
    rest = [changes[k] for k in change_keys[done:] if changes[k] is not None]
    if rest:
        yield pa.array(rest, pa.binary())


def _apply(keys: pa.Array, values: pa.Array, window: list[bytes], changes: dict[bytes, bytes | None]) -> pa.Array:
    """The chunk's values minus the window's keys, plus the window's live values, in key order."""
    window_keys = pa.array(window, pa.binary())
    window_values = pa.array([changes[k] for k in window], pa.binary())
    untouched = pc.invert(pc.is_in(keys, value_set=window_keys))
    live = pc.is_valid(window_values)
    all_keys = pa.concat_arrays([keys.filter(untouched), window_keys.filter(live)])
    all_values = pa.concat_arrays([values.filter(untouched), window_values.filter(live)])
    return all_values.take(pc.sort_indices(all_keys))
