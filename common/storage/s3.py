"""``s3://bucket/prefix`` remote storage through boto3 (any S3 endpoint: AWS, MinIO, a local test server)."""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

from kvlease.common.errors import StorageError
from kvlease.common.redaction import protect, scrub
from kvlease.common.storage.base import RemoteStorage, StorageExists, StorageNotFound, clean_path

MULTIPART_BYTES = 16 << 20  # files above this go up and down in parts of this size, 4 at a time

_loader_lock = threading.Lock()
#: botocore's data loader (it reads and caches the S3 service model), shared by every client this process
#: makes: a client of a session of its own read the model again, ~70 ms per storage opened (a Spark task
#: opens one), ~10 ms with it shared. Each client still has a session of its own (its credentials).
_loader: Any = None


def _new_client(**kwargs: Any) -> Any:
    """A boto3 S3 client of a new session that shares this process's data loader."""
    global _loader
    import boto3
    import botocore.session

    with _loader_lock:  # a session is not thread-safe; the loader's cache fills once
        core = botocore.session.get_session()
        if _loader is None:
            _loader = core.get_component("data_loader")
        else:
            core.register_component("data_loader", _loader)
        return boto3.session.Session(botocore_session=core).client("s3", **kwargs)


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
                    self._client = _new_client(**kwargs)
        return self._client

    def _key(self, path: str) -> str:
        path = clean_path(path)
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
        return sorted(self._objects(prefix))

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """One ``ListObjectsV2`` listing (a page per 1,000 objects)."""
        return self._objects(prefix)

    def list_stats(self, prefix: str) -> dict[str, tuple[int, int]]:
        """One ``ListObjectsV2`` listing; an object's time is its ``LastModified`` (a multipart upload's is
        when it began, so an object never looks younger than it is)."""
        return {path: (obj["Size"], int(obj["LastModified"].timestamp() * 1000))
                for path, obj in self._listing(prefix).items()}

    def list_dirs(self, prefix: str) -> list[str]:
        """One ``ListObjectsV2`` listing with ``Delimiter='/'``: a page per 1,000 directories, none per object."""
        from botocore.exceptions import BotoCoreError, ClientError

        key_prefix = self._key_prefix(prefix)
        names = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=key_prefix,
                                                                              Delimiter="/"):
                names += [common["Prefix"][len(key_prefix):].rstrip("/") for common in page.get("CommonPrefixes", [])]
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("list", prefix, exc) from None
        return sorted(names)

    def _key_prefix(self, prefix: str) -> str:
        key_prefix = "/".join(p for p in (self.prefix, prefix.strip("/")) if p)
        return key_prefix + "/" if key_prefix else key_prefix

    def _objects(self, prefix: str) -> dict[str, int]:
        return {path: obj["Size"] for path, obj in self._listing(prefix).items()}

    def _listing(self, prefix: str) -> dict[str, dict]:
        from botocore.exceptions import BotoCoreError, ClientError

        found = {}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=self._key_prefix(prefix)):
                found.update((self._rel(obj["Key"]), obj) for obj in page.get("Contents", []))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("list", prefix, exc) from None
        return found

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
