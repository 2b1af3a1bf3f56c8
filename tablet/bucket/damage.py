"""Whether a bucket's local files are damaged beyond repair, and moving damaged files aside.

A bucket whose files fail to open is retried after a backoff
(``tablet/bucket/files.py``): right for a full disk or too many open files,
which pass. Some failures never pass, and reopening cannot cure them:

- RocksDB reports corruption (``Corruption:``: a bad CURRENT or MANIFEST, a
  block checksum mismatch, a missing SST file);
- the changelog is damaged beyond the repair of a torn tail (CorruptLogError);
- RocksDB and the changelog disagree (RocksDB applied records the changelog
  does not hold, or the changelog starts above what RocksDB holds: one of the
  two was lost or replaced).

:func:`damage_of` says whether a store failed that way. A follower of a
replicated bucket is then rebuilt from the bucket's remote snapshot
(``tablet/replication/rebuild.py``) after :func:`move_aside` put its files in
``{dir}/damaged/`` for inspection (replacing what an earlier damage left
there). A leader, or a bucket with one replica, is not rebuilt here: losing
its data loses writes, which is for the coordinator to decide: it reports the
replica lost (``tablet/replicas/loss.py``), and its files are moved aside only
once it is out of the ISR.
"""

from __future__ import annotations

import logging
import os
import shutil

from kvlease.common.logentry import CorruptLogError

log = logging.getLogger(__name__)

DAMAGED = "damaged"
#: The bucket's files and directories moved aside (anything else in the bucket directory stays).
PARTS = ("kv", "log", "leader-epochs.json", "writers.json")


def is_damage(exc: BaseException | None) -> bool:
    """Whether ``exc``, a bucket's open failure, is damage a reopen cannot cure (module docstring)."""
    if exc is None:
        return False
    if isinstance(exc, CorruptLogError):
        return True
    details = getattr(exc, "details", {}) or {}
    if "applied" in details and ("end_offset" in details or "start_offset" in details):
        return True  # RocksDB and the changelog disagree (tablet/bucket/files.py replay)
    text = str(exc)
    return "cannot open RocksDB" in text and "Corruption:" in text


def damage_of(store) -> BaseException | None:
    """The failure of ``store`` (a BucketStore) if it is damage (:func:`is_damage`), else None."""
    failure = store.files.failure
    return failure if is_damage(failure) else None


def move_aside(dir: str, why: str) -> str | None:
    """Move the bucket's files in ``dir`` (closed) to ``{dir}/damaged/``; returns that path (None: there
    was nothing to move). Logs what and why."""
    present = [p for p in PARTS if os.path.lexists(os.path.join(dir, p))]
    if not present:
        return None
    target = os.path.join(dir, DAMAGED)
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    for part in present:
        os.rename(os.path.join(dir, part), os.path.join(target, part))
    log.warning("bucket %s: moved its files %s aside to %s (%s); it starts empty and is rebuilt", dir,
                present, target, why)
    return target
