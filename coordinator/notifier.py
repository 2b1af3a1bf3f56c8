"""Pushes bucket roles to tablet servers, off the event loop.

The controller calls :meth:`LeadershipNotifier.push` with the full set of
buckets a server holds a replica of, led or followed (each with its leader,
the leader's address, replicas, ISR and epochs); sending happens on a small thread pool with bounded retries.
A newer push for the same server replaces an older one not sent yet (dropped
tables accumulate, and so do buckets a completed move took off the server,
unless the newer push holds them again), so a slow server never sees stale
state after fresh.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import grpc

from kvlease.client.transport import Channels, RetryPolicy, rpc_error
from kvlease.common import errors
from kvlease.common.tls import TlsFiles
from kvlease.common.wire import raise_for
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.coordinator.leader_leases import PushLease
from kvlease.coordinator.leadership_wire import BucketRoles, bucket_role_pb  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)


class LeadershipNotifier:
    def __init__(self, coordinator_epoch: int, *, retry_total_s: float = 30.0, threads: int = 4,
                 tls: TlsFiles | None = None, credentials: tuple[str, str] | None = None) -> None:
        self.epoch = coordinator_epoch
        self.retry_total_s = retry_total_s
        #: ``on_delivered(server_id, seq)``: the server took the push numbered ``seq`` (its PushLease's).
        self.on_delivered: Callable[[int, int], None] = lambda server_id, seq: None
        #: ``on_undelivered(server_id)``: a push ran out of retries (the coordinator pushes again later: a
        #: live server that missed one would keep a leadership it lost, unleased).
        self.on_undelivered: Callable[[int], None] = lambda server_id: None
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="leadership-push")
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[str, list, set[int], dict, str, PushLease | None]] = {}
        self._sending: set[int] = set()  # one sender per server keeps pushes in order
        self._closed = threading.Event()
        self._channels = Channels(tls=tls, credentials=credentials)  # as the cluster's own principal
        self.roles = BucketRoles()  # each bucket's entry encoded once per state, not per push

    def push(self, server_id: int, address: str, led: list, dropped: list[int], removed: list = (),
             dir_id: str = "", lease: PushLease | None = None) -> None:
        """``removed``: buckets a completed move took off the server; ``dir_id``: the data dir id the
        coordinator recorded for the server ("": none), a server with another one refuses the push;
        ``lease``: what it tells of the server's leader lease (coordinator/leader_leases.py)."""
        with self._lock:
            old = self._pending.get(server_id)
            held = {(held[0].physical_id, held[1]) for held in led}
            gone = {key: entry for key, entry in (old[3] if old else {}).items() if key not in held}
            gone.update(((entry[0].physical_id, entry[1]), entry) for entry in removed)
            self._pending[server_id] = (address, led, (old[2] if old else set()) | set(dropped), gone, dir_id, lease)
            if server_id in self._sending:
                return
            self._sending.add(server_id)
        self._pool.submit(self._drain, server_id)

    def close(self) -> None:
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._channels.close()

    def _drain(self, server_id: int) -> None:
        while not self._closed.is_set():
            with self._lock:
                item = self._pending.pop(server_id, None)
                if item is None:
                    self._sending.discard(server_id)
                    return
            self._send(server_id, *item)

    def _send(self, server_id: int, address: str, led: list, dropped: set[int], removed: dict, dir_id: str,
              lease: PushLease | None) -> None:
        waits = lease.waits if lease is not None else {}
        header = pb.UpdateLeadershipRequest(coordinator_epoch=self.epoch, server_id=server_id,
                                            dropped_tables=sorted(dropped), dir_id=dir_id)
        if lease is not None and lease.session_id is not None:
            header.session_id, header.demotions = lease.session_id, lease.demotions
        entry = self.roles.entry  # waits and removed buckets by physical id: a partition's, or the table's
        request = self.roles.request(header, [
            entry(*held, server_id=server_id, lease_wait_ms=waits.get((held[0].physical_id, held[1]), 0))
            for held in led] + [entry(*gone, removed=True) for _key, gone in sorted(removed.items())])
        retry = RetryPolicy(self.retry_total_s).retrying((errors.KvLeaseError,), stop_event=self._closed)
        try:
            for attempt in retry:
                with self._lock:
                    if server_id in self._pending:
                        # it replaces this one (with this one's dropped tables, and removed buckets it does not hold)
                        address_, led_, dropped_, gone_, dir_id_, lease_ = self._pending[server_id]
                        held = {(entry[0].physical_id, entry[1]) for entry in led_}
                        gone_ = {**{k: e for k, e in removed.items() if k not in held}, **gone_}
                        self._pending[server_id] = (address_, led_, dropped_ | dropped, gone_, dir_id_, lease_)
                        return
                with attempt:
                    try:
                        response = self._channels.stub(address, pb_grpc.TabletServiceStub).UpdateLeadership(
                            request, timeout=10)
                    except grpc.RpcError as exc:
                        raise rpc_error(exc, "UpdateLeadership", address, timeout_s=10, idempotent=True) from None
                    raise_for(response.error)
        except Exception as exc:  # told again later (on_undelivered); a restarted server gets a new push anyway
            log.warning("could not tell tablet server %d (%s) its buckets: %s", server_id, address, exc)
            if not self._closed.is_set():
                self.on_undelivered(server_id)
            return
        if lease is not None:
            self.on_delivered(server_id, lease.seq)
