"""A ZooKeeper directory mirrored in memory: ``{child name: data}``, kept current by kazoo watches.

A ChildrenWatch on the directory starts a DataWatch per child; the DataWatch
updates the child's entry on every change and drops it when the node is
deleted; it keeps watching the name (an exists watch), so a node deleted and
created again between two events is not missed. ``on_change(snapshot)`` runs on kazoo's event thread after
every change, with a copy of the mirror. Reads of :attr:`snapshot` do no
ZooKeeper I/O.
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping

from kazoo.client import KazooClient
from kazoo.recipe.watchers import ChildrenWatch, DataWatch


class WatchedDirectory:
    def __init__(self, zk: KazooClient, path: str, on_change: Callable[[Mapping[str, bytes]], None] | None = None):
        self._zk = zk
        self._path = path
        self._on_change = on_change
        self._lock = threading.RLock()
        self._data: dict[str, bytes] = {}
        self._watched: set[str] = set()
        self._stopped = False
        zk.ensure_path(path)
        ChildrenWatch(zk, path, self._children)  # calls back once at once, with the current children

    @property
    def snapshot(self) -> dict[str, bytes]:
        with self._lock:
            return dict(self._data)

    def stop(self) -> None:
        """Stop updating (the watches end at their next event)."""
        with self._lock:
            self._stopped = True

    def _children(self, children: list[str]) -> bool | None:
        with self._lock:
            if self._stopped:
                return False
            new = [child for child in children if child not in self._watched]
            self._watched.update(new)
        for child in new:
            DataWatch(self._zk, f"{self._path}/{child}", self._data_watch(child))
        return None

    def _data_watch(self, child: str):
        def changed(data: bytes | None, stat) -> bool | None:
            with self._lock:
                if self._stopped:
                    return False
                if stat is None:  # deleted (or gone before the watch was set)
                    existed = self._data.pop(child, None) is not None
                else:
                    existed = True
                    self._data[child] = data or b""
                snapshot = dict(self._data)
            if existed and self._on_change is not None:
                self._on_change(snapshot)
            return None
        return changed
