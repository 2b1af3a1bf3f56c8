"""The coordinator's side of leader leases: when a new leader may serve (docs/architecture.md, "Leader leases").

A tablet server answers for the buckets it leads only while its leader lease
is valid (``tablet/replication/leader_lease.py``): a renewal reads ZooKeeper and finds the
server's registration (by the session the coordinator's last push named) and
its demotions node ``/tabletservers/demotions/{id}`` at the version the push
named. So before a write that takes a leadership from a *live* server the
coordinator bumps that node (:meth:`LeaderLeases.bump_ops`): the old leader's
lease then lasts at most its duration (``lease_ms``, from its registration)
past the bump, and the new leader is told to wait that long after it hears of
its leadership (``lease_wait_ms`` of its push) — unless the old leader took a
push built after the change first (:meth:`LeaderLeases.delivered`): it has let
go, and the new leader is told again, with no wait. A leader that is not live
(its registration gone: its session expired, which happens a session timeout
after its last renewal, longer than a lease; or it stopped, after its RPC
server did) leaves nothing to wait for.

A new active coordinator does not know the changes its predecessor made
(fenced now, so all made before it took over): a bucket that existed when it
took over waits until one lease's duration after that, if it gets a new
leader before then.

:class:`LeaderLeases` is pure: no ZooKeeper, the monotonic clock is passed in.
:class:`ServerLease` is what one server's lease rests on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from kvlease.common import zkpaths
from kvlease.common.zk import ZkOp

Key = tuple[int, int]  # (table id, bucket)


@dataclass(frozen=True)
class ServerLease:
    """What a live server's lease rests on: its registration's ZooKeeper session, the version of its
    demotions node, and how long a renewal of its lease lasts."""

    session_id: int
    demotions: int
    lease_ms: int


@dataclass(frozen=True)
class PushLease:
    """What a push tells a server of its lease: its basis (``session_id``, ``demotions``; None: unknown, no
    lease kept), how long the new leader of each bucket waits (``waits``: (table id, bucket) -> ms), and the
    push's number (``seq``: :meth:`LeaderLeases.delivered`)."""

    session_id: int | None
    demotions: int
    waits: dict
    seq: int


@dataclass(frozen=True)
class _Handover:
    """An earlier leader of a bucket that may still hold its lease: until ``until`` (monotonic s), or until a
    push built after ``seq`` reached it."""

    server: int
    until: float
    seq: int


@dataclass
class LeaderLeases:
    default_lease_ms: int
    monotonic: Callable[[], float] = time.monotonic
    #: live servers: what their leases rest on
    servers: dict[int, ServerLease] = field(default_factory=dict)
    #: buckets whose earlier leaders may still be leased
    _pending: dict[Key, list[_Handover]] = field(default_factory=dict)
    #: pushes built so far (each push carries the number it was built at)
    seq: int = 0
    _took_over_at: float = float("-inf")
    _floor_tables: frozenset[int] = frozenset()
    _longest_ms: int = 0  # the longest lease of any server seen

    def took_over(self, table_ids: Iterable[int]) -> None:
        """This coordinator became active holding ``table_ids``: their buckets may have leaders a deposed
        coordinator demoted whose leases still last (see the module docstring)."""
        self._took_over_at = self.monotonic()
        self._floor_tables = frozenset(table_ids)

    def servers_seen(self, servers: dict[int, ServerLease]) -> None:
        """The live servers now (their registrations read again)."""
        self.servers = dict(servers)
        self._longest_ms = max([self._longest_ms, *(s.lease_ms for s in servers.values())])

    def lease_ms(self, server: int) -> int:
        known = self.servers.get(server)
        return known.lease_ms if known is not None else self.default_lease_ms

    def bump_ops(self, demoted: Iterable[int]) -> list[ZkOp]:
        """The writes that end the leases of the live ``demoted`` servers (each loses a leadership)."""
        return [ZkOp("set", zkpaths.tablet_demotions(s)) for s in sorted(set(demoted)) if s in self.servers]

    def bumped(self, demoted: Iterable[int], keys: Iterable[tuple[Key, int]]) -> None:
        """The :meth:`bump_ops` of ``demoted`` were written; ``keys``: (bucket, the live server that led it)
        of the changes about to be written: their new leaders wait (see :meth:`wait_ms`)."""
        for server in set(demoted):
            lease = self.servers.get(server)
            if lease is not None:
                self.servers[server] = ServerLease(lease.session_id, lease.demotions + 1, lease.lease_ms)
        now = self.monotonic()
        for key, server in keys:
            if server in self.servers:
                self._pending.setdefault(key, []).append(_Handover(server, now + self.lease_ms(server) / 1000.0,
                                                                   self.seq))

    def push_for(self, server: int, led: Iterable[Key]) -> PushLease:
        """The lease part of a push being built for ``server``, which leads ``led``."""
        self.seq += 1
        lease = self.servers.get(server)
        return PushLease(None if lease is None else lease.session_id, 0 if lease is None else lease.demotions,
                         {key: self.wait_ms(key) for key in led}, self.seq)

    def wait_ms(self, key: Key) -> int:
        """How long a leader of ``key`` told now waits before it serves a leadership new to it."""
        now = self.monotonic()
        floor = self._took_over_at + max(self._longest_ms, self.default_lease_ms) / 1000.0
        until = floor if key[0] in self._floor_tables else 0.0
        handovers = [h for h in self._pending.get(key, ()) if h.until > now]
        if handovers:
            self._pending[key] = handovers
            until = max(until, *(h.until for h in handovers))
        else:
            self._pending.pop(key, None)
        return max(0, int((until - now) * 1000) + 1) if until > now else 0

    def delivered(self, server: int, seq: int) -> list[Key]:
        """``server`` took push ``seq``: it no longer leads what it lost before that push was built. Returns
        the buckets whose new leaders may serve sooner now (tell them again)."""
        sooner = []
        for key, handovers in list(self._pending.items()):
            kept = [h for h in handovers if h.server != server or h.seq >= seq]
            if len(kept) != len(handovers):
                sooner.append(key)
                if kept:
                    self._pending[key] = kept
                else:
                    del self._pending[key]
        return sorted(sooner)

    def forget_table(self, table_id: int) -> None:
        for key in [k for k in self._pending if k[0] == table_id]:
            del self._pending[key]
