"""A tablet server's leader lease: whether the buckets it leads may answer now (docs/architecture.md,
"Leader leases").

A leader answers a read (a lookup, a scan's open, a changelog fetch, its
offsets) or acknowledges a write only while its lease is valid, checked on the
monotonic clock *after* the read, as the answer leaves: a leader paused, cut
off or too slow to hear that it was deposed answers nothing (NOT_LEADER),
however long its requests waited.

The lease is renewed by reading ZooKeeper (after a ``sync``, so the read is
not stale): the server's registration ``/tabletservers/ids/{id}`` must be
owned by its current session, the session the coordinator's last push was
built for, and ``/tabletservers/demotions/{id}`` must have the version that
push names (:class:`LeaseBasis`). A read sent at ``t`` that finds both grants
the lease until ``t + duration``, ``duration`` two thirds of the ZooKeeper
session timeout. The coordinator bumps the demotions node before it writes a
change that takes a leadership from a live server, and a new leader waits a
lease's duration after it hears of its leadership unless the old leader
took the change first (``coordinator/leader_leases.py``); a leader whose session
expired renewed its lease last at least a session timeout before, so its
successor waits for nothing. Every renewal is a round trip to ZooKeeper's
leader, so while ZooKeeper cannot be reached the lease lapses and the
server's leaders refuse (clients retry): no leader answers without knowing
that no other one can.

:class:`LeaderLease` is the state (any thread); :class:`LeaseRenewer` renews it
(a :class:`~kvlease.tablet.periodic.Periodic` round every eighth of a duration, at once
after a push changed its basis).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kvlease.common import zkpaths
from kvlease.tablet.periodic import Periodic

log = logging.getLogger(__name__)

#: The share of the ZooKeeper session timeout a lease lasts: a leader whose session expired stopped
#: answering at least a third of a session timeout before its successor starts.
LEASE_SHARE = 2 / 3


def lease_duration_ms(session_timeout_ms: int) -> int:
    return int(session_timeout_ms * LEASE_SHARE)


@dataclass(frozen=True)
class LeaseBasis:
    """What a push says the lease rests on: the ZooKeeper session of the registration the coordinator
    saw, and the version of the server's demotions node it knew."""

    session_id: int
    demotions: int


class LeaderLease:
    """The lease's state: its basis (from the coordinator's pushes) and how long it lasts (renewals)."""

    def __init__(self, duration_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.duration_s = duration_s
        self.monotonic = monotonic
        self._cond = threading.Condition()
        self._basis: LeaseBasis | None = None
        self._until = -math.inf
        #: Run when a push changed the basis (the renewer renews at once).
        self.on_basis: Callable[[], None] = lambda: None

    @classmethod
    def unbounded(cls) -> "LeaderLease":
        """A lease that is always valid: a store served without ZooKeeper (tests, tools)."""
        lease = cls(math.inf)
        lease._until = math.inf
        return lease

    @property
    def bounded(self) -> bool:
        return self.duration_s != math.inf

    @property
    def basis(self) -> LeaseBasis | None:
        return self._basis

    def take(self, basis: LeaseBasis) -> None:
        """A push's basis. The lease granted so far stands (a change since the read that granted it bumped
        the demotions version, so that read preceded it); renewals must find the new one. A push for another
        ZooKeeper session ends it (nothing granted in the old session counts in the new one)."""
        if not self.bounded:
            return
        with self._cond:
            if basis == self._basis:
                return
            if self._basis is not None and basis.session_id != self._basis.session_id:
                self._until = -math.inf
            self._basis = basis
        self.on_basis()

    def renewed(self, sent_at: float, seen: LeaseBasis) -> bool:
        """A renewal read sent at ``sent_at`` (monotonic) found ``seen``: the lease lasts until ``sent_at +
        duration`` if it is the basis. Returns whether it was."""
        with self._cond:
            if self._basis is None or seen != self._basis:
                return False
            self._until = max(self._until, sent_at + self.duration_s)
            self._cond.notify_all()
            return True

    def valid(self) -> bool:
        return self.monotonic() < self._until

    def remaining_s(self) -> float:
        return self._until - self.monotonic()

    def wait_valid(self, timeout_s: float) -> bool:
        """Whether the lease is valid, waiting up to ``timeout_s`` for a renewal if it is not."""
        if self.valid():
            return True
        deadline = self.monotonic() + timeout_s
        with self._cond:
            while not self.valid():
                remaining = deadline - self.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True


class LeaseRenewer(Periodic):
    """Renews a :class:`LeaderLease` from ZooKeeper (see the module docstring)."""

    name = "leader-lease"

    def __init__(self, lease: LeaderLease, zk, server_id: int) -> None:
        super().__init__(lease.duration_s / 8)
        self.lease = lease
        self.zk = zk
        self.registration = zkpaths.tablet_server(server_id)
        self.demotions = zkpaths.tablet_demotions(server_id)
        self._was_renewed = True
        lease.on_basis = self.wake

    def run_once(self) -> int:
        """One renewal read; returns 1 if it renewed the lease."""
        if self.lease.basis is None:
            return 0
        sent_at = self.lease.monotonic()
        client_id = self.zk.client_id
        if client_id is None:
            return self._note(False, "no ZooKeeper session")
        timeout = self.lease.duration_s
        try:
            self.zk.sync_async(self.demotions)
            got = self.zk.get_async(self.demotions)
            registered = self.zk.exists_async(self.registration)
            version = got.get(timeout=timeout)[1].version
            stat = registered.get(timeout=timeout)
        except Exception as exc:  # connection loss, no node, timeout: not renewed
            return self._note(False, f"cannot read ZooKeeper: {exc!r}")
        if self.zk.client_id != client_id:
            return self._note(False, "the ZooKeeper session changed during the read")
        owner = stat.ephemeralOwner if stat is not None else None
        seen = LeaseBasis(client_id[0] if owner == client_id[0] else -1, version)
        if self.lease.renewed(sent_at, seen):
            return self._note(True)
        return self._note(False, f"ZooKeeper says {seen}, the last push {self.lease.basis}")

    def _note(self, renewed: bool, why: str = "") -> int:
        if renewed != self._was_renewed:
            if renewed:
                log.info("leader lease renewed")
            else:
                log.warning("leader lease not renewed: %s", why)
            self._was_renewed = renewed
        return int(renewed)
