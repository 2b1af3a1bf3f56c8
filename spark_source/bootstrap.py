"""A bucket's rows as of a changelog offset: a remote KV snapshot with a changelog range merged on top.

The snapshot is fetched through the remote storage interface into a
task-local temp dir, opened read-only and its values iterated in key order,
in chunks (a value holds the whole row, primary key included: the keys are
not read, they are encoded again from the decoded rows where needed). The
changelog range ``[snapshot log_offset, end)`` is first reduced to the final
state of each key it touches (memory bounded by the range, not the
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
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from kvlease.client.transport import RetryPolicy
from kvlease.common import errors
from kvlease.common.codec import RowCodec
from kvlease.common.kvsnapshot import download, manifest_path, open_read_only, scan_read_options
from kvlease.common.model import TableBucket
from kvlease.common.row_expiry import live_rows
from kvlease.common.storage import RemoteStorage, StorageNotFound

CHUNK_ROWS = 1 << 16


class SnapshotGoneError(errors.SnapshotNotFoundError):
    """The snapshot a split was planned on was released or reclaimed before the split read it."""


class SnapshotFileMissingError(errors.InvalidSnapshotError):
    """A file of a snapshot that the read's lease still holds is missing from remote storage."""


def task_temp_dir() -> str:
    """A fresh temp dir on the executor's local disk (Spark's local dir when it names one)."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
    return tempfile.mkdtemp(prefix="kvlease-split-", dir=local if local and os.path.isdir(local) else None)


@contextmanager
def open_snapshot(storage: RemoteStorage, tb: TableBucket, snapshot_id: int, *, what: str,
                  held: Callable[[], bool] = lambda: False,
                  retry: RetryPolicy | None = None) -> Iterator[tuple[int, Iterator[list[bytes]]]]:
    """``(log_offset, chunks of values in key order)`` of the snapshot, while in the ``with``.

    ``what`` names the split in errors; ``held()`` says whether the read's lease holds the snapshot now
    (asked when a file is missing: a lost file of a held snapshot, or a snapshot that was reclaimed).
    ``retry``: how long a download that failed on remote storage (an outage: StorageError) is tried again
    (the client's ``retry.timeout``; None: not retried); a missing file is not retried. The temp dir is
    removed on leaving.
    """
    target = task_temp_dir()
    db = None
    try:
        def fetch():
            try:
                return download(storage, manifest_path(tb, snapshot_id), os.path.join(target, "db"))
            except StorageNotFound as exc:
                raise _missing(storage, snapshot_id, what, exc, held()) from None

        manifest = (retry or RetryPolicy(total_s=0)).call(fetch, retry_on=(errors.StorageError,))
        db = open_read_only(os.path.join(target, "db"))
        yield manifest.log_offset, _chunks(db)
    finally:
        if db is not None:
            db.close()
        shutil.rmtree(target, ignore_errors=True)


def _missing(storage: RemoteStorage, snapshot_id: int, what: str, exc: StorageNotFound,
             held: bool) -> errors.KvLeaseError:
    path = exc.details.get("path") or "?"
    if held:
        return SnapshotFileMissingError(
            f"{what}: snapshot {snapshot_id} is held by the read's lease, but its file {storage.uri}/{path} is "
            "missing from remote storage (lost, or never fully uploaded): the snapshot cannot be read", path=path)
    return SnapshotGoneError(
        f"{what}: snapshot {snapshot_id} is gone from {storage.uri} (its file {path} no longer exists): the "
        "read's lease no longer holds it (released, or expired) and the snapshot was reclaimed: run the read "
        "again (a new DataFrame: load() it again)")


def _chunks(db) -> Iterator[list[bytes]]:
    """The values in chunks, from one values iterator: the keys are not needed (see the module docstring),
    and one iterator is about half the work of keys and values in lockstep. Each block is read once: the
    block cache is not filled."""
    values = iter(db.values(read_opt=scan_read_options()))
    while chunk := list(itertools.islice(values, CHUNK_ROWS)):
        yield chunk


def merge(chunks: Iterator[list[bytes]], changes: dict[bytes, bytes | None], codec: RowCodec) -> Iterator[
        pa.RecordBatch]:
    """The rows (decoded) of the snapshot's value chunks with ``changes`` applied, in key order; a table with a
    row TTL's without the rows expired now (this process's clock; common/row_ttl.py)."""
    ttl = codec.table.row_ttl
    for rows in _merged(chunks, changes, codec):
        yield rows if ttl is None else live_rows(ttl, rows, int(time.time() * 1000))


def _merged(chunks: Iterator[list[bytes]], changes: dict[bytes, bytes | None], codec: RowCodec) -> Iterator[
        pa.RecordBatch]:
    change_keys = sorted(changes)
    done = 0
    for values in chunks:
        rows = codec.decode_values(pa.array(values, pa.binary()))
        last_key = codec.encode_keys(rows.slice(rows.num_rows - 1))[0]
        upto = bisect.bisect_right(change_keys, last_key, lo=done)
        if upto == done:
            yield rows
            continue
        window = change_keys[done:upto]
        done = upto
        yield _apply(rows, codec, window, changes)
    rest = [changes[k] for k in change_keys[done:] if changes[k] is not None]
    if rest:
        yield codec.decode_values(pa.array(rest, pa.binary()))


def _apply(rows: pa.RecordBatch, codec: RowCodec, window: list[bytes],
           changes: dict[bytes, bytes | None]) -> pa.RecordBatch:
    """The chunk's rows minus the window's keys, plus the window's live rows, in key order."""
    keys = codec.encode_key_array(rows)
    untouched = pc.invert(pc.is_in(keys, value_set=pa.array(window, pa.binary())))
    live = [k for k in window if changes[k] is not None]
    fresh = codec.decode_values(pa.array([changes[k] for k in live], pa.binary()))
    all_keys = pa.concat_arrays([keys.filter(untouched), pa.array(live, pa.binary())])
    return pa.concat_batches([rows.filter(untouched), fresh]).take(pc.sort_indices(all_keys))
