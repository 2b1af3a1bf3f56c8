"""The remote storage interface: the operations kvlease needs, and the errors they raise.

Paths given to the methods are relative keys (``kv/12/0/shared/a.sst``) under
the storage root (``remote.data.dir``). Implementations: ``common/storage/file.py``
(``file://``), ``common/storage/s3.py`` (``s3://``).
"""

from __future__ import annotations

import abc
from typing import Sequence

from kvlease.common.errors import StorageError


class StorageNotFound(StorageError):
    """The object does not exist."""


class StorageExists(StorageError):
    """``write_new`` found an object already at the path."""


class RemoteStorage(abc.ABC):
    """The handful of operations kvlease needs from remote storage."""

    uri: str
    #: Whether many small calls gain from running in parallel (network round trips) rather than
    #: in a plain loop (local files, where a thread pool only adds overhead).
    parallel_io: bool = False

    @abc.abstractmethod
    def read(self, path: str) -> bytes:
        """The object's bytes. Raises StorageNotFound, StorageError."""

    @abc.abstractmethod
    def write_new(self, path: str, data: bytes) -> None:
        """Create the object; it must not exist. Raises StorageExists, StorageError."""

    @abc.abstractmethod
    def put(self, path: str, data: bytes) -> None:
        """Create or replace the object. Raises StorageError."""

    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Remove the object; a missing object is not an error. Raises StorageError."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """All object paths under ``prefix`` (recursive, sorted). Raises StorageError."""

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """``{path: size in bytes}`` of every object under ``prefix`` (recursive), from one listing
        (the implementations override this default, which reads every object). Raises StorageError."""
        return {path: len(self.read(path)) for path in self.list(prefix)}

    def list_stats(self, prefix: str) -> dict[str, tuple[int, int]]:
        """``{path: (size in bytes, last modified in ms since the epoch)}`` of every object under ``prefix``
        (recursive), from one listing: what the coordinator's orphan reclaim ages files by
        (``coordinator/orphan_files.py``). Raises StorageError, also where the storage cannot say (this
        default): an age is never guessed."""
        raise StorageError(f"{self.uri} cannot list modification times")

    def list_dirs(self, prefix: str) -> list[str]:
        """The names of the directories right under ``prefix`` (sorted; an object's path segments count as
        directories). This default lists everything under ``prefix``; the implementations override it with
        one shallow listing. Raises StorageError."""
        base = prefix.strip("/") + "/"
        return sorted({path[len(base):].split("/", 1)[0] for path in self.list(prefix)
                       if path.startswith(base) and "/" in path[len(base):]})

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether the object exists. Raises StorageError."""

    def write_new_many(self, items: Sequence[tuple[str, bytes]]) -> list[StorageError | None]:
        """Create each ``(path, data)`` (none may exist): per item None, or the StorageError
        (StorageExists, ...) it failed with. Those that succeeded are durable when this returns;
        a crash before then may leave any of them behind, also partly written, under its own
        name: for objects nobody reads before the caller names them elsewhere (a lease file
        before its ZooKeeper node points at it)."""
        outcomes: list[StorageError | None] = []
        for path, data in items:
            try:
                self.write_new(path, data)
                outcomes.append(None)
            except StorageError as exc:
                outcomes.append(exc)
        return outcomes

    def delete_many(self, paths: list[str]) -> None:
        for path in paths:
            self.delete(path)

    def upload_file(self, path: str, local_path: str) -> None:
        """Create or replace ``path`` with the contents of a local file. Raises StorageError."""
        with open(local_path, "rb") as fh:
            self.put(path, fh.read())

    def download_file(self, path: str, local_path: str) -> None:
        """Write the object to a local file. Raises StorageNotFound, StorageError."""
        data = self.read(path)
        with open(local_path, "wb") as fh:
            fh.write(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def clean_path(path: str) -> str:
    """``path`` without leading slashes; ValueError for an empty path or a ``.``/``..`` segment."""
    path = path.lstrip("/")
    if not path or any(part in ("..", ".") for part in path.split("/")):
        raise ValueError(f"bad storage path {path!r}")
    return path
