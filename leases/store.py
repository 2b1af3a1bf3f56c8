"""Lease persistence: a ZooKeeper pointer node + metadata files on remote storage.

``/leases/kv_snapshot/{lease_id}`` holds ``{version, expiration_time,
tables: [{table_id, metadata_path}]}``, plus ``graced: true`` when the
deadline is a failover grace (absent: false) and ``owner`` when the lease
belongs to one reader (absent: unowned). A metadata file
``lease/kv-snapshot/{table_id}/{name}.metadata`` (on remote storage) holds,
for one table, ``{bucket -> snapshot_id}`` of each lease written by one batch
of the coordinator's loop that changed that table: a batch writes one file per
table it touches, not one per lease (each new file costs a create, an inode and
its share of a sync; on S3, a PUT). Leases therefore share files: a file is
deleted once no lease points at it any more (counted in :class:`LeaseStore`).

A file is always written under a new name and only then pointed to, so
ZooKeeper never points at a missing file. Only the tables that changed get new
files. Files of format 1 (``{version, lease_id, table_id, buckets}``: one lease
each, written by earlier versions) are read as well.

The store only prepares and finishes writes; the coordinator's fenced writer
sends the ZooKeeper operations (so several writes can share a round trip).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

from kazoo.exceptions import NoNodeError

from kvlease.common import zkpaths
from kvlease.common.errors import StorageError
from kvlease.common.storage import RemoteStorage, StorageNotFound
from kvlease.common.zk import ZkOp, dumps, loads
from kvlease.common.model import Lease, TableBucket
from kvlease.leases.events import PersistLease

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # of the ZooKeeper node
FILE_FORMAT = 2  # of a table file: several leases (format 1: one lease per file)
LEASE_FILES = "lease/kv-snapshot"


@dataclass(frozen=True)
class PreparedWrite:
    write: PersistLease
    op: ZkOp
    new_paths: dict[int, str]  # table -> path written for this write (shared with the batch's other writes)
    paths_after: dict[int, str]  # the lease's table -> path once the write is done


#: A new file's name: 32 hex digits, 16 random for this process and 16 counting (a uuid4 per file
#: costs a getrandom call, and on the loop's thread every system call waits to get the GIL back).
#: Unique across processes and restarts by the random half; ``write_new`` refuses a name taken anyway.
_NAME_PREFIX = uuid.uuid4().hex[:16]
_name_counter = itertools.count()


def metadata_file(table_id: int) -> str:
    """A new file name for table ``table_id``'s entries of one batch of lease writes."""
    return f"{LEASE_FILES}/{table_id}/{_NAME_PREFIX}{next(_name_counter):016x}.metadata"


#: A table file's contents: lease id -> that lease's buckets of the table.
TableFile = dict[str, dict[TableBucket, int]]


#: One row of a table file, as ``json.dumps(..., separators=(",", ":"))`` writes the dict
#: ``{"partition_id": …, "bucket": …, "snapshot_id": …}`` (the partition id already JSON: a number or null).
_ROW = '{"partition_id":%s,"bucket":%d,"snapshot_id":%d}'


def _rows(buckets: dict[TableBucket, int]) -> str:
    """The JSON array of a lease's rows, by :meth:`TableBucket.sort_key`. Written by hand, not by
    ``json.dumps`` of a dict a row: an acquire of a 1,000-partition table writes 4,000 rows on the
    coordinator's loop, and this takes a third of the time for the same bytes."""
    rows = sorted([(-1 if tb.partition_id is None else tb.partition_id, tb.bucket, sid, tb.partition_id)
                   for tb, sid in buckets.items()])
    return "[" + ",".join([_ROW % ("null" if p is None else p, b, sid) for _key, b, sid, p in rows]) + "]"


def encode_table_file(table_id: int, leases: dict[str, dict[TableBucket, int]]) -> bytes:
    """The file of ``table_id`` holding each lease's buckets of it (format 2): the bytes
    ``json.dumps({"version": 2, "table_id": …, "leases": {lease_id: [row, …]}}, separators=(",", ":"))``
    gives (a test compares them)."""
    entries = ",".join([json.dumps(lease_id) + ":" + _rows(buckets) for lease_id, buckets in leases.items()])
    return ('{"version":%d,"table_id":%d,"leases":{%s}}' % (FILE_FORMAT, table_id, entries)).encode()


def decode_table_file(data: bytes) -> TableFile:
    """Raises ValueError for anything but a well-formed table file (format 1 or 2)."""
    try:
        doc = json.loads(data)
        table_id = int(doc["table_id"])
        if doc.get("version") == 1:
            entries = {str(doc["lease_id"]): doc["buckets"]}
        else:
            entries = doc["leases"]
        return {str(lease_id): {TableBucket(table_id, int(r["bucket"]), r.get("partition_id")): int(r["snapshot_id"])
                                for r in rows}
                for lease_id, rows in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a lease table file: {exc!r}") from None


def read_table_file(storage: RemoteStorage, path: str) -> TableFile | str:
    """The file's leases and their buckets, or why it is unreadable for good (missing, or not a lease
    table file).

    Raises StorageError when remote storage could not be read (that may pass).
    """
    try:
        return decode_table_file(storage.read(path))
    except StorageNotFound:
        return "missing"
    except ValueError as exc:
        return str(exc)


def lease_entry(content: TableFile | str, lease_id: str) -> dict[TableBucket, int] | str:
    """``lease_id``'s buckets in a file read by :func:`read_table_file`, or why there are none."""
    if isinstance(content, str):
        return content
    buckets = content.get(lease_id)
    return f"the file has no entry for lease {lease_id}" if buckets is None else buckets


def lease_from_node(name: str, node: dict, buckets: dict[TableBucket, int]) -> Lease:
    """The lease ``name`` its ZooKeeper node and its tables' ``buckets`` describe."""
    owner = node.get("owner")
    return Lease(name, int(node["expiration_time"]), buckets, bool(node.get("graced", False)),
                 None if owner is None else str(owner))


def log_unreadable(lease_id: str, path: str, why: str) -> None:
    log.error("lease %s is not loaded: its file %s is unreadable (%s); its ZooKeeper node %s is kept for an "
              "operator (acquiring the lease again replaces it)", lease_id, path, why, zkpaths.lease(lease_id))


class LeaseStore:
    """Turns :class:`PersistLease` instructions into files + ZooKeeper ops; loads leases back."""

    def __init__(self, storage: RemoteStorage, io_threads: int = 16) -> None:
        self.storage = storage
        self._paths: dict[str, dict[int, str]] = {}  # persisted layout: lease -> table -> file
        #: how many (lease, table) entries of :attr:`_paths` point at each file; a file is deleted at 0
        self._refs: collections.Counter[str] = collections.Counter()
        #: files written by the batch under way: deleted by :meth:`settle` if no lease took them
        self._fresh: set[str] = set()
        self.undeleted: set[str] = set()  # files no lease points at whose delete failed
        #: leases not loaded (a file missing or corrupt): lease -> its unreadable files. Their nodes and
        #: files stay (in ``_paths``, so never orphans) until the lease is acquired again (replaced)
        self.unreadable: dict[str, tuple[str, ...]] = {}
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="lease-io")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- writing ---------------------------------------------------------------------

    def prepare(self, writes: list[PersistLease]) -> list[PreparedWrite | StorageError]:
        """Write the new metadata files of a batch of writes (distinct leases); the ZooKeeper op of each.

        The batch writes one file per table it changes, holding the entries of
        every write that changes that table. A write whose files could not all
        be written comes back as the StorageError of one. Then report each
        committed write (:meth:`committed`; a failed one needs nothing) and call
        :meth:`settle`, which deletes the batch's files no lease took. Files go
        in one :meth:`~kvlease.common.storage.RemoteStorage.write_new_many` (local
        files: made durable together), or from pool threads where remote
        storage gains from parallel calls (S3).
        """
        entries: dict[int, dict[str, dict[TableBucket, int]]] = {}
        for write in writes:
            if write.after is not None:
                for table_id in sorted(write.changed_tables):
                    buckets = write.after.table_buckets(table_id)
                    if buckets:
                        entries.setdefault(table_id, {})[write.lease_id] = buckets
        files = {table_id: (metadata_file(table_id), encode_table_file(table_id, leases))
                 for table_id, leases in entries.items()}
        items = list(files.values())
        if self.storage.parallel_io and len(items) > 1:
            outcomes = list(self._pool.map(self._write_new, items))
        else:
            outcomes = self.storage.write_new_many(items)
        errors = {table_id: outcome for table_id, outcome in zip(files, outcomes)}
        self._fresh.update(path for (path, _data), outcome in zip(items, outcomes) if outcome is None)
        results: list[PreparedWrite | StorageError] = []
        for write in writes:
            tables = [table_id for table_id in sorted(write.changed_tables) if write.lease_id in entries.get(table_id, {})]
            error = next((errors[t] for t in tables if errors[t] is not None), None)
            if error is not None:
                results.append(error)
            else:
                results.append(self._prepared(write, {t: files[t][0] for t in tables}))
        return results

    def _write_new(self, item: tuple[str, bytes]) -> StorageError | None:
        try:
            self.storage.write_new(*item)
        except StorageError as exc:
            return exc
        return None

    def _prepared(self, write: PersistLease, new_paths: dict[int, str]) -> PreparedWrite:
        """``write`` with its new files written: its ZooKeeper op."""
        lease_id = write.lease_id
        current = self._paths.get(lease_id, {})
        if write.after is None:
            return PreparedWrite(write, ZkOp("delete", zkpaths.lease(lease_id)), {}, {})
        paths_after = {t: p for t, p in current.items() if t in write.after.tables()}
        paths_after.update(new_paths)
        node = {
            "version": FORMAT_VERSION,
            "expiration_time": write.after.expiration_time,
            "tables": [{"table_id": t, "metadata_path": p} for t, p in sorted(paths_after.items())],
        }
        if write.after.graced:
            node["graced"] = True
        if write.after.owner is not None:
            node["owner"] = write.after.owner
        kind = "create" if write.before is None and lease_id not in self.unreadable else "set"
        return PreparedWrite(write, ZkOp(kind, zkpaths.lease(lease_id), dumps(node)), new_paths, paths_after)

    def committed(self, prepared: PreparedWrite) -> None:
        """The pointer moved: remember the layout, delete the files no lease points at any more."""
        lease_id = prepared.write.lease_id
        self.unreadable.pop(lease_id, None)  # replaced (its node was set)
        before = self._paths.pop(lease_id, {})
        if prepared.write.after is not None:
            self._paths[lease_id] = dict(prepared.paths_after)
            self._refs.update(prepared.paths_after.values())
        self._unref(before.values())

    def settle(self, *, keep_fresh: bool = False) -> None:
        """The batch's outcomes are all in: delete its files no lease took. ``keep_fresh``: keep them
        (a ZooKeeper outcome is unknown: a node may point at them; the next reinitialization
        removes those that are orphans)."""
        fresh, self._fresh = self._fresh, set()
        if not keep_fresh:
            self._delete_quietly(sorted(p for p in fresh if not self._refs.get(p)))

    def _unref(self, paths: Iterable[str]) -> None:
        gone = []
        for path in paths:
            self._refs[path] -= 1
            if self._refs[path] <= 0:
                del self._refs[path]
                gone.append(path)
        self._delete_quietly(gone)

    def _set_layout(self, layout: dict[str, dict[int, str]]) -> None:
        self._paths = layout
        self._refs = collections.Counter(p for tables in layout.values() for p in tables.values())

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
        points at any of them, nor will: a file is only pointed at by writes of the batch that created
        it, and these files lost their last lease or were taken by none."""
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
        self._set_layout({name: {int(t["table_id"]): t["metadata_path"] for t in node["tables"]}
                          for name, node in nodes})
        files = list(self._refs)  # each once: leases share them
        read = lambda path: read_table_file(self.storage, path)  # noqa: E731
        # local files read faster in a plain loop than through a pool; remote ones in parallel
        reads = self._pool.map(read, files) if self.storage.parallel_io else map(read, files)
        contents = dict(zip(files, reads))
        leases = []
        self.unreadable = {}
        for name, node in nodes:
            buckets: dict[TableBucket, int] = {}
            bad = []
            for path in self._paths[name].values():
                content = lease_entry(contents[path], name)
                if isinstance(content, str):
                    log_unreadable(name, path, content)
                    bad.append(path)
                else:
                    buckets.update(content)
            if bad:
                self.unreadable[name] = tuple(bad)
                continue
            leases.append(lease_from_node(name, node, buckets))
        return leases

    def adopt(self, layout: dict[str, dict[int, str]], unreadable: dict[str, tuple[str, ...]] | None = None) -> None:
        """Take the persisted layout (lease -> table -> file) loaded elsewhere (a LeaseMirror),
        and the leases it could not load (their files are in the layout)."""
        self._set_layout({name: dict(tables) for name, tables in layout.items()})
        self.unreadable = dict(unreadable or {})

    def unreadable_tables(self) -> set[int]:
        """Tables an unreadable lease names: which of their snapshots it holds is unknown, so
        none of them may be reclaimed until the lease is replaced or its node deleted."""
        return {table_id for name in self.unreadable for table_id in self._paths.get(name, {})}

    def unreferenced(self, listed) -> list[str]:
        """The files of ``listed`` no lease points at (to be called with no write in flight)."""
        return [p for p in listed if not self._refs.get(p)]

    def remove_orphans(self) -> list[str]:
        """Delete lease files no ZooKeeper node points at (call after :meth:`load_all`)."""
        orphans = [p for p in self.storage.list(LEASE_FILES) if not self._refs.get(p)]
        self._delete_quietly(orphans)
        return orphans
