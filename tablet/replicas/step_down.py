"""A leader that cannot write steps down: led replicated buckets whose local writes or opens keep failing give
their leadership to another in-sync replica (docs/operations.md, "A full disk").

A bucket whose local write or open fails (a full disk, EIO, a read-only remount, too many open files) refuses
writes and is reopened after a backoff (``tablet/bucket/files.py``); a full disk usually fails the reopen too,
and while it lasts the leader serves nothing although a follower is in sync. So every ``interval_s``
:class:`StepDown` looks at the replicated buckets this server leads:

- a bucket is *failing* from the first failure seen until it has gone ``replica.leader.failure-timeout``
  without one (a reopen that succeeds and a write that fails right after it are one streak); every failure
  the bucket records counts, except damage, which a reopen cannot cure and which is reported as a lost replica
  instead (``tablet/bucket/damage.py``, ``tablet/replicas/loss.py``);
- a bucket failed now (its files refuse writes until their reopen, so as a follower it does not fetch and
  rejoin the ISR before that) and failing for ``replica.leader.failure-timeout`` (3 s) resigns:
  ``ResignLeadership`` (one call for the buckets due in a round, each fenced by its leader epoch, safe to
  resend) makes the coordinator elect another live in-sync replica and take this server out of the ISR in the
  same write, so it is not elected back while it cannot write. The push then makes this server a follower: its
  unacknowledged tail is truncated by leader epoch as after any election, and once its files reopen it catches
  up and the new leader's ``AlterIsr`` adds it back;
- with no other live in-sync replica (or one replica) the coordinator refuses: the bucket stays led here and
  is asked again every ``replica.leader.failure-timeout``.

The buckets that stepped down (until back in sync), those kept for want of another replica, and the
resignations so far are reported by ``tablet/replicas/health.py`` (metrics and ``kvlease cluster status``).
:class:`StepDowns` is the pure decision; :class:`StepDown` the shell around it.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

from kvlease.common import errors
from kvlease.client.server_calls import ResignBucket
from kvlease.tablet.bucket import damage as bucket_damage
from kvlease.tablet.periodic import Periodic

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (physical id, bucket): a partition's bucket by the partition's id

#: The local failures named by their errno when a message (RocksDB's) carries only the text.
_KNOWN = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE, errno.EACCES)
MAX_REASON = 300  # characters of a failure sent to the coordinator
MAX_PER_CALL = 500  # buckets one ResignLeadership carries


def cause(exc: BaseException | None) -> str:
    """A failure's short name: ``ENOSPC: No space left on device`` for an OSError (or one it was raised from)
    or a message naming one of the usual ones; else its message's first 120 characters."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in errno.errorcode:
            return f"{errno.errorcode[seen.errno]}: {os.strerror(seen.errno)}"
        seen = seen.__cause__ or seen.__context__
    text = str(exc) if exc is not None else "unknown"
    code = next((c for c in _KNOWN if os.strerror(c) in text), None)
    return f"{errno.errorcode[code]}: {os.strerror(code)}" if code is not None else text[:120]


@dataclass
class _Streak:
    since: float  # the first failure seen
    last_failed: float  # the last time it was seen failed
    resigned_epoch: int = -1  # the leader epoch whose resignation was accepted
    retry_at: float = 0.0  # after a refusal or an error: not asked again before


class StepDowns:
    """Which led buckets should resign now (pure: the caller passes what it sees and the time)."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._streaks: dict[Key, _Streak] = {}

    def due(self, key: Key, failed_now: bool, leader_epoch: int, now: float, failed_between: bool = False) -> bool:
        """Record whether ``key`` (led at ``leader_epoch``) is failed now (its files refuse writes), or failed
        since the last look and was reopened meanwhile (``failed_between``); True if it should resign now:
        failed now (so it cannot fetch as a follower before its reopen: tablet/replication/fetcher.py), failing
        for ``after_s``, not already resigned at that epoch, and not refused less than ``after_s`` ago."""
        streak = self._streaks.get(key)
        if not (failed_now or failed_between):
            if streak is not None and now - streak.last_failed >= self.after_s:
                del self._streaks[key]  # no failure for after_s: a later one starts a new streak
            return False
        if streak is None:
            streak = self._streaks[key] = _Streak(now, now)
        streak.last_failed = now
        return (failed_now and now - streak.since >= self.after_s and streak.resigned_epoch != leader_epoch
                and now >= streak.retry_at)

    def resigned(self, key: Key, leader_epoch: int) -> None:
        """The coordinator took the resignation at ``leader_epoch``: not asked again for it."""
        if key in self._streaks:
            self._streaks[key].resigned_epoch = leader_epoch

    def refused(self, key: Key, now: float) -> None:
        """The coordinator kept the leadership here (or could not be asked): ask again after ``after_s``."""
        if key in self._streaks:
            self._streaks[key].retry_at = now + self.after_s

    def keep(self, led: set[Key]) -> None:
        """Forget the buckets no longer led (led again later, a bucket starts a new streak)."""
        for key in [k for k in self._streaks if k not in led]:
            del self._streaks[key]

    def failing(self) -> set[Key]:
        return set(self._streaks)


@dataclass(frozen=True)
class SteppedDown:
    """A bucket this server gave up leading: its table's path and the failure's short name; its table's id and
    partition's name ("": an unpartitioned table's bucket)."""

    table: str
    cause: str
    table_id: int = 0
    partition: str = ""


class StepDown(Periodic):
    """The shell: looks at the led buckets every ``interval_s`` and asks the coordinator (module docstring)."""

    name = "step-down"

    def __init__(self, server_id: int, replicas, resign, *, after_s: float, interval_s: float = 0.5,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``replicas``: the :class:`~kvlease.tablet.replicas.manager.ReplicaManager`; ``resign``: ``ServerCalls.resign_leadership``
        (one call for the buckets due in a round)."""
        super().__init__(interval_s)
        self.server_id = server_id
        self.replicas = replicas
        self.resign = resign
        self.monotonic = monotonic
        self.decisions = StepDowns(after_s)
        #: Buckets that gave their leadership up, until they are back in the ISR with working files.
        self.stepped_down: dict[Key, SteppedDown] = {}
        #: Led buckets that cannot write and keep their leadership: why the coordinator refused.
        self.kept: dict[Key, str] = {}
        self.resignations = 0  # accepted since the server started
        self._counts: dict[Key, int] = {}  # each led bucket's failure count at the last look

    def run_once(self) -> int:
        """One look at the led replicated buckets; returns how many resigned."""
        now = self.monotonic()
        led = {r.key: r for r in self.replicas.replicas() if r.replicated and r.role}
        self.decisions.keep(set(led))
        self.kept = {k: why for k, why in self.kept.items() if k in led}
        self._counts = {k: n for k, n in self._counts.items() if k in led}
        self._back_in_sync()
        due: list[tuple[Key, object, BaseException | None]] = []
        for key, replica in led.items():
            files = replica.store.files
            failure, count = files.failure, files.failure_count
            between = count != self._counts.get(key, count)
            self._counts[key] = count
            if failure is not None and bucket_damage.is_damage(failure):
                continue  # a reopen cannot cure it: reported lost instead (tablet/replicas/loss.py)
            if failure is None and not between:
                self.kept.pop(key, None)
            if self.decisions.due(key, failure is not None, replica.role.leader_epoch, now, between):
                due.append((key, replica, failure))
        return sum(self._resign(due[i:i + MAX_PER_CALL], now) for i in range(0, len(due), MAX_PER_CALL))

    def _resign(self, due: list[tuple[Key, object, BaseException | None]], now: float) -> int:
        """Ask the coordinator to move the leadership of the ``due`` buckets; returns how many moved."""
        asked = [ResignBucket(replica.table.table_id, replica.bucket, replica.role.leader_epoch,
                              str(failure)[:MAX_REASON], replica.table.partition_id) for _key, replica, failure in due]
        try:
            answers = self.resign(self.server_id, asked)
        except errors.KvLeaseError as exc:  # the coordinator is away: asked again later
            log.warning("cannot resign the leadership of %d bucket(s) whose local writes fail: %s", len(due), exc)
            for key, _replica, _failure in due:
                self.decisions.refused(key, now)
            return 0
        moved = 0
        for (key, replica, failure), (_t, _b, epoch, *_), answer in zip(due, asked, answers):
            where = replica.where
            if answer.error is not None:  # it leads at another epoch now: the push says so
                log.info("resigning the leadership of %s at leader epoch %d refused: %s", where, epoch, answer.error)
                self.decisions.refused(key, now)
                continue
            if answer.refused:  # no one else can lead it: asked again later
                if self.kept.get(key) != answer.refused:
                    log.warning("%s cannot write (%s) and keeps its leadership here: %s", where, failure,
                                answer.refused)
                self.kept[key] = answer.refused
                self.decisions.refused(key, now)
                continue
            self.decisions.resigned(key, epoch)
            self.kept.pop(key, None)
            self.stepped_down[key] = SteppedDown(replica.table.path, cause(failure), replica.table.table_id,
                                                 replica.table.partition_name or "")
            self.resignations += 1
            moved += 1
            log.warning("gave up leading %s: its local writes fail (%s); tablet server %d leads it now (leader "
                        "epoch %d)", where, failure, answer.state.leader_id, answer.state.leader_epoch)
        return moved

    def _back_in_sync(self) -> None:
        """Forget the stepped-down buckets that are back in the ISR with working files, led again, or gone."""
        if not self.stepped_down:
            return
        held = {r.key: r for r in self.replicas.all_replicas()}
        for key in list(self.stepped_down):
            replica = held.get(key)
            if (replica is None or replica.role is None or replica.leads
                    or (self.server_id in replica.role.isr and replica.store.files.failure is None)):
                del self.stepped_down[key]
