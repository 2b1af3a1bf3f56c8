"""Installing a remote snapshot as a bucket's files, crash-safely: RocksDB := the snapshot, changelog := empty.

A replica that cannot continue its log from its leader's (docs/bucket-store.md,
"Replication"; docs/architecture.md, "Losing and moving replicas") replaces its bucket's files
with the latest remote snapshot: ``{dir}/kv`` becomes the snapshot's RocksDB
checkpoint, ``{dir}/log`` an empty changelog starting at the snapshot's
``log_offset`` (one empty segment named after it), the leader-epoch cache
``{dir}/leader-epochs.json`` empty, and the idempotent writers' seed
``{dir}/writers.json`` the snapshot's (``tablet/log/writer_sequences.py``). The bucket's files are closed meanwhile
(``BucketFiles.replace``).

Two directories cannot be swapped in one step, so the install rolls forward
from a durable intent:

1. **stage**: ``{dir}/install/kv`` (the checkpoint, moved there) and
   ``{dir}/install/log`` (the empty segment), every file and directory fsynced;
2. **intent**: ``{dir}/install.json`` (``{"log_offset": N, "writers": [...]}``) written atomically;
3. **swap**: for ``kv`` then ``log``: the live one moves to ``{dir}/install.old/``,
   the staged one takes its place; the epoch cache is written empty, the writers' seed
   from the intent;
4. **done**: ``install.old`` and ``install`` are removed, then ``install.json``.

:func:`recover` runs before the bucket's files open: with ``install.json``
present it finishes steps 3-4 (each is idempotent: a staged directory already
moved is skipped), so a crash after step 2 ends in the new state; without it,
leftovers of step 1 are removed, so a crash before ends in the old state.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

from kvlease.common.fsync import fsync_path
from kvlease.tablet.log import epoch_file
from kvlease.tablet.log import writer_sequences
from kvlease.tablet.log.epochs import EpochCache
from kvlease.tablet.log.segment_files import segment_path, sync_dir, write_durably

log = logging.getLogger(__name__)

STAGED = "install"
OLD = "install.old"
INTENT = "install.json"
PARTS = ("kv", "log")


def install(dir: str, checkpoint_dir: str, log_offset: int, fsync: bool = True,
            writers: tuple[tuple[int, ...], ...] = (), synced: bool = False) -> None:
    """Replace the bucket files in ``dir`` (closed) by ``checkpoint_dir`` (moved, so on the same file
    system preferably) and an empty changelog at ``log_offset``; see the module docstring. ``synced``: every
    file of ``checkpoint_dir`` and the directory itself are durable already (a download with ``durable``
    fsynced each as it landed): step 1 then fsyncs only what it creates or moves (the directories, the empty
    segment), not the checkpoint's bytes again. OSError as raised; a crash at any point leaves what
    :func:`recover` completes or undoes."""
    if log_offset < 0:
        raise ValueError(f"log_offset must be >= 0, got {log_offset}")
    recover(dir, fsync)  # a former install's leftovers first
    staged = os.path.join(dir, STAGED)
    os.makedirs(staged)
    shutil.move(checkpoint_dir, os.path.join(staged, "kv"))
    log_dir = os.path.join(staged, "log")
    os.makedirs(log_dir)
    os.close(os.open(segment_path(log_dir, log_offset), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    if fsync:
        if synced:
            fsync_path(segment_path(log_dir, log_offset))
            for path in (log_dir, staged):
                sync_dir(path)
        else:
            sync_tree(staged)
        sync_dir(dir)
    _write_intent(dir, log_offset, writers, fsync)
    _roll_forward(dir, log_offset, writers, fsync)


def recover(dir: str, fsync: bool = True) -> bool:
    """Finish an install a crash interrupted after its intent was written, or undo one interrupted
    before (see the module docstring); True if there was one to finish."""
    if not os.path.isdir(dir):
        return False
    doc = read_intent(dir, INTENT)
    if doc is not None:
        log_offset = int(doc["log_offset"])
        log.warning("bucket %s: finishing the install of a snapshot at log offset %d a crash interrupted",
                    dir, log_offset)
        _roll_forward(dir, log_offset, tuple(tuple(w) for w in doc.get("writers", ())), fsync)
        return True
    discard_unintended(dir, (STAGED, OLD), "an install")
    return False


def _write_intent(dir: str, log_offset: int, writers: tuple[tuple[int, ...], ...], fsync: bool) -> None:
    write_durably(os.path.join(dir, INTENT),
                  json.dumps({"log_offset": log_offset, "writers": [list(w) for w in writers]}).encode(), fsync)


def _roll_forward(dir: str, log_offset: int, writers: tuple[tuple[int, ...], ...], fsync: bool) -> None:
    """Steps 3 and 4 of the module docstring; idempotent."""
    staged, old = os.path.join(dir, STAGED), os.path.join(dir, OLD)
    swap_in(dir, staged, old, PARTS, fsync)
    epoch_file.save(dir, EpochCache(), fsync)
    writer_sequences.save_seed(dir, writers, fsync)
    finish_swap(dir, staged, old, INTENT, fsync)
    log.info("bucket %s: installed a snapshot; the changelog starts empty at offset %d", dir, log_offset)


def swap_in(dir: str, staged: str, old: str, parts: tuple[str, ...], fsync: bool) -> None:
    """Each of ``parts`` staged in ``staged`` renamed into ``dir``, the live one moved to ``old`` first; a part
    no longer staged was swapped before a crash (idempotent: the roll-forward of an install and of a
    re-base, ``tablet/store/kv_rebase.py``)."""
    os.makedirs(old, exist_ok=True)
    for part in parts:
        new = os.path.join(staged, part)
        if not os.path.exists(new):
            continue  # swapped before the crash
        live = os.path.join(dir, part)
        if os.path.exists(live):
            target = os.path.join(old, part)
            if os.path.exists(target):
                shutil.rmtree(target)
            os.rename(live, target)
        os.rename(new, live)
        if fsync:
            sync_dir(dir)


def finish_swap(dir: str, staged: str, old: str, intent: str, fsync: bool) -> None:
    """The end of a roll-forward (an install's, a re-base's): what was swapped out and what is left of the staging
    removed, then the intent (``intent``, a name in ``dir``); idempotent."""
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(staged, ignore_errors=True)
    os.unlink(os.path.join(dir, intent))
    if fsync:
        sync_dir(dir)


def read_intent(dir: str, intent: str) -> dict | None:
    """The intent document ``intent`` of ``dir`` a crash left (the roll-forward it asks for); None if none."""
    try:
        with open(os.path.join(dir, intent), "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return None


def discard_unintended(dir: str, names: tuple[str, ...], what: str) -> None:
    """Remove the staging directories ``names`` of ``dir`` that ``what`` (an install, a re-base) left before it
    wrote its intent: undone, as if it never began."""
    for name in names:
        path = os.path.join(dir, name)
        if os.path.exists(path):
            log.warning("bucket %s: removing %s left by %s that did not reach its intent", dir, name, what)
            shutil.rmtree(path)


def sync_tree(root: str) -> None:
    """fsync every file and directory below ``root``."""
    for path, _dirs, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(path, name))
        sync_dir(path)
