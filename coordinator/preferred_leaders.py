"""Automatic preferred-leader elections on the active coordinator (``auto.leader-rebalance.enabled``;
docs/architecture.md "Preferred leaders").

Leadership goes back to a bucket's preferred replica (its first,
:mod:`kvlease.coordinator.leader_balance_plan`) without an operator:

- **when it returns**: an ``AlterIsr`` that brings a bucket's preferred
  replica (back) into its ISR while another leads it (a restarted server, or
  one that had fallen behind, caught up) queues the bucket; the queued ones
  are elected together once the batch that brought them is handled (the
  leader's ``AlterIsr`` is answered first);
- **periodically**: every ``leader.imbalance.check-interval`` (checked on the
  loop's expiry tick), each server whose share of the buckets it is
  preferred for that another leads exceeds
  ``leader.imbalance.per-server.percentage`` gets those it may lead back
  (Kafka's ``leader.imbalance.per.broker.percentage``), e.g. leaderships a
  controlled shutdown moved away from a server that is in sync again.

Only replicas that :func:`~kvlease.coordinator.leader_balance_plan.may_lead` are elected, and none of a server that
gave a leadership up because it could not write (``ResignLeadership``, a full disk) within the last check
interval: back in an ISR it had nothing to write, it would be elected and give it up again.
The plans are :mod:`kvlease.coordinator.leader_balance_plan`'s; this shell writes them
through :meth:`~kvlease.coordinator.membership.Membership.apply` (fenced, then
applied, then every replica told). A write that fails (not fatally) is
logged; the next check tries again. Runs on the event loop's thread.
"""

from __future__ import annotations

import logging
from typing import Callable

from kvlease.common import errors
from kvlease.coordinator import leader_balance_plan
from kvlease.coordinator.assignment import BucketAssignment, Changes
from kvlease.coordinator.membership import Membership

log = logging.getLogger(__name__)

_FATAL = (errors.CoordinatorFencedError, errors.OutcomeUnknownError)  # the coordinator steps down


class PreferredLeaders:
    def __init__(self, members: Membership, clock_ms: Callable[[], int], *, enabled: bool = True,
                 check_interval_ms: int = 30_000, threshold_pct: float = 10.0, metrics=None) -> None:
        self.members = members
        self.clock_ms = clock_ms
        self.enabled = enabled
        self.check_interval_ms = check_interval_ms
        self.threshold_pct = threshold_pct
        self.metrics = metrics
        self._queued: set[tuple[int, int]] = set()
        self._next_check_ms = clock_ms() + check_interval_ms
        self._resigned: dict[int, int] = {}  # server -> until when (ms) it is not elected

    def resigned(self, server_id: int) -> None:
        """``server_id`` gave a leadership up because it could not write: not elected for a check interval."""
        self._resigned[server_id] = self.clock_ms() + self.check_interval_ms

    def _excluded(self) -> set[int]:
        """Servers not to elect now: decommissioned, or resigned within the last check interval."""
        now = self.clock_ms()
        self._resigned = {s: until for s, until in self._resigned.items() if until > now}
        return set(self.members.decommissioned.ids) | set(self._resigned)

    def isr_changed(self, table_id: int, bucket: int, before: BucketAssignment | None) -> None:
        """The bucket's ISR changed from ``before``: queue it if that brought its preferred replica back."""
        after = self.members.assignments.table(table_id).get(bucket)
        if self.enabled and after is not None and leader_balance_plan.rejoined(before, after):
            self._queued.add((table_id, bucket))

    def run_queued(self) -> None:
        """Elect the queued buckets' preferred replicas (those that still may lead)."""
        if not self._queued:
            return
        queued, self._queued = sorted(self._queued), set()
        live, excluded = set(self.members.servers), self._excluded()
        elected = {}
        for table_id, bucket in queued:
            a = self.members.assignments.table(table_id).get(bucket)
            new = None if a is None else leader_balance_plan.preferred_leader(a, live, excluded)
            if new is not None:
                elected[(table_id, bucket)] = new
        self._elect(elected, "back in the ISR")

    def tick(self) -> None:
        """The expiry tick: the imbalance check, once every check interval."""
        now = self.clock_ms()
        if not self.enabled or now < self._next_check_ms:
            return
        self._next_check_ms = now + self.check_interval_ms
        elected = leader_balance_plan.elections(self.members.assignments, self.members.servers, self._excluded(),
                                           self.threshold_pct)
        self._elect(elected, f"imbalance above {self.threshold_pct:g}%")

    def _elect(self, elected: dict[tuple[int, int], BucketAssignment], why: str) -> None:
        if not elected:
            return
        assignments = self.members.assignments
        changes: Changes = {}
        for (table_id, bucket), new in sorted(elected.items()):
            changes.setdefault(table_id, dict(assignments.table(table_id)))[bucket] = new
        try:
            self.members.apply(changes)
        except _FATAL:
            raise
        except errors.KvLeaseError as exc:
            log.warning("preferred-leader elections (%s) failed, tried again at the next check: %s", why, exc)
            return
        done = sum(assignments.table(t).get(b) == new for (t, b), new in elected.items())
        log.info("preferred-leader elections (%s): %d bucket(s) led by their preferred replica again", why, done)
        if self.metrics is not None:
            self.metrics.preferred_leader_elections.inc(done)
