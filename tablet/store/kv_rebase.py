"""Re-basing a bucket's RocksDB on a remote snapshot, crash-safely: RocksDB := the snapshot, the changelog kept.

A follower re-bases a bucket it follows on the bucket's latest remote snapshot
(``tablet/replication/rebase.py``, docs/snapshots.md "Incremental after a
failover") so that its SST files become the snapshot's own: should it lead
next, its first snapshot uploads only what changed since. Unlike an install
(``tablet/store/snapshot_install.py``) nothing but ``{dir}/kv`` changes: the
changelog, the leader-epoch cache and the idempotent writers stay. The next
open of the files replays the changelog from the snapshot's ``log_offset``
(the checkpoint's applied offset) up to the high watermark
(``tablet/bucket/files.py`` ``replay``), so RocksDB ends with the same rows it
had: the snapshot holds exactly the committed records below ``log_offset``,
the same records as this replica's log below it.

The swap rolls forward from a durable intent:

1. **stage**: ``{dir}/rebase/kv`` (the checkpoint, moved there), every file and
   directory fsynced;
2. **intent**: ``{dir}/rebase.json`` (``{"log_offset": N}``) written atomically;
3. **swap**: the live ``kv`` moves to ``{dir}/rebase.old/kv``, the staged one
   takes its place;
4. **done**: ``rebase.old`` and ``rebase`` are removed, then ``rebase.json``.

:func:`recover` runs before the bucket's files open (``BucketFiles._open``):
with ``rebase.json`` present it finishes steps 3-4 (idempotent), so a crash
after step 2 ends with the snapshot's RocksDB (the open then replays the
changelog into it); without it, leftovers of step 1 are removed, so a crash
before ends with the old RocksDB. Either is a RocksDB whose rows are the
changelog's up to its applied offset: no state in between is ever opened.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

from kvlease.tablet.log.segment_files import SEGMENT_NAME, sync_dir, write_durably
from kvlease.tablet.store.snapshot_install import discard_unintended, finish_swap, read_intent, swap_in, sync_tree

log = logging.getLogger(__name__)

STAGED = "rebase"
OLD = "rebase.old"
INTENT = "rebase.json"


def rebase(dir: str, checkpoint_dir: str, log_offset: int, fsync: bool = True) -> None:
    """Replace ``{dir}/kv`` (closed) by ``checkpoint_dir`` (moved: the same file system) whose applied
    offset is ``log_offset``; see the module docstring. OSError as raised; a crash at any point leaves
    what :func:`recover` completes or undoes."""
    if log_offset < 0:
        raise ValueError(f"log_offset must be >= 0, got {log_offset}")
    recover(dir, fsync)  # a former re-base's leftovers first
    staged = os.path.join(dir, STAGED)
    os.makedirs(staged)
    shutil.move(checkpoint_dir, os.path.join(staged, "kv"))
    if fsync:
        sync_tree(staged)
        sync_dir(dir)
    write_durably(os.path.join(dir, INTENT), json.dumps({"log_offset": log_offset}).encode(), fsync)
    _roll_forward(dir, log_offset, fsync)


def log_start(dir: str) -> int | None:
    """The first offset of the changelog in ``{dir}/log`` (closed), from its segments' names; None if it has none.
    Read while the files are closed: nothing (changelog retention included) can move it meanwhile."""
    try:
        names = os.listdir(os.path.join(dir, "log"))
    except FileNotFoundError:
        return None
    bases = [int(m.group(1)) for name in names if (m := SEGMENT_NAME.match(name))]
    return min(bases, default=None)


def recover(dir: str, fsync: bool = True) -> bool:
    """Finish a re-base a crash interrupted after its intent was written, or undo one interrupted before;
    True if there was one to finish."""
    if not os.path.isdir(dir):
        return False
    doc = read_intent(dir, INTENT)
    if doc is not None:
        log_offset = int(doc["log_offset"])
        log.warning("bucket %s: finishing the re-base on a snapshot at log offset %d a crash interrupted",
                    dir, log_offset)
        _roll_forward(dir, log_offset, fsync)
        return True
    discard_unintended(dir, (STAGED, OLD), "a re-base")
    return False


def _roll_forward(dir: str, log_offset: int, fsync: bool) -> None:
    """Steps 3 and 4 of the module docstring; idempotent."""
    staged, old = os.path.join(dir, STAGED), os.path.join(dir, OLD)
    swap_in(dir, staged, old, ("kv",), fsync)
    finish_swap(dir, staged, old, INTENT, fsync)
    log.info("bucket %s: RocksDB re-based on a snapshot at log offset %d; the changelog is replayed into it",
             dir, log_offset)
