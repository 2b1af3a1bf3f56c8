"""Deleting remote files off the event loop: snapshot files, orphan lease files, dropped tables.

A delete that fails is logged and left: whatever is left over is found again
(snapshot files at the next change or failover, lease files as orphans at
the next failover, a dropped table's files by listing ``kv/{table_id}/``), and
any snapshot file no stored snapshot names by the orphan reclaim
(``coordinator/orphan_files.py``) once it is older than ``kv.snapshot.orphan-grace``.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from kvlease.common import errors
from kvlease.common.storage import RemoteStorage

log = logging.getLogger(__name__)


class FileCollector:
    def __init__(self, storage: RemoteStorage, workers: int = 4) -> None:
        self.storage = storage
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="file-gc")

    def delete(self, paths: list[str]) -> None:
        if paths:
            self._pool.submit(_delete_quietly, self.storage, paths)

    def delete_table(self, table_id: int, files: list[str], partition_id: int | None = None) -> None:
        """``files`` (what the table's snapshot handles named) and anything else under ``kv/{table_id}/``
        (a partition's: ``kv/{table_id}/p{partition_id}/``)."""
        where = f"kv/{table_id}" if partition_id is None else f"kv/{table_id}/p{partition_id}"
        self._pool.submit(_delete_table_files, self.storage, where, files)

    def close(self) -> None:
        """Wait for the deletes under way."""
        self._pool.shutdown(wait=True)


def _delete_quietly(storage: RemoteStorage, paths: list[str]) -> None:
    try:
        storage.delete_many(paths)
    except errors.StorageError as exc:
        log.warning("could not delete %d files: %s", len(paths), exc)


def _delete_table_files(storage: RemoteStorage, where: str, files: list[str]) -> None:
    try:
        leftovers = storage.list(where)
    except errors.StorageError as exc:
        log.warning("could not list files of dropped %s: %s", where, exc)
        leftovers = []
    _delete_quietly(storage, sorted(set(files) | set(leftovers)))
