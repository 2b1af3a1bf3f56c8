"""The tablet servers being retired: they take no new replicas until an operator says otherwise.

``cluster decommission --tablet N`` marks N (``/decommissioned/{N}``, persistent,
written fenced in the same multi-op as the first moves it starts) and
``cluster recommission --tablet N`` deletes the mark. A marked server keeps
what it holds until moved off it, but no placement chooses it: a new table's
replicas (:meth:`kvlease.coordinator.membership.Membership.plan_table`), an unassigned
one-replica bucket (:func:`kvlease.coordinator.election_plan.servers_changed`), a
rebalance's or another decommission's destinations
(:mod:`kvlease.coordinator.rebalance_plan`), a reassign's new replicas. The mark is by
server id, so it outlives the server's registration (a restart, a new data
dir) and a coordinator failover (:meth:`Decommissioned.load`).
"""

from __future__ import annotations

from kazoo.client import KazooClient

from kvlease.common import zkpaths
from kvlease.common.zk import ZkOp, dumps


class Decommissioned:
    def __init__(self) -> None:
        self.ids: set[int] = set()  # the servers marked

    def __contains__(self, server_id: int) -> bool:
        return server_id in self.ids

    def load(self, zk: KazooClient) -> None:
        """A coordinator taking over: the marks stored."""
        zk.ensure_path(zkpaths.DECOMMISSIONED)
        self.ids = {int(n) for n in zk.get_children(zkpaths.DECOMMISSIONED) if n.isdigit()}

    def mark_ops(self, server_id: int) -> list[ZkOp]:
        """The write that marks ``server_id`` (none if it is marked already)."""
        if server_id in self.ids:
            return []
        return [ZkOp("create", zkpaths.decommissioned(server_id), dumps({"tablet_id": server_id}))]

    def clear_ops(self, server_id: int) -> list[ZkOp]:
        """The write that clears ``server_id``'s mark (none if it has none)."""
        return [ZkOp("delete", zkpaths.decommissioned(server_id))] if server_id in self.ids else []

    def marked(self, server_id: int) -> None:
        """Apply what :meth:`mark_ops` wrote."""
        self.ids.add(server_id)

    def cleared(self, server_id: int) -> None:
        """Apply what :meth:`clear_ops` wrote."""
        self.ids.discard(server_id)
