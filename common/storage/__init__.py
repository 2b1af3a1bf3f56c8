"""Remote storage behind one small interface: ``file://`` and ``s3://``.

Paths given to the methods are relative keys (``kv/12/0/shared/a.sst``) under
the storage root (``remote.data.dir``). Every implementation pickles (cached
clients are dropped in ``__getstate__``) so Spark executors can use it.

The interface and its errors are in :mod:`kvlease.common.storage.base`, the
implementations in :mod:`kvlease.common.storage.file` and :mod:`kvlease.common.storage.s3`;
import them all from here. :func:`open_storage` picks one by the URI's scheme.
"""

from __future__ import annotations

import urllib.parse

from kvlease.common import config as cfg
from kvlease.common.errors import StorageError
from kvlease.common.storage.base import RemoteStorage, StorageExists, StorageNotFound
from kvlease.common.storage.file import FileStorage
from kvlease.common.storage.s3 import MULTIPART_BYTES, S3Storage

__all__ = ["MULTIPART_BYTES", "FileStorage", "RemoteStorage", "S3Storage", "StorageError", "StorageExists",
           "StorageNotFound", "open_storage"]


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
