"""One leadership of one replicated bucket on this server: the HW, the ISR it asks for, writes waiting.

A :class:`Leadership` lives for one leader epoch (a new epoch is a new one);
it wraps the pure :class:`~kvlease.tablet.replication.isr.LeaderView` with a lock and
the bucket's store. Writes: :meth:`Leadership.check_write` before the append
(fenced epoch, NOT_ENOUGH_REPLICAS), :meth:`Leadership.appended` after it,
:meth:`Leadership.wait_committed` until the HW passed them. Followers'
fetches move the HW (:meth:`Leadership.on_fetch`); the store applies what the
HW commits to RocksDB (the pre-write buffer, ``tablet/bucket/store.py``) before any
waiting write is answered. ISR changes go to the coordinator one at a time
(:meth:`Leadership.propose_isr_change`, then :meth:`isr_changed` or
:meth:`isr_change_failed`).

Lock order: a leadership's lock, then the store's write lock (the store never
calls back here).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from kvlease.common import errors
from kvlease.tablet.replication.isr import LeaderView, can_write
from kvlease.tablet.replication.roles import BucketRole


class Leadership:
    def __init__(self, server_id: int, role: BucketRole, store, now_ms: int,
                 on_commit: Callable[[], None] = lambda: None, on_isr_due: Callable[[], None] = lambda: None) -> None:
        """``store`` is open and was told :meth:`become_leader`; ``on_commit()`` runs after the HW moved,
        ``on_isr_due()`` when a follower's fetch made it a member to add to the ISR (the ISR keeper runs at
        once rather than at its next round: a rebuilt or restarted follower is back in sync sooner)."""
        self.server_id = server_id
        self.role = role
        self.epoch = role.leader_epoch
        self.bucket_epoch = role.bucket_epoch
        self.store = store
        self.on_commit = on_commit
        self.on_isr_due = on_isr_due
        self.ended = False
        self._cond = threading.Condition()
        end = store.log_end_offset
        self.view = LeaderView(server_id, role.replicas, role.isr or (server_id,), leader_log_end=end,
                               high_watermark=min(store.high_watermark, end), epoch_start_offset=end, now_ms=now_ms)
        if self.view.on_append(end):  # an ISR of the leader alone: everything in its log is committed now
            store.advance_high_watermark(self.view.high_watermark())
        self._answered_hw: dict[int, int] = {}  # follower -> the HW last answered to it
        self._next_change_ms = 0  # after a refused or failed ISR change, the next waits a little

    @property
    def where(self) -> str:
        return f"bucket {self.role.bucket} of {self.role.table.where}"

    @property
    def high_watermark(self) -> int:
        return self.view.high_watermark()

    @property
    def isr(self) -> frozenset[int]:
        return self.view.isr

    def check_read(self) -> None:
        """Raise unless reads may be served: a new leader serves once its HW reached the log end it took
        over (every write an earlier leader committed is then applied here too; until then a read could
        miss one a client already saw): LeaderNotAvailableError (retried) meanwhile."""
        if self.ended:
            raise errors.NotLeaderError(f"this tablet server no longer leads {self.where}")
        hw = self.view.high_watermark()
        if hw < self.view.epoch_start_offset:
            raise errors.LeaderNotAvailableError(
                f"the new leader of {self.where} is catching up (its high watermark {hw} has not reached "
                f"{self.view.epoch_start_offset} yet): retry in a moment")

    # -- writes ----------------------------------------------------------------------

    def check_write(self, request_epoch: int | None) -> None:
        """Raise before a write is appended: NotLeader (ended, or the client knows a newer epoch),
        FencedLeaderEpoch (the client routed by an older one), NotEnoughReplicas."""
        check_epoch(self.epoch, request_epoch, self.where)
        with self._cond:
            if self.ended:
                raise errors.NotLeaderError(f"this tablet server no longer leads {self.where}")
            isr = self.view.isr
            if not can_write(isr, self.role.table.min_insync_replicas):
                raise errors.NotEnoughReplicasError(
                    f"{self.where} has {len(isr)} in-sync replica(s) {sorted(isr)}, fewer than its table's "
                    f"min.insync-replicas {self.role.table.min_insync_replicas}: nothing was appended",
                    isr=sorted(isr))

    def appended(self) -> None:
        """The store appended: the HW may move (an ISR of the leader alone commits at once)."""
        with self._cond:
            if not self.ended and self.view.on_append(self.store.log_end_offset):
                self._commit()

    def wait_committed(self, end_offset: int, timeout_s: float | None) -> None:
        """Wait until the HW reached ``end_offset``. Raises NotLeaderError if the leadership ends first,
        NotEnoughReplicasError (retriable: a resent idempotent batch is answered once it commits) after
        ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while not self.view.committed(end_offset):
                if self.ended:
                    raise errors.NotLeaderError(
                        f"the leadership of {self.where} moved before offsets below {end_offset} were committed: "
                        f"send the write to the new leader (an idempotent batch is applied once)")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise errors.NotEnoughReplicasError(
                        f"{self.where}: the write was appended below offset {end_offset} but its in-sync replicas "
                        f"{sorted(self.view.isr)} did not commit it in the request's time; a resent idempotent "
                        f"batch is answered with its offsets once committed")
                self._cond.wait(remaining if remaining is not None else 1.0)
            isr, needed = self.view.isr, self.role.table.min_insync_replicas
            if not can_write(isr, needed):  # committed by an ISR that shrank meanwhile: not acknowledged
                raise errors.NotEnoughReplicasError(
                    f"{self.where}: the write below offset {end_offset} was committed by in-sync replicas "
                    f"{sorted(isr)}, fewer than min.insync-replicas {needed}: not acknowledged; a resent "
                    f"idempotent batch is answered with its offsets once enough replicas are in sync", isr=sorted(isr))

    # -- followers ---------------------------------------------------------------------

    def on_fetch(self, follower: int, fetch_offset: int, now_ms: int) -> tuple[int, bool]:
        """A follower fetches at ``fetch_offset`` (its log end): ``(HW, news)``, news when the HW moved
        past the one last answered to it (its fetch should not wait)."""
        with self._cond:
            if self.ended:
                raise errors.NotLeaderError(f"this tablet server no longer leads {self.where}")
            try:
                if self.view.on_fetch(follower, fetch_offset, now_ms, self.store.log_end_offset):
                    self._commit()
            except ValueError as exc:
                raise errors.InvalidRequestError(f"{self.where}: {exc}") from None
            if self.view.proposed_isr is None and now_ms >= self._next_change_ms and self.view.can_join(follower):
                self.on_isr_due()
            return self._answer(follower)

    def polled(self, follower: int) -> tuple[int, bool]:
        """A follower's fetch waiting here looks again: ``(HW, news)`` as :meth:`on_fetch`, its progress not
        taken again (it was when the fetch arrived)."""
        with self._cond:
            if self.ended:
                raise errors.NotLeaderError(f"this tablet server no longer leads {self.where}")
            return self._answer(follower)

    def _answer(self, follower: int) -> tuple[int, bool]:
        """``(HW, news)``: news when the HW moved past the one last answered to ``follower``. Hold the lock."""
        hw = self.view.high_watermark()
        return hw, hw > self._answered_hw.get(follower, -1)

    def answered(self, follower: int, hw: int) -> None:
        with self._cond:
            self._answered_hw[follower] = max(hw, self._answered_hw.get(follower, -1))

    def propose_isr_change(self, now_ms: int, max_lag_ms: int) -> tuple[list[int], int, int] | None:
        """The ISR to ask the coordinator for, if it should change and no change is in flight:
        ``(isr, leader_epoch, bucket_epoch)``."""
        with self._cond:
            if self.ended or self.view.proposed_isr is not None or now_ms < self._next_change_ms:
                return None
            shrink = self.view.shrink_candidates(now_ms, max_lag_ms)
            expand = frozenset(r for r in self.view.expand_candidates()  # fetching now, not a past fetch
                               if (self.view.follower(r).last_fetch_ms or 0) >= now_ms - max_lag_ms)
            if not shrink and not expand:
                return None
            isr = (self.view.isr - shrink) | expand
            self.view.propose_isr(isr)
            return sorted(isr), self.epoch, self.bucket_epoch

    def isr_changed(self, isr, bucket_epoch: int) -> None:
        """The coordinator's answer to an ISR change: the ISR it accepted, or its current state when it refused."""
        with self._cond:
            if self.ended or bucket_epoch < self.bucket_epoch:
                return
            self._set_isr(isr, bucket_epoch)

    def isr_pushed(self, isr, bucket_epoch: int) -> None:
        """A push's ISR of this leadership's bucket. While an ISR change is in flight, a push of the bucket
        epoch it was proposed under is older news than the change's answer (the coordinator pushes every
        bucket of a server when one changes): it is ignored, so the HW keeps waiting for the members the change
        adds. Taking it would commit writes those members lack, and the coordinator may accept the change and
        make one of them leader (a preferred-leader election): those acknowledged writes would be lost."""
        with self._cond:
            if self.ended or bucket_epoch < self.bucket_epoch or (
                    bucket_epoch == self.bucket_epoch and self.view.proposed_isr is not None):
                return
            self._set_isr(isr, bucket_epoch)

    def _set_isr(self, isr, bucket_epoch: int) -> None:
        """Take the coordinator's ISR (it clears a change in flight). Hold the lock."""
        self.bucket_epoch = bucket_epoch
        if self.view.set_isr([r for r in isr if r in self.view.replicas] or [self.server_id]):
            self._commit()
        self._cond.notify_all()

    def isr_change_failed(self, now_ms: int, backoff_ms: int = 1000) -> None:
        """The change in flight was refused or failed. The followers it would have added are forgotten: the
        coordinator refuses one that is not live, and when it is back (restarted, perhaps on a new disk) it
        must fetch again before it is proposed again."""
        with self._cond:
            self._next_change_ms = now_ms + backoff_ms
            added = (self.view.proposed_isr or frozenset()) - self.view.isr
            if self.view.isr_change_failed():
                self._commit()
            self.view.forget(added)

    def end(self) -> None:
        """This leadership is over: writes waiting are answered NOT_LEADER."""
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    def _commit(self) -> None:
        """The HW moved: apply what it commits to RocksDB, then wake the writes waiting. Hold the lock."""
        self.store.advance_high_watermark(self.view.high_watermark())
        self._cond.notify_all()
        self.on_commit()


def check_epoch(current: int, requested: int | None, where: str) -> None:
    """FencedLeaderEpoch for a request routed by an older leader epoch, NotLeader for a newer one."""
    if requested is None or requested == current:
        return
    if requested < current:
        raise errors.FencedLeaderEpochError(
            f"{where}: the request names leader epoch {requested}, older than the current {current}: refresh "
            f"the bucket's leader", leader_epoch=current)
    raise errors.NotLeaderError(f"{where}: the request names leader epoch {requested}, newer than this tablet "
                                f"server's {current}: it is not (yet) the leader of that epoch")
