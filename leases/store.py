"""Lease persistence: a ZooKeeper pointer node + one metadata file per table.

``/leases/kv_snapshot/{lease_id}`` holds ``{version, expiration_time,
tables: [{table_id, metadata_path}]}``, plus ``graced: true`` when the
deadline is a failover grace (absent: false); each metadata file
``lease/kv-snapshot/{lease_id}/{table_id}/{uuid}.metadata`` (on remote
storage) holds that table's ``{bucket -> snapshot_id}``. A file is always
written under a new name and only then pointed to; the old one is deleted
after the pointer moved, so ZooKeeper never points at a missing file. Only
the tables that changed get new files.

The store only prepares and finishes writes; the coordinator's fenced writer
sends the ZooKeeper operations (so several writes can share a round trip).
"""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

from kazoo.exceptions import NoNodeError

from common import zkpaths
from common.errors import StorageError
from common.storage import RemoteStorage, StorageNotFound
from common.zk import ZkOp, dumps, loads
from common.model import Lease, TableBucket
from leases.state import PersistLease

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
LEASE_FILES = "lease/kv-snapshot"


@dataclass(frozen=True)
class PreparedWrite:
    write: PersistLease
    op: ZkOp
    new_paths: dict[int, str]  # table -> path written for this write
    paths_after: dict[int, str]  # the lease's table -> path once the write is done
    obsolete: tuple[str, ...]  # files to delete once the pointer moved


#: A new file's name: 32 hex digits, 16 random for this process and 16 counting (a uuid4 per file
#: costs a getrandom call, and on the loop's thread every system call waits to get the GIL back).
#: Unique across processes and restarts by the random half; ``write_new`` refuses a name taken anyway.
_NAME_PREFIX = uuid.uuid4().hex[:16]
_name_counter = itertools.count()


def metadata_file(lease_id: str, table_id: int) -> str:
    return f"{LEASE_FILES}/{lease_id}/{table_id}/{_NAME_PREFIX}{next(_name_counter):016x}.metadata"


def encode_table_file(lease_id: str, table_id: int, buckets: dict[TableBucket, int]) -> bytes:
    rows = [{"partition_id": tb.partition_id, "bucket": tb.bucket, "snapshot_id": sid}
            for tb, sid in sorted(buckets.items(), key=lambda item: item[0].sort_key())]
    return json.dumps({"version": FORMAT_VERSION, "lease_id": lease_id, "table_id": table_id,
                       "buckets": rows}, separators=(",", ":")).encode()


def decode_table_file(data: bytes) -> dict[TableBucket, int]:
    """Raises ValueError for anything but a well-formed table file."""
    try:
        doc = json.loads(data)
        table_id = int(doc["table_id"])
        return {TableBucket(table_id, int(r["bucket"]), r.get("partition_id")): int(r["snapshot_id"])
                for r in doc["buckets"]}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a lease table file: {exc!r}") from None


def read_table_file(storage: RemoteStorage, path: str) -> dict[TableBucket, int] | str:
    """The file's buckets, or why it is unreadable for good (missing, or not a lease table file).

    Raises StorageError when remote storage could not be read (that may pass).
    """
    try:
        return decode_table_file(storage.read(path))
    except StorageNotFound:
        return "missing"
    except ValueError as exc:
        return str(exc)


def log_unreadable(lease_id: str, path: str, why: str) -> None:
    log.error("lease %s is not loaded: its file %s is unreadable (%s); its ZooKeeper node %s is kept for an "
              "operator (acquiring the lease again replaces it)", lease_id, path, why, zkpaths.lease(lease_id))


class LeaseStore:
    """Turns :class:`PersistLease` instructions into files + ZooKeeper ops; loads leases back."""

    def __init__(self, storage: RemoteStorage, io_threads: int = 16) -> None:
        self.storage = storage
        self._paths: dict[str, dict[int, str]] = {}  # persisted layout: lease -> table -> file
        self.undeleted: set[str] = set()  # files no lease points at whose delete failed
        #: leases not loaded (a file missing or corrupt): lease -> its unreadable files. Their nodes and
        #: files stay (in ``_paths``, so never orphans) until the lease is acquired again (replaced)
        self.unreadable: dict[str, tuple[str, ...]] = {}
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="lease-io")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- writing ---------------------------------------------------------------------

    def prepare(self, writes: list[PersistLease]) -> list[PreparedWrite | StorageError]:
        """Write the new metadata files of every write; the ZooKeeper op of each.

        A write whose files could not be written comes back as its StorageError
        (and leaves no file behind). Remote storage that gains from parallel calls
        (S3) gets each write's files from a pool thread; otherwise (local files) all
        the batch's files go in one :meth:`~common.storage.RemoteStorage.write_new_many`,
        made durable together.
        """
        if self.storage.parallel_io:
            return list(self._pool.map(self._prepare_one, writes))
        files = {write.write_id: self._new_files(write) for write in writes}
        items = [(path, data) for new in files.values() for path, data in new.values()]
        outcomes = dict(zip((path for path, _data in items), self.storage.write_new_many(items)))
        results: list[PreparedWrite | StorageError] = []
        for write in writes:
            new = files[write.write_id]
            error = next((outcomes[path] for path, _data in new.values() if outcomes[path] is not None), None)
            if error is not None:
                self._delete_quietly(path for path, _data in new.values() if outcomes[path] is None)
                results.append(error)
            else:
                results.append(self._prepared(write, {table_id: path for table_id, (path, _data) in new.items()}))
        return results

    def _new_files(self, write: PersistLease) -> dict[int, tuple[str, bytes]]:
        """The files ``write`` needs: table -> (new path, contents); none for a lease that goes."""
        if write.after is None:
            return {}
        files = {}
        for table_id in sorted(write.changed_tables):
            buckets = write.after.table_buckets(table_id)
            if buckets:
                files[table_id] = (metadata_file(write.lease_id, table_id),
                                   encode_table_file(write.lease_id, table_id, buckets))
        return files

    def _prepare_one(self, write: PersistLease) -> PreparedWrite | StorageError:
        new_paths: dict[int, str] = {}
        try:
            for table_id, (path, data) in self._new_files(write).items():
                self.storage.write_new(path, data)
                new_paths[table_id] = path
        except StorageError as exc:
            self._delete_quietly(new_paths.values())
            return exc
        return self._prepared(write, new_paths)

    def _prepared(self, write: PersistLease, new_paths: dict[int, str]) -> PreparedWrite:
        """``write`` with its new files written: its ZooKeeper op and the files it makes obsolete."""
        lease_id = write.lease_id
        current = self._paths.get(lease_id, {})
        if write.after is None:
            return PreparedWrite(write, ZkOp("delete", zkpaths.lease(lease_id)), {}, {},
                                 tuple(current.values()))
        paths_after = {t: p for t, p in current.items() if t in write.after.tables()}
        paths_after.update(new_paths)
        obsolete = tuple(p for t, p in current.items() if paths_after.get(t) != p)
        node = {
            "version": FORMAT_VERSION,
            "expiration_time": write.after.expiration_time,
            "tables": [{"table_id": t, "metadata_path": p} for t, p in sorted(paths_after.items())],
        }
        if write.after.graced:
            node["graced"] = True
        kind = "create" if write.before is None and lease_id not in self.unreadable else "set"
        return PreparedWrite(write, ZkOp(kind, zkpaths.lease(lease_id), dumps(node)), new_paths, paths_after, obsolete)

    def committed(self, prepared: PreparedWrite) -> None:
        """The pointer moved: remember the layout, delete the files it no longer names."""
        lease_id = prepared.write.lease_id
        self.unreadable.pop(lease_id, None)  # replaced (its node was set)
        if prepared.write.after is None:
            self._paths.pop(lease_id, None)
        else:
            self._paths[lease_id] = dict(prepared.paths_after)
        self._delete_quietly(prepared.obsolete)

    def failed(self, prepared: PreparedWrite) -> None:
        """The pointer did not move: the new files are garbage."""
        self._delete_quietly(prepared.new_paths.values())

    def _delete_quietly(self, paths: Iterable[str]) -> None:
        for path in paths:
            try:
                self.storage.delete(path)
                self.undeleted.discard(path)
            except StorageError as exc:  # kept for retry_deletes (and an orphan at the next reinitialization)
                log.warning("could not delete lease file %s: %s", path, exc)
                self.undeleted.add(path)

    def retry_deletes(self, paths: list[str]) -> list[str]:
        """Delete again ``paths`` (a copy of :attr:`undeleted`: remote storage was down); stops at the
        first failure (it still is). Returns the paths deleted; the caller discards them from
        :attr:`undeleted` (this runs off the event loop and touches no state of the store). No lease
        points at any of them: a file is pointed at only by the write that created it, and these are
        obsolete or never committed."""
        deleted = []
        for path in paths:
            try:
                self.storage.delete(path)
            except StorageError as exc:
                log.debug("lease file %s still cannot be deleted: %s", path, exc)
                break
            deleted.append(path)
        return deleted

    # -- loading ----------------------------------------------------------------------

    def load_all(self, zk) -> list[Lease]:
        """Every lease in ZooKeeper with its tables' files (pipelined reads).

        A lease with a missing or corrupt file is left out (see :attr:`unreadable`);
        remote storage failing raises StorageError (a lease that cannot be read now is
        never taken for a missing one).
        """
        try:
            names = zk.get_children(zkpaths.LEASES)
        except NoNodeError:  # no lease yet
            names = []
        pending = [(name, zk.get_async(zkpaths.lease(name))) for name in names]
        nodes: list[tuple[str, dict]] = []
        for name, result in pending:
            try:
                data, _stat = result.get()
            except NoNodeError as exc:  # deleted meanwhile
                log.warning("lease node %s vanished while loading: %s", name, exc)
                continue
            nodes.append((name, loads(data)))
        self._paths = {name: {int(t["table_id"]): t["metadata_path"] for t in node["tables"]} for name, node in nodes}
        files = [(name, path) for name, node in nodes for path in self._paths[name].values()]
        read = lambda item: read_table_file(self.storage, item[1])  # noqa: E731
        # local files read faster in a plain loop than through a pool; remote ones in parallel
        reads = self._pool.map(read, files) if self.storage.parallel_io else map(read, files)
        contents = dict(zip(files, reads))
        leases = []
        self.unreadable = {}
        for name, node in nodes:
            buckets: dict[TableBucket, int] = {}
            bad = []
            for path in self._paths[name].values():
                content = contents[(name, path)]
                if isinstance(content, str):
                    log_unreadable(name, path, content)
                    bad.append(path)
                else:
                    buckets.update(content)
            if bad:
                self.unreadable[name] = tuple(bad)
                continue
            leases.append(Lease(name, int(node["expiration_time"]), buckets, bool(node.get("graced", False))))
        return leases

    def adopt(self, layout: dict[str, dict[int, str]], unreadable: dict[str, tuple[str, ...]] | None = None) -> None:
        """Take the persisted layout (lease -> table -> file) loaded elsewhere (a LeaseMirror),
        and the leases it could not load (their files are in the layout)."""
        self._paths = {name: dict(tables) for name, tables in layout.items()}
        self.unreadable = dict(unreadable or {})

    def unreadable_tables(self) -> set[int]:
        """Tables an unreadable lease names: which of their snapshots it holds is unknown, so
        none of them may be reclaimed until the lease is replaced or its node deleted."""
        return {table_id for name in self.unreadable for table_id in self._paths.get(name, {})}

    def unreferenced(self, listed) -> list[str]:
        """The files of ``listed`` no lease points at (to be called with no write in flight)."""
        referenced = {p for tables in self._paths.values() for p in tables.values()}
        return [p for p in listed if p not in referenced]

    def remove_orphans(self) -> list[str]:
        """Delete lease files no ZooKeeper node points at (call after :meth:`load_all`)."""
        referenced = {p for tables in self._paths.values() for p in tables.values()}
        orphans = [p for p in self.storage.list(LEASE_FILES) if p not in referenced]
        self._delete_quietly(orphans)
        return orphans
