"""Which incarnation of each tablet server the active coordinator last saw registered, kept across failovers.

A tablet server that registers anew (a new process, or a new ZooKeeper session) is *joined*, and one the
coordinator knew is *restarted* too (:meth:`kvlease.coordinator.membership.Membership.servers_changed`): its
leaderships end, and a one-replica bucket it leads gets a new leader epoch, so that change feeds see
offsets that a crash may have reused. A new active coordinator reads what its predecessor last saw here
(``/tabletservers/seen``: ``{server id: [address, incarnation, session id]}``, written fenced in the same
multi-op as the changes it causes): the servers still registered as they were are neither, and their buckets
keep their leaders and epochs, so they serve on through a coordinator failover without waiting (a new
leader epoch would make each wait out a leader lease). A server that restarted while no coordinator was
active is seen as restarted, as a live coordinator would have seen it.
"""

from __future__ import annotations

from typing import Any, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import zkpaths
from kvlease.common.zk import ZkOp, dumps, loads

#: A server's identity: (address, incarnation, ZooKeeper session id or None).
Identity = tuple[Any, ...]


class SeenServers:
    def __init__(self) -> None:
        #: server id -> the identity recorded (what the last active coordinator saw registered).
        self.recorded: dict[int, Identity] = {}
        self._exists = False

    def load(self, zk: KazooClient) -> dict[int, Identity]:
        """Read what the previous active coordinator saw (none recorded: an empty map)."""
        try:
            data = loads(zk.get(zkpaths.TABLET_SEEN)[0]) or {}
            self._exists = True
        except NoNodeError:
            data, self._exists = {}, False
        self.recorded = {int(sid): tuple(identity) for sid, identity in data.items()}
        return dict(self.recorded)

    def ops(self, seen: Mapping[int, Identity]) -> list[ZkOp]:
        """The write that records ``seen`` (none if it is what is recorded)."""
        if dict(seen) == self.recorded and self._exists:
            return []
        data = dumps({str(sid): list(identity) for sid, identity in sorted(seen.items())})
        return [ZkOp("set" if self._exists else "create", zkpaths.TABLET_SEEN, data)]

    def written(self, seen: Mapping[int, Identity]) -> None:
        """Apply what :meth:`ops` wrote."""
        self.recorded, self._exists = dict(seen), True
