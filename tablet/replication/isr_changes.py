"""The leader's ISR upkeep: every ``interval_s`` each leadership is asked whether its ISR should change
(followers lagging past ``replica.max-lag`` leave, caught-up ones join), and a change is sent to the
coordinator (``AlterIsr``, carrying the leader and bucket epochs; one in flight per bucket). The
coordinator's answer — the new state, or the current one when it refused a stale request — goes back to
the leadership."""

from __future__ import annotations

import logging
import time
from typing import Callable

from kvlease.common import errors
from kvlease.tablet.periodic import Periodic

log = logging.getLogger(__name__)


class IsrKeeper(Periodic):
    name = "isr-keeper"

    def __init__(self, server_id: int, leaderships: Callable[[], list], alter_isr, *, max_lag_ms: int,
                 interval_s: float = 0.2, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        """``leaderships()``: the live :class:`~kvlease.tablet.replication.leader.Leadership` objects; ``alter_isr``:
        ``ServerCalls.alter_isr`` (``client/server_calls.py``)."""
        super().__init__(interval_s)
        self.server_id = server_id
        self.leaderships = leaderships
        self.alter_isr = alter_isr
        self.max_lag_ms = max_lag_ms
        self.clock_ms = clock_ms

    def run_once(self) -> int:
        """Send the ISR changes due now; returns how many were accepted."""
        accepted = 0
        for lead in self.leaderships():
            change = lead.propose_isr_change(self.clock_ms(), self.max_lag_ms)
            if change is None:
                continue
            isr, epoch, bucket_epoch = change
            role = lead.role
            try:
                state = self.alter_isr(self.server_id, role.table.table_id, role.bucket, epoch, bucket_epoch, isr,
                                       partition_id=role.table.partition_id)
            except errors.FencedLeaderEpochError as exc:
                lead.isr_change_failed(self.clock_ms())
                current = exc.details
                if current.get("leader_epoch") == epoch and current.get("isr"):  # same leadership: adopt its state
                    lead.isr_changed(current["isr"], int(current.get("bucket_epoch", bucket_epoch)))
                log.info("ISR change of %s to %s refused: %s", lead.where, isr, exc)
                continue
            except errors.KvLeaseError as exc:
                lead.isr_change_failed(self.clock_ms())
                log.warning("ISR change of %s to %s failed (tried again): %s", lead.where, isr, exc)
                continue
            lead.isr_changed(state.isr, state.bucket_epoch)
            log.info("ISR of %s is now %s (bucket epoch %d)", lead.where, sorted(state.isr), state.bucket_epoch)
            accepted += 1
        return accepted
