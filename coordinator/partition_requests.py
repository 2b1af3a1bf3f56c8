"""The event loop's partition requests and timers, handed on by the controller (docs/partitions.md).

Partition DDL are barriers (gathered lease writes are persisted first, as for
tables); the listing is a query. Besides requests: the auto-partition timer
(a check at the first expiry tick of a coordinator's term, then every
``auto-partition.check-interval``) and the drop of partitions kept past
retention once the last lease holding them lets go (after the batch whose
lease changes freed them).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Callable, Iterable

from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.statemachine import Dispatcher, on
from kvlease.coordinator import requests as rq
from kvlease.coordinator.lease_shell import LeaseShell
from kvlease.coordinator.partitions import Partitions
from kvlease.coordinator.loop import settle

log = logging.getLogger(__name__)

#: Errors after which the coordinator steps down (a step of the loop's own re-raises them).
FATAL = (errors.CoordinatorFencedError, errors.OutcomeUnknownError)


class PartitionRequests(Dispatcher):
    def __init__(self, partitions: Partitions, lease_shell: LeaseShell, clock_ms: Callable[[], int],
                 interval_ms: int) -> None:
        self.partitions = partitions
        self.lease_shell = lease_shell
        self.clock_ms = clock_ms
        self.interval_ms = interval_ms
        self._checked_at: int | None = None  # None: not yet in this term (the first tick checks)
        self._released = False  # a lease change freed a bucket of a partition kept past retention

    def handles(self, request: object) -> bool:
        return type(request) in self._handlers

    # -- requests ------------------------------------------------------------------------------

    @on(rq.CreatePartition)
    def _create(self, request: rq.CreatePartition, future: Future | None) -> None:
        self.lease_shell.flush()
        settle(future, self.partitions.create(request))

    @on(rq.DropPartition)
    def _drop(self, request: rq.DropPartition, future: Future | None) -> None:
        self.lease_shell.flush()
        settle(future, self.partitions.drop(request))

    @on(rq.AlterTable)
    def _alter(self, request: rq.AlterTable, future: Future | None) -> None:
        self.lease_shell.flush()
        settle(future, self.partitions.alter(request))

    @on(rq.CheckAutoPartitions)
    def _check(self, request: rq.CheckAutoPartitions, future: Future | None) -> None:
        self.lease_shell.flush()  # no acquire in flight may add a partition a check drops
        self._checked_at = self.clock_ms()
        settle(future, self.partitions.check(request))

    @on(rq.ListPartitions)
    def _list(self, request: rq.ListPartitions, future: Future | None) -> None:
        settle(future, self.partitions.list(request))

    # -- the loop's own steps --------------------------------------------------------------------

    def tick(self) -> None:
        """The expiry tick: a check at the first tick of a term, then every interval."""
        now = self.clock_ms()
        if self._checked_at is not None and now - self._checked_at < self.interval_ms:
            return
        self._checked_at = now
        self.lease_shell.flush()
        self._step("auto-partitioning", self.partitions.check)

    def freed(self, buckets: Iterable[TableBucket]) -> None:
        """Lease changes freed ``buckets``: a partition kept past retention for them may go (:meth:`after_batch`)."""
        held = self.partitions.held
        if held and any(tb.partition_id in held for tb in buckets):
            self._released = True

    def after_batch(self) -> None:
        """After a batch's lease writes: drop the partitions kept past retention that no lease holds now."""
        if self._released:
            self._released = False
            self._step("dropping partitions leases released", self.partitions.drop_released)

    @staticmethod
    def _step(what: str, step: Callable[[], object]) -> None:
        """Run a step of the loop's own (not a request's): a failure is logged and left to its next run."""
        try:
            step()
        except errors.KvLeaseError as exc:
            if isinstance(exc, FATAL):
                raise
            log.warning("%s failed: %s", what, exc.message)
