"""Tablet servers and bucket leaders: who is live, who leads what, and telling them.

The live servers come from ``/tabletservers/ids`` (ephemeral nodes; a
restarted server has a new incarnation), each with its capacity
(``max_buckets``): a new table's buckets go only to servers with room, and a
create whose buckets do not fit is refused before anything is written. Leadership plans are the pure
:class:`~coordinator.assignment.Assignments`'; they are written to ZooKeeper
(epoch-fenced) before they are applied, then pushed to the servers concerned.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from common import errors, zkpaths
from common.tables import TableInfo
from common.zk import ZkOp, loads
from coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment
from coordinator.catalog import TableCatalog
from coordinator.fencing import FencedWriter, chunks

log = logging.getLogger(__name__)

#: notify(server_id, address, [(table, bucket, leader_epoch)], dropped_table_ids): push leadership
Notify = Callable[[int, str, list, list], None]


class Membership:
    def __init__(self, zk: KazooClient, catalog: TableCatalog, notify: Notify | None = None) -> None:
        self.zk = zk
        self.catalog = catalog
        self.notify = notify
        self.assignments = Assignments()
        self.servers: dict[int, str] = {}  # live tablet servers: id -> address
        self._incarnations: dict[int, tuple[str, str]] = {}
        self.capacity: dict[int, int | None] = {}  # live servers: id -> max_buckets (None: not registered)
        self.writer: FencedWriter | None = None

    def load(self) -> None:
        """Failover: load the assignments of the catalog's tables; plan those that have none."""
        for table_id in self.assignments.load(self.zk, sorted(self.catalog.by_id)):
            plan = self.assignments.plan_new(self.catalog.by_id[table_id].buckets, [])
            self.writer.commit([self.assignments.create_op(table_id, plan)])
            self.assignments.set(table_id, plan)

    # -- tables coming and going (their catalog writes carry these ops) ------------------------

    def plan_table(self, table: TableInfo) -> tuple[dict[int, BucketAssignment], ZkOp]:
        """Leaders for a new table's buckets, and the op that stores them. InvalidRequestError if
        the live tablet servers have no room for them all (with none live, they wait unassigned)."""
        live = sorted(self.servers)
        room = self.assignments.room(live, self.capacity)
        if live and None not in room.values() and sum(room.values()) < table.buckets:
            load = self.assignments.load_per_server()
            full = ", ".join(f"tablet server {s} leads {load[s]} of {self.capacity[s]}" for s in live)
            raise errors.InvalidRequestError(
                f"cannot create table {table.path}: its {table.buckets} bucket(s) do not fit on the live tablet "
                f"servers ({sum(room.values())} free; {full} buckets, their capacity tablet.buckets.max); add "
                f"tablet servers, raise their tablet.buckets.max or drop tables", table=table.path)
        plan = self.assignments.plan_new(table.buckets, live, self.capacity)
        return plan, self.assignments.create_op(table.table_id, plan)

    def table_created(self, table: TableInfo, plan: dict[int, BucketAssignment]) -> None:
        self.assignments.set(table.table_id, plan)
        self.push(self.assignments.leaders_of(table.table_id))

    def drop_ops(self, table_id: int) -> list[ZkOp]:
        return [self.assignments.delete_op(table_id)] if table_id in self.assignments.by_table else []

    def table_dropped(self, table_id: int, leaders: set[int]) -> None:
        self.assignments.remove(table_id)
        self.push(leaders, dropped=[table_id])

    # -- tablet servers -------------------------------------------------------------------

    def read_servers(self) -> dict[int, tuple[str, str, int | None]]:
        """Live servers: id -> (address, incarnation, max_buckets); a restarted server has a new
        incarnation; max_buckets is None for a server that registered none."""
        try:
            ids = self.zk.get_children(zkpaths.TABLET_SERVERS)
        except NoNodeError:
            return {}
        servers = {}
        for name, result in [(n, self.zk.get_async(zkpaths.tablet_server(n))) for n in ids if n.isdigit()]:
            try:
                node = loads(result.get()[0])
            except NoNodeError:
                continue
            capacity = node.get("max_buckets")
            servers[int(name)] = (node["address"], str(node.get("incarnation", "")),
                                  capacity if isinstance(capacity, int) and capacity >= 0 else None)
        return servers

    def servers_changed(self, servers: Mapping[int, str | tuple]) -> None:
        """``servers``: id -> address, (address, incarnation) or (address, incarnation, max_buckets)."""
        seen = {sid: (v, "", None) if isinstance(v, str) else (*v, None)[:3] for sid, v in servers.items()}
        joined = {sid for sid, v in seen.items() if self._incarnations.get(sid) != v[:2]}
        left = set(self.servers) - set(seen)
        self._incarnations = {sid: v[:2] for sid, v in seen.items()}
        self.capacity = {sid: v[2] for sid, v in seen.items()}
        self.servers = {sid: v[0] for sid, v in seen.items()}
        if left:
            log.warning("tablet servers gone: %s (their buckets are unavailable until they return)", sorted(left))
        changes = self.assignments.plan_servers_joined(joined, sorted(servers), self.capacity)
        failure = self._store_changes(changes)
        touched = set(joined)
        for plan in changes.values():
            touched |= {a.leader for a in plan.values() if a.leader != UNASSIGNED}
        self.push(touched)
        if failure is not None:
            raise failure

    def _store_changes(self, changes: dict[int, dict[int, BucketAssignment]]) -> Exception | None:
        """Write the changed assignments (a server with thousands of tables rejoining changes them all:
        in as many fenced multi-ops as ZooKeeper's write limit needs), then apply those written.
        Returns the first write's error, if any (raises Fenced and OutcomeUnknownError)."""
        ops = [self.assignments.set_op(t, plan) for t, plan in sorted(changes.items())]
        table_of = dict(zip((op.path for op in ops), sorted(changes)))
        batches = chunks(ops)
        failure = None
        for batch, outcome in zip(batches, self.writer.commit_many(batches) if batches else []):
            if outcome is not None:
                failure = failure or outcome
                continue
            for op in batch:
                self.assignments.set(table_of[op.path], changes[table_of[op.path]])
        return failure

    def push_all(self) -> None:
        """Tell every live tablet server what it leads (after becoming active)."""
        self.push(set(self.servers))

    def push(self, server_ids: Iterable[int], dropped: list[int] | None = None) -> None:
        if self.notify is None:
            return
        for server_id in sorted(server_ids):
            address = self.servers.get(server_id)
            if address is None:
                continue
            led = [(self.catalog.by_id[t], b, a.leader_epoch) for t, b, a in self.assignments.led_by(server_id)
                   if t in self.catalog.by_id]
            self.notify(server_id, address, led, list(dropped or []))

    # -- queries --------------------------------------------------------------------------

    def assignment_rows(self, table: TableInfo) -> tuple[TableInfo, list[tuple[int, int, str, int]]]:
        rows = [(bucket, a.leader, self.servers.get(a.leader, ""), a.leader_epoch)
                for bucket, a in sorted(self.assignments.table(table.table_id).items())]
        return table, rows

    def server_rows(self) -> list[tuple[int, str, int]]:
        load = self.assignments.load_per_server()
        return [(sid, address, load[sid]) for sid, address in sorted(self.servers.items())]
