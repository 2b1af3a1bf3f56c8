"""Idempotent writes: this client's writer id and batch numbers per bucket.

Each bucket's writes carry ``(writer id, sequence)``: the tablet server
appends batch ``n`` once and answers a resent batch ``n`` (a retry after a
timeout or a lost answer, also on a new leader) with its original offsets.
So a write is retried like a read, and applied once.

One writer's batches to one bucket go one at a time, in order: a call takes a
free writer of the bucket for its batches (:meth:`Writers.use`), so calls
from several threads at once use several writers and still share the
server's fsyncs (each is a writer of its own to the server).
A batch refused before anything was appended (a bad row: InvalidRequestError)
leaves its number free; a write that changed nothing took none. So does one
that ran out of retries on NOT_ENOUGH_REPLICAS (too few in-sync replicas: the
leader appends nothing then) when every attempt of it was refused so; the
retries within the policy resend the same (writer, sequence) anyway, also to a
new leader after a failover, which answers a batch it already has with its
original offsets. A batch
whose outcome is unknown (out of retries) ends the writer: the next write of
that bucket takes a new random writer id and numbers from 0, so a number
that may be taken is never used for other rows. OUT_OF_ORDER_SEQUENCE (the
server does not know the writer, e.g. it forgot it after
``writer.id.expiration``) means nothing was appended: a new writer sends the
batch again.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from typing import Callable, Iterator

from kvlease.common import errors

MAX_SEQUENCE = 2**31 - 1
#: Answers that say the batch was refused before anything was appended: resending its number is right.
REFUSED: tuple[type[errors.KvLeaseError], ...] = (errors.InvalidRequestError, errors.NotEnoughReplicasError)


def new_writer_id() -> int:
    """A random writer id, 1 … 2^62 (two clients picking the same one is not to be expected)."""
    return secrets.randbits(62) + 1


class BucketWriter:
    """One writer of this client for one bucket, used by one call at a time (:meth:`Writers.use`)."""

    def __init__(self) -> None:
        self.writer_id = new_writer_id()
        self.sequence = 0
        self._maybe_appended = False  # an attempt of the batch being sent failed in a way that may have appended it

    def renew(self) -> None:
        self.writer_id, self.sequence = new_writer_id(), 0

    def watch(self, attempt: Callable) -> Callable:
        """``attempt`` (one try of sending the batch), noting a failure other than a refusal (:data:`REFUSED`):
        the batch may then have been appended, and its number is not given to other rows."""
        def watched(*args):
            try:
                return attempt(*args)
            except REFUSED:
                raise
            except BaseException:
                self._maybe_appended = True
                raise
        return watched

    def send(self, request, call: Callable[[Callable[[Callable], Callable]], object]):
        """``call(watch)`` with ``request`` (a PutKvRequest) numbered as this writer's next batch; its response.
        ``call`` retries the request, every attempt wrapped by ``watch`` (:meth:`watch`)."""
        try:
            response = self._send_once(request, call)
        except errors.OutOfOrderSequenceError:  # nothing was appended: the new writer sends it again, once
            response = self._send_once(request, call)
        if response.next_offset > response.base_offset:
            self.sequence += 1
        return response

    def _send_once(self, request, call: Callable[[], object]):
        if self.sequence > MAX_SEQUENCE:
            self.renew()
        request.writer_id, request.sequence = self.writer_id, self.sequence
        self._maybe_appended = False
        try:
            return call(self.watch)
        except errors.OutOfOrderSequenceError:
            self.renew()  # nothing was appended; the caller decides whether to send again
            raise
        except errors.InvalidRequestError:
            raise  # refused before anything was appended: the number stays free
        except errors.NotEnoughReplicasError:
            if self._maybe_appended:  # an earlier attempt's outcome is unknown
                self.renew()
            raise  # else every attempt was refused before appending: the number stays free
        except BaseException:
            self.renew()  # the outcome is unknown: never use this number for other rows
            raise


class Writers:
    """The free writers of each bucket: a call takes one (a new one if none is free) and gives it back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[BucketWriter]] = {}

    @contextlib.contextmanager
    def use(self, bucket: int) -> Iterator[BucketWriter]:
        with self._lock:
            free = self._free.get(bucket)
            writer = free.pop() if free else BucketWriter()
        try:
            yield writer
        finally:
            with self._lock:
                self._free.setdefault(bucket, []).append(writer)
