"""A standby coordinator's warm copy of every persisted lease (ZooKeeper nodes + their files).

A standby runs a :class:`LeaseMirror` from start-up. It reads every node under
``/leases/kv_snapshot`` with a one-shot data watch, plus the metadata files the
node names, and a one-shot children watch on ``/leases/kv_snapshot``. Watch
callbacks (kazoo's callback thread) only *mark* what changed; a background
refresher thread re-reads what is marked (re-arming the watch with the read)
and the files of the tables whose path changed (files are immutable: written
under a new name, then pointed to). On winning the election the coordinator
calls :meth:`LeaseMirror.exact` (after ``bump_epoch``) and gets exactly the
persisted leases, and the layout ``LeaseStore`` keeps in ``_paths``, without
reading 10,000 nodes.

Why :meth:`exact` is exact
--------------------------
1. After ``bump_epoch`` (zxid E) no lease write can commit: every lease write
   is a multi-op that checks the epoch node's version, so all lease changes
   have zxids < E and the persisted leases are the state at E.
2. ``exact`` first stops the refresher (no read in flight), then issues
   ``sync`` and ``get_children`` (response R, zxid >= E) on the same session.
   ZooKeeper delivers a session's watch events and responses in zxid order,
   and a client sees a watch event before it sees any data newer than the
   watched read: for every node read with a watch at zxid r, a change at
   r < z < E was notified *before* R. kazoo's reader thread queues that event
   on its (FIFO, single-threaded) callback queue before completing R.
3. A barrier callback queued after R returns therefore runs after every such
   event's callback: once it ran, every loaded node that is not marked dirty
   is unchanged since its read (a node with a pending change is marked).
4. The children list of R is the exact set of lease nodes at E. Names not in
   it are dropped; names in it that are dirty or never loaded are re-read now
   (a plain read after E is the final state). So the result equals what
   ``LeaseStore.load_all`` would read at this point.
Watches do not survive a lost connection. kazoo has no ``SetWatches``: when
its connection drops (SUSPENDED, even if the session lives on) it forgets
every watch and fires each once with ``path=None``; when the session is LOST
everything is gone. So both mark every loaded node for a re-read (the files
are immutable: only the nodes are read again, and a file only if its path
moved); :meth:`exact` re-reads every node it cannot prove unchanged, i.e. all
of them if the watches were reset since they were read. The flag is set by
the state listener, which kazoo calls before it resets the watches and before
any reply on the new connection, so step 3 above still holds for what is not
marked.
"""

from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import Callback, KazooState

from kvlease.common import zkpaths
from kvlease.common.errors import StorageError
from kvlease.common.storage import RemoteStorage
from kvlease.common.zk import loads
from kvlease.common.model import Lease, TableBucket
from kvlease.leases.refcount import RefcountIndex
from kvlease.leases.store import TableFile, lease_entry, lease_from_node, log_unreadable, read_table_file

log = logging.getLogger(__name__)

CHUNK = 1_000  # nodes read per round of the refresher (it checks for stop between rounds)


@dataclass
class _Entry:
    expiration_time: int
    paths: dict[int, str]  # table -> metadata file
    tables: dict[int, dict[TableBucket, int]]  # table -> its buckets (from the file)
    mzxid: int
    graced: bool = False
    lease: Lease | None = None  # built when read, so that exact() only collects (100,000 at failover)


class LeaseMirror:
    def __init__(self, zk, storage: RemoteStorage, *, debounce_s: float = 0.25, io_threads: int = 8) -> None:
        self.zk = zk
        self.storage = storage
        self.debounce_s = debounce_s
        self._entries: dict[str, _Entry] = {}
        self._names: set[str] | None = None  # the last children list read (None: not read yet)
        self._lock = threading.Lock()  # guards the marks below (taken by the watch callbacks)
        self._dirty: set[str] = set()
        self._retry_later: set[str] = set()  # refresher only: read again next round
        self._children_dirty = True
        self._invalid = False  # the session was lost: watches are gone, reload everything
        self._reset = False  # the connection dropped: watches are gone, re-read every node (not the files)
        self._loaded = False  # every listed node read once (since start, or since the session was lost)
        self._wake = threading.Event()
        self._wake.set()  # the initial load
        self._stop = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._pool = None if not storage.parallel_io else ThreadPoolExecutor(
            max_workers=io_threads, thread_name_prefix="lease-mirror-io")
        self.stats = {"node_reads": 0, "file_reads": 0, "rounds": 0}
        #: files read this round (they are immutable): leases share a file (one per table and batch of
        #: the active's loop), and a round reads names in chunks of CHUNK in no particular order
        self._files_read: dict[str, TableFile] = {}
        #: the refcount index of the mirrored leases, kept as they are read: at election it is that of
        #: exactly the leases exact() returns, so the new active need not build it (100,000 at failover)
        self.refs = RefcountIndex()
        #: at election: leases not loaded because a file is missing or corrupt -> those files
        self.unreadable: dict[str, tuple[str, ...]] = {}
        self._unreadable_layout: dict[str, dict[int, str]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "LeaseMirror":
        self.zk.add_listener(self._on_state)
        self._thread = threading.Thread(target=self._run, name="lease-mirror", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing (idempotent); the watches still armed fire into nothing."""
        self._stopped = True
        self._halt()
        try:
            self.zk.remove_listener(self._on_state)
        except Exception:  # noqa: BLE001 - not registered
            pass
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _halt(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                raise RuntimeError("the lease mirror's refresher did not stop")

    # -- watch callbacks (kazoo's callback thread: only mark) ----------------------------------

    def _on_data(self, event) -> None:
        if self._stopped:
            return
        if event.path is None:  # kazoo dropped every watch (the connection went): see _on_state
            self._watches_reset()
            return
        name = event.path.rsplit("/", 1)[-1]
        with self._lock:
            self._dirty.add(name)
        self._wake.set()

    def _on_children(self, _event) -> None:
        if self._stopped:
            return
        with self._lock:
            self._children_dirty = True
        self._wake.set()

    def _on_state(self, state) -> None:
        if state == KazooState.LOST:
            with self._lock:
                self._invalid = True
                self._children_dirty = True
            self._wake.set()
        elif state == KazooState.SUSPENDED:
            self._watches_reset()

    def _watches_reset(self) -> None:
        with self._lock:
            self._reset = True
            self._children_dirty = True
        self._wake.set()

    # -- the refresher ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            if self._stop.wait(self.debounce_s):  # let a burst of changes gather
                return
            self._wake.clear()
            try:
                self._round()
            except Exception as exc:  # noqa: BLE001 - connection trouble: marks stay, try again
                log.warning("lease mirror refresh failed (retrying): %s", exc)
                self._wake.set()
                self._stop.wait(0.5)

    def _round(self) -> None:
        self.stats["rounds"] += 1
        with self._lock:
            invalid, self._invalid = self._invalid, False
            reset, self._reset = self._reset, False
            children, self._children_dirty = self._children_dirty, False
            if reset and not invalid:  # marked here, by the thread that sets entries: none read before
                self._dirty.update(self._entries)  # the reset escapes (a read in flight then failed)
        if invalid:
            self._clear()
            self._names = None
            self._loaded = False
        if children:
            try:
                names = set(self.zk.get_children(zkpaths.LEASES, watch=self._on_children))
            except Exception:
                with self._lock:
                    self._children_dirty = True
                raise
            self._apply_names(names)
        # the names never read, listed once per round (not once per chunk: 100,000 at start-up)
        missing = [] if self._names is None else [n for n in self._names if n not in self._entries]
        start = 0
        try:
            while not self._stop.is_set():
                with self._lock:
                    todo = list(itertools.islice(self._dirty, CHUNK))
                    self._dirty.difference_update(todo)  # cleared before the read: a later change marks again
                if not todo and start >= len(missing):
                    if not self._loaded and self._names is not None:
                        self._loaded = True
                        log.info("lease mirror loaded: %d leases (%s)", len(self._entries), self.stats)
                    return
                seen = set(todo)
                todo += [n for n in missing[start:start + CHUNK] if n not in seen and n not in self._entries]
                start += CHUNK
                try:
                    self._read(todo, strict=False)
                except Exception:
                    with self._lock:
                        self._dirty.update(todo)
                    raise
        finally:
            self._files_read = {}
            if self._retry_later:  # unreadable now (a file replaced meanwhile): the next round, not this one
                with self._lock:
                    self._dirty.update(self._retry_later)
                self._retry_later.clear()
                self._wake.set()

    def _apply_names(self, names: set[str]) -> None:
        self._names = names
        for gone in self._entries.keys() - names:
            self._drop(gone)

    # -- the entries and the refcount index of their leases (changed together, by one thread) ---------

    def _set(self, name: str, entry: _Entry) -> None:
        old = self._entries.get(name)
        self._entries[name] = entry
        before = old.lease.buckets if old is not None else {}
        after = entry.lease.buckets
        if before is after:  # the node moved, the files did not (a renew): same buckets
            return
        for tb, sid in before.items():
            if after.get(tb) != sid:
                self.refs.remove(name, tb, sid)
        for tb, sid in after.items():
            if before.get(tb) != sid:
                self.refs.add(name, tb, sid)

    def _drop(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            for tb, sid in entry.lease.buckets.items():
                self.refs.remove(name, tb, sid)

    def _clear(self) -> None:
        self._entries.clear()
        self.refs = RefcountIndex()

    def _read(self, names: list[str], *, strict: bool) -> None:
        """Read these nodes (with a watch) and the files they point at; update the entries.

        ``strict`` (at election): a remote storage failure raises, and a node whose
        file is missing or corrupt is recorded in :attr:`unreadable` (the pointer
        cannot move any more after the epoch bump: the file is gone for good).
        Otherwise such a node (it moved on meanwhile: its watch fired) is marked again.
        """
        pending = [(n, self.zk.get_async(zkpaths.lease(n), watch=self._on_data)) for n in names]
        nodes = []
        for name, result in pending:
            try:
                data, stat = result.get()
            except NoNodeError:
                self._drop(name)
                if self._names is not None:
                    self._names.discard(name)
                continue
            self.stats["node_reads"] += 1
            node = loads(data)
            paths = {int(t["table_id"]): t["metadata_path"] for t in node["tables"]}
            nodes.append((name, node, paths, stat.mzxid))
        to_read = []
        for name, _node, paths, _z in nodes:
            old = self._entries.get(name)
            for table_id, path in paths.items():
                if old is None or old.paths.get(table_id) != path:
                    to_read.append((name, table_id, path))
        contents = self._read_files(list(dict.fromkeys(path for _n, _t, path in to_read)), strict)
        fresh: dict[tuple[str, int], dict[TableBucket, int] | str] = {
            (name, table_id): lease_entry(contents[path], name) for name, table_id, path in to_read}
        retry = []
        for name, node, paths, mzxid in nodes:
            old = self._entries.get(name)
            tables = {}
            bad = []
            for table_id, path in paths.items():
                if (name, table_id) in fresh:
                    buckets = fresh[(name, table_id)]
                    if isinstance(buckets, str):
                        bad.append((path, buckets))
                        continue
                    tables[table_id] = buckets
                else:
                    tables[table_id] = old.tables[table_id]
            if bad:
                self._drop(name)
                if strict:
                    for path, why in bad:
                        log_unreadable(name, path, why)
                    self.unreadable[name] = tuple(path for path, _why in bad)
                    self._unreadable_layout[name] = dict(paths)
                else:
                    retry.append(name)
                continue
            lease = lease_from_node(name, node, _merged(tables, old))
            self._set(name, _Entry(lease.expiration_time, paths, tables, mzxid, lease.graced, lease))
        self._retry_later.update(retry)

    def _read_files(self, paths: list[str], strict: bool) -> dict[str, TableFile | str]:
        """Per path its leases' buckets, or why it cannot be read (see ``read_table_file``)."""
        def read(path: str):
            try:
                return read_table_file(self.storage, path)
            except StorageError as exc:
                if strict:
                    raise
                return str(exc)
        known = self._files_read
        todo = [path for path in paths if path not in known]
        reads = map(read, todo) if self._pool is None else self._pool.map(read, todo)
        fresh = dict(zip(todo, reads))
        self.stats["file_reads"] += len(todo)
        known.update((path, content) for path, content in fresh.items() if not isinstance(content, str))
        return {path: known[path] if path in known else fresh[path] for path in paths}

    # -- at election -------------------------------------------------------------------------

    def exact(self) -> tuple[list[Lease], dict[str, dict[int, str]]]:
        """The persisted leases and their file layout, exactly (call after ``bump_epoch``).

        Stops the refresher for good. Raises on ZooKeeper or storage errors, like
        ``LeaseStore.load_all``: a lease that cannot be read is never taken for a
        missing one. A lease whose file is missing or corrupt is left out, listed
        in :attr:`unreadable` (its files are in the layout).
        """
        self._halt()
        self.zk.sync(zkpaths.LEASES)
        names = set(self.zk.get_children(zkpaths.LEASES, watch=self._on_children))
        barrier = threading.Event()
        self.zk.handler.dispatch_callback(Callback("watch", barrier.set, ()))
        if not barrier.wait(60):
            raise RuntimeError("kazoo's callback queue did not reach the barrier")
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            invalid, self._invalid = self._invalid, False
            reset, self._reset = self._reset, False
        if invalid:
            self._clear()
        elif reset:  # watches dropped since some node was read: nothing proves it unchanged
            dirty |= self._entries.keys()
        self._apply_names(names)
        self.unreadable, self._unreadable_layout = {}, {}
        # set operations (in C), not loops over 100,000 names
        todo = sorted((names - self._entries.keys()) | (dirty & names))
        self.stats["reread_at_election"] = len(todo)
        for start in range(0, len(todo), CHUNK):
            self._read(todo[start:start + CHUNK], strict=True)
        self._files_read = {}
        missing = names - self._entries.keys() - self.unreadable.keys()
        if missing:  # vanished after the epoch bump: cannot be (fenced), so do not guess
            raise RuntimeError(f"lease nodes vanished while loading: {sorted(missing)[:5]}")
        # built as they were read: collecting them is all that is left to do here (the refresher
        # is stopped for good, so the entries are not touched again)
        leases = [entry.lease for entry in self._entries.values()]
        layout = {name: entry.paths for name, entry in self._entries.items()}
        layout.update(self._unreadable_layout)  # their files are no orphans: kept for an operator
        return leases, layout


def _merged(tables: dict[int, dict[TableBucket, int]], old: _Entry | None) -> dict[TableBucket, int]:
    """A lease's buckets from its tables' files: the old entry's if no file changed; with one
    table (the usual case) that file's own dict (never changed after it was read)."""
    if old is not None and old.tables.keys() == tables.keys() and all(
            old.tables[t] is buckets for t, buckets in tables.items()):
        return old.lease.buckets
    if len(tables) == 1:
        return next(iter(tables.values()))
    buckets: dict[TableBucket, int] = {}
    for table_buckets in tables.values():
        buckets.update(table_buckets)
    return buckets
