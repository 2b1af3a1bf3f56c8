"""Remote storage behind one small interface: ``file://`` and ``s3://``.

Paths given to the methods are relative keys (``kv/12/0/shared/a.sst``) under
the storage root (``remote.data.dir``). Every implementation pickles (cached
clients are dropped in ``__getstate__``) so Spark executors can use it.
"""

from __future__ import annotations

import abc
import ctypes
import os
import threading
import urllib.parse
from typing import Any, Callable, Sequence

from common import config as cfg
from common.errors import StorageError
from common.redaction import protect, scrub

MULTIPART_BYTES = 16 << 20  # S3: files above this go up and down in parts of this size, 4 at a time


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


def _clean(path: str) -> str:
    path = path.lstrip("/")
    if not path or any(part in ("..", ".") for part in path.split("/")):
        raise ValueError(f"bad storage path {path!r}")
    return path


class FileStorage(RemoteStorage):
    """A local directory. Writes go to a temp file, are fsync'd, then renamed."""

    def __init__(self, uri: str, fsync: bool = True) -> None:
        parsed = urllib.parse.urlparse(uri)
        self.uri = uri
        self.root = os.path.abspath(urllib.parse.unquote(parsed.netloc + parsed.path) if parsed.scheme else uri)
        self.fsync = fsync
        os.makedirs(self.root, exist_ok=True)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, _clean(path))

    def read(self, path: str) -> bytes:
        try:
            with open(self._full(path), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            raise StorageNotFound(f"{self.uri}/{path} does not exist", path=path) from None
        except OSError as exc:
            raise StorageError(f"cannot read {self.uri}/{path}: {exc}", path=path) from None

    def _write(self, path: str, data: bytes, exclusive: bool, sync: bool = True) -> None:
        """Write ``data`` to a temp file (fsync'd if ``self.fsync and sync``), then move it into place."""
        full = self._full(path)
        tmp = f"{full}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            _make_dirs(os.path.dirname(full))
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

    def list(self, prefix: str) -> list[str]:
        base = os.path.join(self.root, prefix.strip("/")) if prefix.strip("/") else self.root
        cut = len(self.root) + 1
        found = []
        for dirpath, _dirs, files in os.walk(base):
            rel_dir = dirpath[cut:].replace(os.sep, "/")
            found.extend(f"{rel_dir}/{name}" if rel_dir else name for name in files if ".tmp-" not in name)
        return sorted(found)

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._full(path))


class S3Storage(RemoteStorage):
    """``s3://bucket/prefix`` through boto3, with boto3's own retry config.

    ``write_new`` uses a conditional put (``IfNoneMatch='*'``); big files go up
    and down in parts (:data:`MULTIPART_BYTES`).
    """

    parallel_io = True

    def __init__(self, uri: str, endpoint: str = "", region: str = "us-east-1",
                 access_key: str = "", secret_key: str = "") -> None:
        parsed = urllib.parse.urlparse(uri)
        self.uri = uri
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.endpoint = endpoint
        self.region = region
        self.access_key = access_key
        self.secret_key = secret_key
        protect([access_key, secret_key])  # botocore's debug log shows the key id; an error may quote either
        self._client: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3
                    from botocore.config import Config as BotoConfig

                    kwargs: dict[str, Any] = {
                        "region_name": self.region,
                        "config": BotoConfig(retries={"max_attempts": 5, "mode": "standard"},
                                             max_pool_connections=64),
                    }
                    if self.endpoint:
                        kwargs["endpoint_url"] = self.endpoint
                    if self.access_key:
                        kwargs["aws_access_key_id"] = self.access_key
                        kwargs["aws_secret_access_key"] = self.secret_key
                    self._client = boto3.session.Session().client("s3", **kwargs)
        return self._client

    def _key(self, path: str) -> str:
        path = _clean(path)
        return f"{self.prefix}/{path}" if self.prefix else path

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    def _fail(self, action: str, path: str, exc: Exception) -> StorageError:
        return StorageError(scrub(f"cannot {action} {self.uri}/{path}: {exc}"), path=path)

    def read(self, path: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise StorageNotFound(f"{self.uri}/{path} does not exist", path=path) from None
            raise self._fail("read", path, exc) from None
        except BotoCoreError as exc:
            raise self._fail("read", path, exc) from None

    def write_new(self, path: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise StorageExists(f"{self.uri}/{path} already exists", path=path) from None
            raise self._fail("write", path, exc) from None
        except BotoCoreError as exc:
            raise self._fail("write", path, exc) from None

    def put(self, path: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("write", path, exc) from None

    def delete(self, path: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(path))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("delete", path, exc) from None

    def delete_many(self, paths: list[str]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        for start in range(0, len(paths), 1000):
            chunk = paths[start:start + 1000]
            try:
                self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._key(p)} for p in chunk], "Quiet": True})
            except (ClientError, BotoCoreError) as exc:
                raise self._fail("delete", chunk[0], exc) from None

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES,
                              max_concurrency=4)

    def upload_file(self, path: str, local_path: str) -> None:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_file(local_path, self.bucket, self._key(path), Config=self._transfer_config())
        except (S3UploadFailedError, ClientError, BotoCoreError, OSError) as exc:
            raise StorageError(f"cannot write {self.uri}/{path}: {exc}", path=path) from None

    def download_file(self, path: str, local_path: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.download_file(self.bucket, self._key(path), local_path, Config=self._transfer_config())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise StorageNotFound(f"{self.uri}/{path} does not exist", path=path) from None
            raise self._fail("read", path, exc) from None
        except (BotoCoreError, OSError) as exc:
            raise self._fail("read", path, exc) from None

    def list(self, prefix: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        clean = prefix.strip("/")
        key_prefix = "/".join(p for p in (self.prefix, clean) if p)
        if key_prefix:
            key_prefix += "/"
        found = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=key_prefix):
                found.extend(self._rel(obj["Key"]) for obj in page.get("Contents", []))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("list", prefix, exc) from None
        return sorted(found)

    def exists(self, path: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(path))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise self._fail("stat", path, exc) from None
        except BotoCoreError as exc:
            raise self._fail("stat", path, exc) from None


def open_storage(uri: str, config: cfg.Config | None = None) -> RemoteStorage:
    """The storage for ``uri``; the scheme picks the implementation."""
    config = config or cfg.Config(env={})
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("file", ""):
        return FileStorage(uri, fsync=config[cfg.REMOTE_FSYNC])
    if scheme == "s3":
        return S3Storage(uri, endpoint=config[cfg.S3_ENDPOINT], region=config[cfg.S3_REGION],
                         access_key=config[cfg.S3_ACCESS_KEY], secret_key=config[cfg.S3_SECRET_KEY])
    raise cfg.ConfigError(f"bad value for config key 'remote.data.dir': unsupported remote storage URI {uri!r} "
                          "(use file:///path or s3://bucket/prefix)", key="remote.data.dir")
