"""``file://`` remote storage: a local directory (or a shared file system mounted on every host).

Writes go to a temp file (``*.tmp-{pid}-{thread}``), are fsync'd, then moved
into place; listings leave temp files out. Files are uploaded and downloaded
by the kernel (``shutil.copyfile``: ``copy_file_range``/``sendfile``), never
read whole into memory: an SST file of gigabytes costs no more memory than a
small one.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
import urllib.parse
from typing import Callable, Iterator, Sequence

from kvlease.common.errors import StorageError
from kvlease.common.fsync import fsync_path
from kvlease.common.storage.base import RemoteStorage, StorageExists, StorageNotFound, clean_path


def _load_syncfs() -> Callable[[str], None] | None:
    """``syncfs(2)`` of the file system holding a path (Linux), or None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]

    def sync(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)
    return sync


_syncfs = _load_syncfs()


def _make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` in fewer system calls: mkdir first, the parents only if
    missing (an existing directory costs one call, a new one under an existing parent three). A
    non-directory in the way is left for the caller's next call to report."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if parent == path:
            raise
        _make_dirs(parent)
        try:
            os.mkdir(path)
        except FileExistsError:  # made meanwhile by another thread
            pass


class FileStorage(RemoteStorage):
    """A local directory. Writes go to a temp file, are fsync'd, then renamed."""

    def __init__(self, uri: str, fsync: bool = True) -> None:
        parsed = urllib.parse.urlparse(uri)
        self.uri = uri
        self.root = os.path.abspath(urllib.parse.unquote(parsed.netloc + parsed.path) if parsed.scheme else uri)
        self.fsync = fsync
        os.makedirs(self.root, exist_ok=True)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, clean_path(path))

    def read(self, path: str) -> bytes:
        try:
            with open(self._full(path), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            raise StorageNotFound(f"{self.uri}/{path} does not exist", path=path) from None
        except OSError as exc:
            raise StorageError(f"cannot read {self.uri}/{path}: {exc}", path=path) from None

    def _write(self, path: str, data: bytes | None, exclusive: bool, sync: bool = True,
               source: str | None = None) -> None:
        """Write ``data`` (or copy the local file ``source``) to a temp file (fsync'd if ``self.fsync and
        sync``), then move it into place."""
        full = self._full(path)
        tmp = f"{full}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            _make_dirs(os.path.dirname(full))
            if source is not None:
                shutil.copyfile(source, tmp)
                if self.fsync and sync:
                    fsync_path(tmp)
            else:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    if self.fsync and sync:
                        fh.flush()
                        os.fsync(fh.fileno())
            if exclusive:
                try:
                    os.link(tmp, full)  # atomic create-if-absent
                except FileExistsError:
                    raise StorageExists(f"{self.uri}/{path} already exists", path=path) from None
                finally:
                    os.unlink(tmp)
            else:
                os.replace(tmp, full)
        except StorageError:
            raise
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise self._fail("write", path, exc) from None

    def write_new(self, path: str, data: bytes) -> None:
        self._write(path, data, exclusive=True)

    def write_new_many(self, items: Sequence[tuple[str, bytes]]) -> list[StorageError | None]:
        """All of them written, then made durable together by one ``syncfs`` of the root's file
        system (with fsync on, where the platform has it): one flush for the lot instead of an
        fsync per file, which on a small file costs more than writing it (a single file: its
        own fsync). Each is created in place, not through a temp file. A failed sync fails
        every item and removes what was written."""
        if not self.fsync or _syncfs is None or len(items) < 2:  # each made durable alone (fsync on)
            return [self._create(path, data, sync=self.fsync) for path, data in items]
        outcomes = [self._create(path, data) for path, data in items]
        if any(outcome is None for outcome in outcomes):
            try:
                _syncfs(self.root)
            except OSError as exc:
                error = self._fail_sync(exc)
                for (path, _data), outcome in zip(items, outcomes):
                    if outcome is None:
                        try:
                            self.delete(path)
                        except StorageError:
                            pass  # an orphan: nothing names it
                return [outcome or error for outcome in outcomes]
        return outcomes

    def _create(self, path: str, data: bytes, sync: bool = False) -> StorageError | None:
        """Create ``path`` holding ``data`` in place (no temp file: the contract of
        :meth:`write_new_many` lets a crash leave it partly written): one new inode and one
        directory entry, where a temp file moved into place costs three directory changes.
        ``sync``: fsync it (on Linux that also makes its new name durable)."""
        full = self._full(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            for attempt in range(3):
                try:
                    fd = os.open(full, flags, 0o644)
                    break
                except FileNotFoundError:  # no parent yet, or a delete pruned it just now
                    if attempt == 2:
                        raise
                    _make_dirs(os.path.dirname(full))
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if sync:
                    os.fsync(fd)
            except OSError:
                os.unlink(full)
                raise
            finally:
                os.close(fd)
        except FileExistsError:
            return StorageExists(f"{self.uri}/{path} already exists", path=path)
        except OSError as exc:
            return self._fail("write", path, exc)
        return None

    def _fail_sync(self, exc: OSError) -> StorageError:
        return StorageError(f"cannot sync {self.uri}: {exc}")

    def _fail(self, action: str, path: str, exc: OSError) -> StorageError:
        return StorageError(f"cannot {action} {self.uri}/{path}: {exc}", path=path)

    def put(self, path: str, data: bytes) -> None:
        self._write(path, data, exclusive=False)

    def upload_file(self, path: str, local_path: str) -> None:
        """Create or replace ``path`` with a copy of the local file (made by the kernel). StorageError, also
        when the local file cannot be read."""
        self._write(path, None, exclusive=False, source=local_path)

    def download_file(self, path: str, local_path: str) -> None:
        """Copy the object to a local file (by the kernel). StorageNotFound, StorageError."""
        try:
            shutil.copyfile(self._full(path), local_path)
        except FileNotFoundError:
            if not os.path.exists(self._full(path)):
                raise StorageNotFound(f"{self.uri}/{path} does not exist", path=path) from None
            raise StorageError(f"cannot read {self.uri}/{path} into {local_path}: its directory does not exist",
                               path=path) from None
        except OSError as exc:
            raise StorageError(f"cannot read {self.uri}/{path} into {local_path}: {exc}", path=path) from None

    def delete(self, path: str) -> None:
        full = self._full(path)
        try:
            os.unlink(full)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"cannot delete {self.uri}/{path}: {exc}", path=path) from None
        # prune empty parent directories up to the root
        parent = os.path.dirname(full)
        while parent.startswith(self.root + os.sep):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)

    def _files(self, prefix: str) -> Iterator[tuple[str, str]]:
        """``(path, local path)`` of every file under ``prefix``, leaving out temp files of writes in progress."""
        base = os.path.join(self.root, prefix.strip("/")) if prefix.strip("/") else self.root
        cut = len(self.root) + 1
        for dirpath, _dirs, files in os.walk(base):
            rel_dir = dirpath[cut:].replace(os.sep, "/")
            for name in files:
                if ".tmp-" not in name:
                    yield (f"{rel_dir}/{name}" if rel_dir else name), os.path.join(dirpath, name)

    def list(self, prefix: str) -> list[str]:
        return sorted(path for path, _local in self._files(prefix))

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """One walk of the directory, a ``stat`` per file; a file deleted meanwhile is left out."""
        found = {}
        for path, local in self._files(prefix):
            try:
                found[path] = os.stat(local).st_size
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self._fail("stat", path, exc) from None
        return found

    def list_stats(self, prefix: str) -> dict[str, tuple[int, int]]:
        """One walk, a ``stat`` per file (its ``st_mtime``: a write moves the finished file into place, so
        that is when it was written); a file deleted meanwhile is left out."""
        found = {}
        for path, local in self._files(prefix):
            try:
                st = os.stat(local)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self._fail("stat", path, exc) from None
            found[path] = (st.st_size, st.st_mtime_ns // 1_000_000)
        return found

    def list_dirs(self, prefix: str) -> list[str]:
        base = os.path.join(self.root, prefix.strip("/")) if prefix.strip("/") else self.root
        try:
            with os.scandir(base) as entries:
                return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._fail("list", prefix, exc) from None

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._full(path))
