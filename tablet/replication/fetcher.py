"""The follower's side of replication: one fetch thread per leader this server follows buckets on.

Each thread sends one ``ReplicaFetch`` long poll for every bucket it follows on
its leader (``tablet/replication/fetch_service.py`` answers), then for each
bucket, under the replica's fetch lock: truncates on a divergence answer,
appends the entries byte for byte, applies its store up to the leader's HW.
Applying to RocksDB is the applier thread's (:class:`Applier`): the next
fetch, which tells the leader this replica's new log end and so moves the
HW, does not wait for it. A bucket's error (the leader moved, a fenced epoch) waits for the
coordinator's next push, which changes the bucket's role; the thread ends
once no bucket follows its leader. :meth:`Fetchers.update` is called after
every change of roles; :meth:`Fetchers.stop` closes the channels, which ends
the long polls in flight (a stopping server does not wait for them).
"""

from __future__ import annotations

import logging
import threading

import grpc

from kvlease.client.transport import Channels, rpc_error
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.common.wire import error_from_pb, raise_for
from kvlease.tablet.bucket import damage as bucket_damage
from kvlease.tablet.replication.fetch_service import answer_of
from kvlease.tablet.replication.rebase import Rebaser
from kvlease.tablet.replication.rebuild import DAMAGED, DIVERGED, FRESH, Rebuilder
from kvlease.tablet.replication.worker import ReplicaWorker

log = logging.getLogger(__name__)

ERROR_BACKOFF_S = 0.2


class Fetchers:
    def __init__(self, server_id: int, following, channels: Channels, *, wait_ms: int, max_bytes: int,
                 storage=None, admin=None, io_threads: int = 8, rebuild_bytes_per_s: int = 0,
                 rebase_interval_ms: int = 0) -> None:
        """``following()``: the replicas this server follows now (``Replica`` objects of the replica manager);
        ``storage`` and ``admin`` (the remote storage, an ``AdminClient``): where a follower whose log cannot
        continue from its leader's is rebuilt from (``tablet/replication/rebuild.py``; None: it is not), and
        what a follower re-bases its RocksDB on every ``rebase_interval_ms`` (``tablet/replication/rebase.py``;
        0: never)."""
        self.server_id = server_id
        self.following = following
        self.channels = channels
        self.wait_ms = wait_ms
        self.max_bytes = max_bytes
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.applier = Applier(self._stop)
        self.rebuilder = (Rebuilder(storage, admin, self._stop, server_id=server_id,
                                    max_bytes_per_s=rebuild_bytes_per_s, io_threads=io_threads,
                                    channels=channels, tail_fetch_bytes=max_bytes)
                          if storage is not None and admin is not None else None)
        self.rebaser = (Rebaser(storage, following, self._stop, interval_ms=rebase_interval_ms,
                                max_bytes_per_s=rebuild_bytes_per_s, io_threads=io_threads,
                                rebuilding=lambda r: self.rebuilder is not None and self.rebuilder.busy(r))
                        if storage is not None and rebase_interval_ms > 0 else None)
        self._wake = threading.Event()  # a rebuild ended: a fetch thread with nothing to fetch goes on at once
        if self.rebuilder is not None:
            self.rebuilder.on_done = self._wake.set
            self.rebuilder.on_tail = self.applier.due

    def update(self) -> None:
        """Start a fetch thread for every leader followed that has none."""
        if self._stop.is_set():
            return
        if self.rebaser is not None:
            self.rebaser.start()
        with self._lock:
            addresses = {r.role.leader_address for r in self.following() if r.role.leader_address}
            for address in sorted(addresses):
                thread = self._threads.get(address)
                if thread is None or not thread.is_alive():
                    thread = threading.Thread(target=self._run, args=(address,), daemon=True,
                                              name=f"replica-fetch-{address}")
                    self._threads[address] = thread
                    thread.start()

    def stop(self) -> None:
        """Stop fetching: the long polls in flight are cancelled (by closing the channels), the threads end."""
        self._stop.set()
        self._wake.set()
        self.channels.close()
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout=self.wait_ms / 1000.0 + 5)
        self.channels.close()  # one a thread opened between the stop and its last round
        self.applier.stop()
        if self.rebuilder is not None:
            self.rebuilder.stop()
        if self.rebaser is not None:
            self.rebaser.join()

    def resume(self) -> None:
        """Fetch again after :meth:`stop` (a follower that was stuck and goes on): the applier and the
        rebuilder start their threads again on their next work."""
        self._stop.clear()
        self.update()

    def _buckets(self, address: str) -> list:
        return [r for r in self.following() if r.role.leader_address == address]

    def _run(self, address: str) -> None:
        while not self._stop.is_set():
            replicas = self._buckets(address)
            if not replicas:
                with self._lock:
                    if not self._buckets(address):  # a push may have added one meanwhile
                        self._threads.pop(address, None)
                        return
                continue
            try:
                self._round(address, replicas)
            except errors.KvLeaseError as exc:
                log.debug("fetch from leader %s failed: %s", address, exc)
                self._stop.wait(ERROR_BACKOFF_S)
            except Exception:  # keep following
                log.exception("fetch from leader %s failed", address)
                self._stop.wait(ERROR_BACKOFF_S)

    def _round(self, address: str, replicas: list) -> None:
        items, asked = [], []
        for replica in replicas:
            if self.rebaser is not None and self.rebaser.busy(replica):
                continue  # its RocksDB is swapped now: fetched again once re-based
            if self.rebuilder is not None:
                if self.rebuilder.busy(replica):
                    continue  # fetched again once rebuilt
                if replica.fresh:
                    log.info("%s has no local data: rebuilding it from its latest remote snapshot", replica.tb)
                    self.rebuilder.due(replica, 0, FRESH)
                    continue
            try:
                with replica.fetch_lock:
                    store = replica.store
                    # failed files (a full disk) cannot append: no fetch, which would count as caught up and
                    # put it back in the ISR (tablet/replicas/step_down.py); the keeper reopens them after their backoff
                    store.files.check_writable()
                    items.append(pb.ReplicaFetchBucketPb(
                        table_id=replica.table.table_id, bucket=replica.bucket,
                        partition_id=replica.table.partition_id, fetch_offset=store.log_end_offset,
                        leader_epoch=replica.role.leader_epoch, last_fetched_epoch=store.last_epoch,
                        max_bytes=self.max_bytes))
                    asked.append((replica, replica.role, items[-1].fetch_offset))
            except errors.KvLeaseError as exc:  # its files cannot open or write now: the others go on
                damage = bucket_damage.damage_of(replica.store)
                if damage is not None and self.rebuilder is not None and not replica.leads:
                    log.error("%s: its local files are damaged (%s): rebuilding it from a remote snapshot",
                              replica.tb, damage)
                    self.rebuilder.due(replica, 0, DAMAGED)
                else:
                    log.debug("cannot fetch %s: %s", replica.tb, exc)
        if not items:  # every bucket is being rebuilt: fetch again when one is done
            self._wake.wait(ERROR_BACKOFF_S)
            self._wake.clear()
            return
        timeout_s = self.wait_ms / 1000.0 + 10
        request = pb.ReplicaFetchRequest(replica_id=self.server_id, max_wait_ms=self.wait_ms, buckets=items)
        try:
            response = self.channels.stub(address, pb_grpc.TabletServiceStub).ReplicaFetch(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            if self._stop.is_set():  # cancelled by stop()
                return
            raise rpc_error(exc, "ReplicaFetch", address, timeout_s=timeout_s, idempotent=True) from None
        raise_for(response.error)
        failed = False
        for (replica, role, fetch_offset), result in zip(asked, response.buckets):
            failed |= not self._take(replica, role, result, fetch_offset)
        if failed:
            self._stop.wait(ERROR_BACKOFF_S)

    def _take(self, replica, role, result, fetch_offset: int) -> bool:
        """Apply one bucket's answer; False if it was an error (the caller backs off)."""
        error = error_from_pb(result.error)
        if error is not None:
            log.debug("fetch of %s: %s", replica.tb, error)
            if fetch_offset < result.log_start_offset and self.rebuilder is not None:
                log.warning("%s asks its leader for offset %d, below the start of the leader's log (%d): "
                            "rebuilding it from a remote snapshot", replica.tb, fetch_offset, result.log_start_offset)
                replica.leader_end = max(replica.leader_end, result.log_start_offset)  # at least that far behind
                self.rebuilder.due(replica, result.log_start_offset)
                return True
            return False
        with replica.fetch_lock:
            if replica.role is not role or replica.closed:  # the role changed while the fetch was out
                return True
            store = replica.store
            if result.log_end_offset:
                replica.leader_end = result.log_end_offset
            if self.rebaser is not None and result.latest_snapshot_id:
                self.rebaser.note(replica, result.latest_snapshot_id)
            if result.HasField("diverging_epoch"):
                step = store.truncation_for(answer_of(result))
                if step.offset < store.applied_offset and self.rebuilder is not None:
                    log.error("%s diverges from its leader at offset %d, below the %d records it applied: "
                              "rebuilding it from a remote snapshot", replica.tb, step.offset, store.applied_offset)
                    self.rebuilder.due(replica, result.log_start_offset, DIVERGED)
                    return True
                log.info("%s diverges from its leader (epoch %s ends at %d there): truncating to %d",
                         replica.tb, result.diverging_epoch, result.diverging_end_offset, step.offset)
                store.truncate_to(step.offset)
                return True
            if result.entries:
                store.append_replicated(list(result.entries))
        self.applier.due(replica, result.high_watermark)
        return True


class Applier(ReplicaWorker):
    """Applies followed buckets' stores up to their leaders' HW, on a thread of its own."""

    name = "replica-apply"

    def due(self, replica, high_watermark: int) -> None:
        self._queue(replica, high_watermark, max)

    def _run(self) -> None:
        while (work := self._take(one=False)) is not None:
            for replica, high_watermark in work:
                try:
                    with replica.fetch_lock:
                        if not replica.closed:
                            store = replica.store
                            store.advance_high_watermark(min(high_watermark, store.log_end_offset))
                except Exception as exc:  # its store failed: the next answer tries again
                    log.warning("applying %s up to %d failed: %s", replica.tb, high_watermark, exc)
