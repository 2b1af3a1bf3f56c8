"""The local copies a tablet server no longer holds: dropped tables' data, buckets moved off, stray copies.

:class:`LocalCopies` is a part :class:`kvlease.tablet.replicas.manager.ReplicaManager` owns: it deletes bucket and table
directories under the data dir (and forgets them in :class:`~kvlease.tablet.replicas.loss.HeldBuckets`, so their
absence is no loss) once ZooKeeper says so: a table's data goes only once its ``/tables/{id}`` node is
gone (``table_gone``), and a stray copy (``tablet/replicas/stray_copies.py``) only of a table ZooKeeper still has.
The manager calls it under its lock, with the buckets it holds. Ids are physical (``common/tables.py``): a
partition's directory and node are named by the partition's id, and the same checks hold for them.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable

from kvlease.tablet.replicas import stray_copies
from kvlease.tablet.replicas.loss import HeldBuckets

log = logging.getLogger(__name__)


class LocalCopies:
    """The directories under ``data_dir`` (``bucket_dir(table_id, bucket)`` for a bucket's) of buckets not
    held; ``held``: the bucket dirs made here; ``table_gone(table_id)``: ZooKeeper has no such table (may
    raise RetriableError; None: trust the pushes, every dropped table is gone). Not locked: the replica
    manager calls it under its lock."""

    def __init__(self, data_dir: str, bucket_dir: Callable[[int, int], str], held: HeldBuckets,
                 table_gone: Callable[[int], bool] | None) -> None:
        self.data_dir = data_dir
        self.bucket_dir = bucket_dir
        self.held = held
        self.table_gone = table_gone

    def gone(self, table_id: int) -> bool:
        return True if self.table_gone is None else self.table_gone(table_id)

    def dropped(self, table_ids: set[int], coordinator_epoch: int) -> set[int]:
        """The tables of ``table_ids`` (dropped by a push) that ZooKeeper no longer has."""
        gone = {table_id for table_id in table_ids if self.gone(table_id)}
        for table_id in sorted(table_ids - gone):
            log.warning("push of coordinator epoch %d drops table (or partition) %d, which ZooKeeper still has: its "
                        "data stays", coordinator_epoch, table_id)
        return gone

    def delete_tables(self, table_ids: set[int]) -> None:
        """Delete the local data of dropped tables (ZooKeeper no longer has them: :meth:`dropped`)."""
        for table_id in sorted(table_ids):
            shutil.rmtree(os.path.join(self.data_dir, str(table_id)), ignore_errors=True)
            self.held.forget(table_id)

    def delete_moved_off(self, keys: set[tuple[int, int]]) -> None:
        """Delete the local copy of buckets a completed move took off this server (closed already)."""
        for table_id, bucket in sorted(keys):
            shutil.rmtree(self.bucket_dir(table_id, bucket), ignore_errors=True)
            self.held.forget(table_id, bucket)
            log.info("bucket %d of table (or partition) %d moved off this tablet server: its local copy is deleted",
                     bucket, table_id)

    def remove_dropped(self, led: set[int]) -> list[int]:
        """Delete the local data of the tables ZooKeeper no longer has, but those of ``led`` (the tables of the
        buckets held); returns their ids."""
        removed: list[int] = []
        try:
            names = os.listdir(self.data_dir)
        except FileNotFoundError:
            return []
        for name in sorted(names):
            if not name.isdigit() or int(name) in led:
                continue
            if self.gone(int(name)):
                shutil.rmtree(os.path.join(self.data_dir, name), ignore_errors=True)
                self.held.forget(int(name))
                removed.append(int(name))
        if removed:
            log.info("removed the local data of dropped tables and partitions %s", removed)
        return removed

    def remove_strays(self, held: set[tuple[int, int]]) -> stray_copies.StrayChoice:
        """Delete the bucket dirs of existing tables not in ``held`` (the buckets the last push holds or
        refused): stray copies (``tablet/replicas/stray_copies.py``)."""
        choice = stray_copies.choose_strays(stray_copies.bucket_dirs(self.data_dir), held,
                                            lambda table_id: not self.gone(table_id))
        for table_id, bucket in choice.strays:
            shutil.rmtree(self.bucket_dir(table_id, bucket), ignore_errors=True)
            self.held.forget(table_id, bucket)
            log.warning("bucket %d of table (or partition) %d is no longer assigned to this tablet server (moved off "
                        "while it was down or cut off from ZooKeeper): its stray local copy is deleted", bucket,
                        table_id)
        if choice.unchecked:
            log.warning("cannot learn from ZooKeeper whether tables (or partitions) %s exist: their unassigned bucket "
                        "dirs are kept",
                        list(choice.unchecked))
        return choice
