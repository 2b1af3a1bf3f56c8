"""A rebuild's changelog tail, fetched from the leader while the snapshot downloads.

A replica rebuilt from a remote snapshot (``tablet/replication/rebuild.py``)
continues its log from the snapshot's ``log_offset``: everything its leader
appended since is the tail it fetches once the snapshot is installed. The
snapshot's ``log_offset`` is known before its files are, so
:class:`TailPrefetch` asks the leader for the tail at once, on a thread of its
own, while the files download: the install then appends what it holds in one
write (``BucketStore.append_replicated``, the fetcher's own path: checked,
fsynced, epochs and idempotent writers noted) and the fetcher goes on from
there instead of from the snapshot's offset. Caught up with the leader, it
long-polls (``FetchLog``'s ``max_wait_ms``): what the leader commits meanwhile
comes at once, and :meth:`TailPrefetch.finish` cancels the poll in flight.

It reads as a reader does (``FetchLog``: committed entries only, byte for
byte as the leader framed them), not as a follower (``ReplicaFetch``): a
follower's fetch offset tells its leader that it holds everything below it,
which would count toward the high watermark and the ISR before the entries
are durable here. Committed entries are on every in-sync replica, so
appending them to the rebuilt replica is what its fetcher would have done.

Bounded: at most ``max_total_bytes`` (the fetcher gets the rest). Best
effort: an error (the leader moved, its log no longer reaches the offset,
the server stops) ends the prefetch with what it holds so far; the fetcher
then fetches from the end of that, as it would have anyway.
"""

from __future__ import annotations

import logging
import threading

import grpc

from kvlease.client.transport import Channels
from kvlease.common.logentry import read_header
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.common.wire import error_from_pb

log = logging.getLogger(__name__)

#: Caught up with the leader's high watermark: the next call is a long poll of at most this long (it answers as
#: soon as the leader commits more; :meth:`TailPrefetch.finish` cancels it).
IDLE_WAIT_MS = 200
RPC_TIMEOUT_S = 30.0


class TailPrefetch:
    """Fetches ``table``'s bucket ``bucket`` from ``from_offset`` on the leader at ``address`` until
    :meth:`finish` (see the module docstring)."""

    def __init__(self, channels: Channels, address: str, table_id: int, bucket: int, partition_id: int | None,
                 from_offset: int, *, max_bytes: int, max_total_bytes: int, stop: threading.Event) -> None:
        self.channels, self.address = channels, address
        self.table_id, self.bucket, self.partition_id = table_id, bucket, partition_id
        self.next_offset = from_offset
        self.max_bytes, self.max_total_bytes = max(1, max_bytes), max_total_bytes
        self.entries: list[bytes] = []
        self.bytes = 0
        self.high_watermark = 0  # the leader's, as its last answer said (every entry here ends at or below it)
        self._stop = stop
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._waiting = None  # the long poll in flight (a gRPC future), for finish() to cancel
        self._thread = threading.Thread(target=self._run, daemon=True, name="rebuild-tail-prefetch")

    def start(self) -> "TailPrefetch":
        self._thread.start()
        return self

    def finish(self) -> tuple[list[bytes], int]:
        """Stop fetching (a call bringing entries ends first, a long poll waiting for more is cancelled); the
        entries fetched (framed, contiguous from the snapshot's offset, committed on the leader) and the
        leader's high watermark last seen."""
        self._done.set()
        with self._lock:
            waiting = self._waiting
        if waiting is not None:
            waiting.cancel()
        self._thread.join()
        return self.entries, self.high_watermark

    def _run(self) -> None:
        first = True  # the first call is made whatever: a short download still gets the tail
        caught_up = False
        try:
            while not self._stop.is_set() and self.bytes < self.max_total_bytes:
                if not first and self._done.is_set():
                    return
                first = False
                caught_up = not self._fetch_once(IDLE_WAIT_MS if caught_up else 0)
        except Exception as exc:  # best effort: the fetcher fetches from wherever this stopped
            log.info("the tail prefetch of bucket %d of table %d stopped at offset %d: %s", self.bucket,
                     self.table_id, self.next_offset, exc)

    def _fetch_once(self, wait_ms: int) -> bool:
        """One FetchLog call (a long poll of ``wait_ms``, cancelled by :meth:`finish`); whether it brought
        entries."""
        request = pb.FetchLogRequest(table_id=self.table_id, bucket=self.bucket, partition_id=self.partition_id,
                                     from_offset=self.next_offset, max_bytes=self.max_bytes, max_wait_ms=wait_ms)
        call = self.channels.stub(self.address, pb_grpc.TabletServiceStub).FetchLog.future(
            request, timeout=RPC_TIMEOUT_S)
        try:
            response = self._long_poll(call) if wait_ms else call.result()
            if response is None:
                return False  # cancelled: finish() was called
        except grpc.RpcError as exc:
            raise RuntimeError(f"FetchLog to {self.address}: {exc.code()}") from None
        error = error_from_pb(response.error)
        if error is not None:
            raise error
        self.high_watermark = max(self.high_watermark, response.log_end_offset)
        if not response.entries:
            return False
        for entry in response.entries:
            self.entries.append(entry)
            self.bytes += len(entry)
        self.next_offset = _entry_end(response.entries[-1])
        return True

    def _long_poll(self, call):
        """``call``'s answer, or None if :meth:`finish` cancelled it (or came before it could be)."""
        with self._lock:
            self._waiting = call
        try:
            if self._done.is_set():  # finish() came before ``call`` was known to it
                call.cancel()
            return call.result()
        except grpc.FutureCancelledError:
            return None
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED and self._done.is_set():
                return None
            raise
        finally:
            with self._lock:
                self._waiting = None


def _entry_end(frame: bytes) -> int:
    """The offset after a framed entry (its base offset + record count)."""
    view = memoryview(frame)
    header = read_header(view, 0, len(view))
    return header.base_offset + header.count
