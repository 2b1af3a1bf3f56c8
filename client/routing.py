"""Where each bucket of a table is led: the bucket router the table client and the scanners share.

:class:`BucketRouter` caches the table and the leader of every bucket, as the
coordinator's admin client reports them, and hands out stubs of the leaders'
tablet servers. A call that meets ``NOT_LEADER``, ``FENCED_LEADER_EPOCH`` (it
routed by a leader epoch older than the bucket's), ``LEADER_NOT_AVAILABLE`` or
an unreachable server marks the routing it used stale (:meth:`BucketRouter.stale`);
the next :meth:`~BucketRouter.routing` fetches it again. A routing is
versioned, so a caller that read an old one cannot mark a newer one stale.

:class:`BucketRoute` is one bucket's view of a router (what a scanner
needs); :class:`FixedRoute` sends every call to one stub (tests, tools that
already know the leader).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from kvlease.common import errors
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.common.tables import TableInfo
from kvlease.client.scan_wire import TabletStub
from kvlease.client.transport import Channels, is_int

#: The answers of a server that is not (or no longer) the bucket's leader: the leader changed.
LEADER_CHANGED = (errors.NotLeaderError, errors.FencedLeaderEpochError)
#: Errors after which the cached assignment is fetched again before the next attempt.
REROUTE = (*LEADER_CHANGED, errors.LeaderNotAvailableError, errors.NetworkError)


@dataclass(frozen=True)
class Routing:
    """One fetched assignment: the table and ``bucket -> client.admin.BucketLeader``."""

    generation: int
    table: TableInfo
    leaders: dict
    fetched_at: float = field(default_factory=time.monotonic)


class BucketRouter:
    """The leaders of one table's buckets; thread-safe."""

    def __init__(self, admin, table_id: int, partition_id: int | None = None, channels: Channels | None = None,
                 lookup_ports: bool = True) -> None:
        """``admin`` is a :class:`kvlease.client.admin.AdminClient` (anything with ``get_table_assignment``);
        ``partition_id``: the buckets of that partition of a partitioned table; ``lookup_ports``: lookups may go
        to the servers' lookup ports (client/lookup_port.py)."""
        self.admin = admin
        self.channels = channels or Channels(tls=getattr(admin, "tls", None),  # as secure as the admin's
                                             credentials=getattr(admin, "credentials", None), lookup_ports=lookup_ports)
        self._lock = threading.Lock()
        self._fetching = threading.Lock()  # one fetch at a time for calls that watch their leader
        self._generation = 0
        self.partition_id = partition_id
        self._current = self._fetch(table_id)

    @property
    def table(self) -> TableInfo:
        return self._current.table

    def _fetch(self, table_id: int) -> Routing:
        table, leaders = (self.admin.get_table_assignment(table_id) if self.partition_id is None
                          else self.admin.get_table_assignment(table_id, self.partition_id))
        with self._lock:
            self._generation += 1
            self._stale = False
            self._current = Routing(self._generation, table, leaders)
            return self._current

    def refresh(self) -> Routing:
        """Fetch the assignment again now."""
        return self._fetch(self.table.table_id)

    def routing(self) -> Routing:
        """The cached assignment, fetched again first if a call marked it stale."""
        with self._lock:
            current, stale = self._current, self._stale
        return self._fetch(current.table.table_id) if stale else current

    def moved(self, address: str, buckets: Iterable[int], max_age_s: float = 0.5) -> bool:
        """Whether the coordinator now names a live leader other than ``address`` for any of ``buckets``: the
        assignment is fetched again unless a fetch is younger than ``max_age_s`` (calls waiting on a leader
        share it, client/leader_watch.py). A coordinator that cannot answer says nothing moved."""
        with self._fetching:
            current = self._current
            if time.monotonic() - current.fetched_at >= max_age_s:
                try:
                    current = self._fetch(current.table.table_id)
                except errors.KvLeaseError:
                    return False
        for bucket in buckets:
            leader = current.leaders.get(bucket)
            if leader is not None and leader.leader_address and leader.leader_address != address:
                return True
        return False

    def stale(self, routing: Routing) -> None:
        """A call routed by ``routing`` found it out of date: fetch again before the next call."""
        with self._lock:
            if self._current.generation == routing.generation:
                self._stale = True

    def leader(self, routing: Routing, bucket: int) -> str:
        """The address of ``bucket``'s leader; LeaderNotAvailableError (and stale) when it has none."""
        leader = routing.leaders.get(bucket)
        if leader is None or not leader.leader_address:
            self.stale(routing)
            why = _why_no_leader(leader)
            raise errors.LeaderNotAvailableError(f"bucket {bucket} of {routing.table.where}: {why}", bucket=bucket)
        return leader.leader_address

    def leader_epoch(self, routing: Routing, bucket: int) -> int | None:
        """The leader epoch ``routing`` gives ``bucket`` (None: no leader in it): what a write routed by
        it carries, so that a leader deposed since refuses it (FENCED_LEADER_EPOCH) instead of writing."""
        leader = routing.leaders.get(bucket)
        return None if leader is None else leader.leader_epoch

    def by_leader(self, routing: Routing, buckets: Iterable[int]) -> dict[str, list[int]]:
        """``{leader address: [buckets]}`` for ``buckets``, each list sorted."""
        groups: dict[str, list[int]] = {}
        for bucket in sorted(buckets):
            groups.setdefault(self.leader(routing, bucket), []).append(bucket)
        return groups

    def stub(self, address: str) -> pb_grpc.TabletServiceStub:
        return self.channels.stub(address, TabletStub)  # scans answer their records uncopied (client/scan_wire.py)

    def leaders(self) -> dict[int, str]:
        """``bucket -> leader address`` as cached ('' while a leader is not live)."""
        return {b: leader.leader_address for b, leader in sorted(self._current.leaders.items())}

    def check_bucket(self, bucket: int) -> None:
        table = self.table
        if not is_int(bucket) or not 0 <= bucket < table.buckets:
            raise errors.BucketOutOfRangeError(f"{table.where} has buckets 0..{table.buckets - 1}, "
                                               f"not {errors.show(bucket)}")

    def route(self, bucket: int) -> "BucketRoute":
        return BucketRoute(self, bucket)


def _servers(ids) -> str:
    ids = list(ids)
    return f"tablet server {ids[0]}" if len(ids) == 1 else f"tablet servers {', '.join(map(str, ids))}"


def _why_no_leader(leader) -> str:
    """Why a bucket (a :class:`kvlease.client.admin.BucketLeader`, None: not in the assignment) has no live leader, as
    the coordinator's assignment tells it (docs/architecture.md, "Replication")."""
    if leader is not None and leader.offline_reason:
        return (f"offline: {leader.offline_reason}; an operator brings it back with `kvlease bucket restore "
                "--accept-data-loss` (or `kvlease bucket elect --unclean`)")
    if leader is not None and leader.leader_id < 0 and leader.isr:
        # its in-sync replicas are all gone: the ISR is kept, and the first of them to return leads
        others = [r for r in leader.replicas if r not in leader.isr]
        one = len(leader.isr) == 1
        why = (f"offline: it waits for its last in-sync replica{'' if one else 's'}, {_servers(leader.isr)}, to "
               f"come back (start {'it' if one else 'one of them'})")
        if others:
            why += (f"; {_servers(others)} {'is' if len(others) == 1 else 'are'} not in sync: "
                    f"`kvlease bucket elect --unclean` lets {'it' if len(others) == 1 else 'one of them'} lead, "
                    f"losing the changes only {_servers(leader.isr)} {'has' if one else 'have'}")
        return why
    if leader is None or leader.leader_id < 0:
        return ("no leader assigned (no tablet server with room to lead it is live: start one, and it takes "
                "the bucket when it registers)")
    return f"its leader, tablet server {leader.leader_id}, is not live"


class BucketRoute:
    """One bucket's leader, through a :class:`BucketRouter` (refreshed on demand)."""

    def __init__(self, router: BucketRouter, bucket: int) -> None:
        self.router = router
        self.bucket = bucket
        self._routing: Routing | None = None

    def leader(self) -> tuple[str, Any]:
        """``(address, stub)`` of the bucket's leader; raises LeaderNotAvailableError when it has none."""
        self._routing = self.router.routing()
        address = self.router.leader(self._routing, self.bucket)
        return address, self.router.stub(address)

    def stale(self) -> None:
        """The leader answered NOT_LEADER or could not be reached: fetch the assignment again next time."""
        if self._routing is not None:
            self.router.stale(self._routing)

    def moved_from(self, address: str) -> bool:
        """Whether the bucket is now led by a live server other than ``address`` (the assignment is
        fetched again to tell): a session on ``address`` is then gone for good, however long it is retried."""
        self.stale()
        try:
            return self.leader()[0] != address
        except errors.LeaderNotAvailableError:
            return False  # no live leader yet: nothing says the session's server is not coming back


class FixedRoute:
    """One stub for every call (tests, tools that already know the leader)."""

    def __init__(self, stub, address: str = "stub") -> None:
        self.stub = stub
        self.address = address

    def leader(self) -> tuple[str, Any]:
        return self.address, self.stub

    def stale(self) -> None:
        pass

    def moved_from(self, address: str) -> bool:
        return False
