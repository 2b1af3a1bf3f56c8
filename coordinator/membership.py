"""Tablet servers and bucket replicas: who is live, who holds and leads what, and telling them.

The live servers come from ``/tabletservers/ids`` (ephemeral nodes; a
restarted server has a new incarnation), each with its capacity
(``max_buckets``): a new table's replicas go only to servers with room, and a
create whose replicas do not fit is refused before anything is written.
Plans are pure (:mod:`kvlease.coordinator.placement_plan`, :mod:`kvlease.coordinator.election_plan`);
they are written to ZooKeeper (epoch-fenced) before they are applied, then
every live replica of a changed bucket is told the full list of buckets it
holds (:mod:`kvlease.coordinator.notifier`). A decommissioned server
(:mod:`kvlease.coordinator.decommissioned`) is live but takes no new replica.

The table ids here are physical ids (common/tables.py): an unpartitioned
table's, or one partition's; :attr:`TableCatalog.physical` maps them to the
(partition's view of the) table.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import errors, zkpaths
from kvlease.common.tables import TableInfo
from kvlease.common.zk import ZkOp, loads
from kvlease.coordinator import data_loss_plan, election_plan
from kvlease.coordinator.assignment import UNASSIGNED, Assignments, BucketAssignment, Changes
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.data_dirs import DataDirs
from kvlease.coordinator.decommissioned import Decommissioned
from kvlease.coordinator.fencing import FencedWriter, chunks
from kvlease.coordinator.leader_leases import LeaderLeases, ServerLease
from kvlease.coordinator.placement_plan import plan_new
from kvlease.coordinator.reassignment_plan import removed_replicas
from kvlease.coordinator.seen_servers import SeenServers

log = logging.getLogger(__name__)

#: notify(server_id, address, [(table, bucket, state, leader_address)], dropped_table_ids, removed, dir_id, lease=):
#: the full list of buckets the server holds a replica of (led or followed); ``removed``: the buckets a completed
#: move took off it, the same way (it deletes its copy); ``dir_id``: the data dir id recorded for it; ``lease``: a
#: :class:`~kvlease.coordinator.leader_leases.PushLease`
Notify = Callable[..., None]


class Membership:
    def __init__(self, zk: KazooClient, catalog: TableCatalog, notify: Notify | None = None, *,
                 unclean_election: bool = False, metrics=None, leader_lease_ms: int = 4000) -> None:
        """``leader_lease_ms``: how long a tablet server's leader lease lasts when its registration does not
        say (coordinator/leader_leases.py)."""
        self.zk = zk
        self.catalog = catalog
        self.notify = notify
        self.unclean_election = unclean_election
        self.metrics = metrics  # coordinator.metrics.CoordinatorMetrics, or None
        self.assignments = Assignments()
        self.servers: dict[int, str] = {}  # live tablet servers: id -> address
        self._incarnations: dict[int, tuple] = {}  # live servers: id -> identity (coordinator/seen_servers.py)
        self.seen = SeenServers()  # the identities recorded, for the next active coordinator
        self._told_all = True
        self.capacity: dict[int, int | None] = {}  # live servers: id -> max_buckets (None: not registered)
        self.writer: FencedWriter | None = None
        #: Run after every change written (the changed table ids; None: any table, after servers changed): the
        #: replica moves that can complete then do (coordinator.moves.Moves.progress).
        self.on_changed: Callable[[Iterable[int] | None], None] = lambda table_ids: None
        self.dirs = DataDirs()  # the data dir each server id registered with (a new one: its data is lost)
        self.decommissioned = Decommissioned()  # the servers that take no new replica
        #: When a new leader may serve: the leases of the leaders it replaces (coordinator/leader_leases.py).
        self.leader_leases = LeaderLeases(leader_lease_ms)
        self._undelivered: set[int] = set()  # servers a push did not reach (pushed again: repush)

    def load(self) -> None:
        """Failover: load the assignments of the catalog's tables; plan those that have none."""
        self.dirs.load(self.zk)
        self._incarnations = self.seen.load(self.zk)  # registered as then: not restarted, their leaders serve on
        self._told_all = False  # the first servers_changed after taking over tells every live server
        self.decommissioned.load(self.zk)
        for table_id in self.assignments.load(self.zk, sorted(self.catalog.physical)):
            plan = plan_new(self.assignments, self.catalog.physical[table_id].buckets, [])
            self.writer.commit([self.assignments.create_op(table_id, plan)])
            self.assignments.set(table_id, plan)
        self.leader_leases.took_over(self.assignments.by_table)
        self.refresh_metrics()

    @property
    def placeable(self) -> set[int]:
        """The live servers that take new replicas (not decommissioned)."""
        return set(self.servers) - self.decommissioned.ids

    # -- tables coming and going (their catalog writes carry these ops) ------------------------

    def check_placeable(self, table: TableInfo) -> list[int]:
        """The live servers taking new replicas; InvalidRequestError if they are fewer than the table's
        replication factor (a partitioned table's partitions could never be placed)."""
        live = sorted(self.placeable)
        retired = sorted(set(self.servers) - set(live))
        rf = table.replication_factor
        if (rf > 1 or retired) and rf > len(live):
            but = (f" taking new replicas (tablet server(s) {retired} are decommissioned: `kvlease cluster "
                   f"recommission --tablet ID` lets one take replicas again)" if retired else "")
            raise errors.InvalidRequestError(
                f"cannot create {self._what(table)}: replication factor {rf} is more than the {len(live)} live "
                f"tablet server(s){but}; start more tablet servers or use a smaller --replication-factor",
                table=table.path)
        return live

    @staticmethod
    def _what(table: TableInfo) -> str:
        if table.partition_name is None:
            return f"table {table.path}"
        return f"partition {table.partition_name} of table {table.path}"

    def plan_table(self, table: TableInfo) -> tuple[dict[int, BucketAssignment], ZkOp]:
        """Replicas and leaders for a new table's buckets, and the op that stores them. InvalidRequestError
        if there are fewer live tablet servers than its replication factor, or they have no room for all
        its replicas (with none live, a one-replica table's buckets wait unassigned). Decommissioned servers
        do not count: the error names them."""
        live = self.check_placeable(table)
        rf = table.replication_factor
        room = self.assignments.room(live, self.capacity)
        if live and None not in room.values() and sum(room.values()) < table.buckets * rf:
            load = self.assignments.load_per_server()
            full = ", ".join(f"tablet server {s} leads {load[s]} of {self.capacity[s]}" for s in live)
            raise errors.InvalidRequestError(
                f"cannot create {self._what(table)}: its {table.buckets} bucket(s) x {rf} replica(s) do not fit on "
                f"the live tablet servers ({sum(room.values())} free; {full} buckets, their capacity "
                f"tablet.buckets.max); add tablet servers, raise their tablet.buckets.max or drop tables",
                table=table.path)
        try:
            plan = plan_new(self.assignments, table.buckets, live, self.capacity, rf)
        except errors.InvalidRequestError as exc:
            raise errors.InvalidRequestError(f"cannot create {self._what(table)}: {exc.message}",
                                             table=table.path) from None
        return plan, self.assignments.create_op(table.physical_id, plan)

    def table_created(self, table: TableInfo, plan: dict[int, BucketAssignment]) -> None:
        self.assignments.set(table.physical_id, plan)
        self.push(self.assignments.holders_of(table.physical_id))
        self.refresh_metrics()

    def drop_ops(self, table_id: int) -> list[ZkOp]:
        return [self.assignments.delete_op(table_id)] if table_id in self.assignments.by_table else []

    def table_dropped(self, table_id: int, holders: set[int]) -> None:
        self.assignments.remove(table_id)
        self.leader_leases.forget_table(table_id)
        self.push(holders, dropped=[table_id])
        self.refresh_metrics()

    # -- tablet servers -------------------------------------------------------------------

    def read_servers(self) -> dict[int, tuple[str, str, int | None, str, ServerLease]]:
        """Live servers: id -> (address, incarnation, max_buckets, dir_id, lease); a restarted server has a new
        incarnation; max_buckets is None for a server that registered none, dir_id "" likewise; ``lease``: its
        registration's session, its demotions node's version (the node is made if missing) and its lease's
        duration (coordinator/leader_leases.py)."""
        try:
            ids = [n for n in self.zk.get_children(zkpaths.TABLET_SERVERS) if n.isdigit()]
        except NoNodeError:
            return {}
        reads = [(n, self.zk.get_async(zkpaths.tablet_server(n)), self.zk.get_async(zkpaths.tablet_demotions(n)))
                 for n in ids]
        servers = {}
        for name, result, demotions in reads:
            try:
                data, stat = result.get()
                node = loads(data)
            except NoNodeError:
                continue
            try:
                version = demotions.get()[1].version
            except NoNodeError:  # a server made it before it registered; one registered by hand did not
                self.zk.ensure_path(zkpaths.tablet_demotions(name))
                version = 0
            capacity, lease_ms = node.get("max_buckets"), node.get("lease_ms")
            lease = ServerLease(stat.ephemeralOwner, version, lease_ms if isinstance(lease_ms, int) and lease_ms > 0
                                else self.leader_leases.default_lease_ms)
            servers[int(name)] = (node["address"], str(node.get("incarnation", "")),
                                  capacity if isinstance(capacity, int) and capacity >= 0 else None,
                                  str(node.get("dir_id") or ""), lease)
        return servers

    def servers_changed(self, servers: Mapping[int, str | tuple]) -> None:
        """``servers``: id -> address, or a tuple of :meth:`read_servers`'s first fields (address,
        incarnation[, max_buckets[, dir_id[, lease]]]).

        A server that left (or re-registered with a new incarnation or in a new ZooKeeper session unseen:
        gone, then joined) loses its leaderships and ISR places; one that joined leads offline buckets whose
        ISR holds it. One that registered with a new data dir lost every replica placed on it
        (:mod:`kvlease.coordinator.data_loss_plan`)."""
        seen = {sid: (v, "", None, "", None) if isinstance(v, str) else (*v, None, "", None)[:5]
                for sid, v in servers.items()}
        identity = {sid: (v[0], v[1], v[4].session_id if v[4] is not None else None) for sid, v in seen.items()}
        joined = {sid for sid in seen if self._incarnations.get(sid) != identity[sid]}
        restarted = {sid for sid in joined if sid in self._incarnations}
        left = set(self.servers) - set(seen)
        self._incarnations = identity
        self.capacity = {sid: v[2] for sid, v in seen.items()}
        self.servers = {sid: v[0] for sid, v in seen.items()}
        self.leader_leases.servers_seen({sid: v[4] for sid, v in seen.items() if v[4] is not None})
        if left or restarted:
            log.warning("tablet servers gone: %s, restarted: %s", sorted(left), sorted(restarted))
        registered = {sid: v[3] for sid, v in seen.items()}
        lost = self.dirs.lost(registered)
        overlay, lost_changes = self.assignments, data_loss_plan.servers_lost(self.assignments, lost, set(self.servers))
        if lost_changes:
            log.warning("tablet servers with a new data dir: %s (their replicas' data is lost)", sorted(lost))
            overlay = Assignments()
            overlay.by_table = {**self.assignments.by_table, **lost_changes}
        changes, unclean = election_plan.servers_changed(overlay, left | restarted, joined, set(self.servers),
                                                    self.capacity, self.unclean_election,
                                                    excluded=self.decommissioned.ids)
        changes = {**lost_changes, **changes}
        for table_id, bucket in unclean:
            log.warning("unclean leader election: bucket %d of table %d is led by tablet server %d, which was not "
                        "in sync (writes it missed are lost)", bucket, table_id, changes[table_id][bucket].leader)
            if self.metrics is not None:
                self.metrics.unclean_elections.inc()
        extra_ops = self.dirs.ops(registered) + self.seen.ops(identity)

        def written() -> None:
            self.dirs.recorded(registered)
            self.seen.written(identity)

        told = joined if self._told_all else set(seen)  # a new active coordinator: every live server hears of it
        self._told_all = True
        self._apply(changes, also_tell=told, extra_ops=extra_ops, extra_written=written)
        self.on_changed(None)

    def apply(self, changes: Changes, extra_ops: list[ZkOp] = (),
              extra_written: Callable[[], None] = lambda: None) -> None:
        """Write ``changes`` (fenced; ``extra_ops`` in the first multi-op, then ``extra_written()``), apply them
        and tell the replicas (a move's phases, elections)."""
        self._apply(changes, extra_ops=extra_ops, extra_written=extra_written)

    def _apply(self, changes: Changes, also_tell: Iterable[int] = (), extra_ops: list[ZkOp] = (),
               extra_written: Callable[[], None] = lambda: None) -> None:
        """Write ``changes`` (``extra_ops`` in the first multi-op: ``extra_written()`` once written), apply
        what was written, tell every replica of a changed bucket (and ``also_tell``); raises the first
        write's error after that."""
        before = {t: self.assignments.table(t) for t in changes}
        self._end_leases(changes, before)
        failure = self._store_changes(changes, list(extra_ops), extra_written)
        touched = set(also_tell)
        removed: dict[int, list[tuple[int, int]]] = {}  # server -> the buckets a completed move took off it
        for table_id, plan in changes.items():
            for bucket, state in plan.items():
                old = before[table_id].get(bucket)
                if state != old:
                    touched |= set(state.replicas) | {state.leader} | (set(old.replicas) if old else set())
                    _log_leader_change(table_id, bucket, old, state)
                    if self.assignments.table(table_id).get(bucket) == state:  # written
                        for server in removed_replicas(old, state):
                            removed.setdefault(server, []).append((table_id, bucket))
        self.push(touched - {UNASSIGNED}, removed=removed)
        self.refresh_metrics()
        if failure is not None:
            raise failure
        if changes:
            self.on_changed(list(changes))

    def _end_leases(self, changes: Changes, before: dict[int, dict[int, BucketAssignment]]) -> None:
        """Before ``changes`` take leaderships from live servers: end those servers' leader leases (their
        demotions nodes, in a write of its own that must succeed first: coordinator/leader_leases.py)."""
        demoted = [((t, b), before[t][b].leader) for t, plan in changes.items() for b, state in plan.items()
                   if b in before[t] and before[t][b].leader not in (UNASSIGNED, state.leader)]
        ops = self.leader_leases.bump_ops(server for _key, server in demoted)
        if ops:
            self.writer.commit(ops)
        self.leader_leases.bumped([server for _key, server in demoted], demoted)

    def push_delivered(self, server_id: int, seq: int) -> None:
        """``server_id`` took push ``seq``: tell the new leaders of what it let go that they need not wait."""
        self._undelivered.discard(server_id)
        leaders = set()
        for table_id, bucket in self.leader_leases.delivered(server_id, seq):
            state = self.assignments.table(table_id).get(bucket)
            if state is not None and state.leader != UNASSIGNED:
                leaders.add(state.leader)
        if leaders:
            self.push(leaders)

    def push_undelivered(self, server_id: int) -> None:
        """A push to ``server_id`` ran out of retries: it is pushed again at the next :meth:`repush`."""
        self._undelivered.add(server_id)

    def repush(self) -> None:
        """Push again the live servers a push did not reach (a server cut off from this coordinator but not from
        ZooKeeper would otherwise keep a leadership it lost, its lease lapsed: it would serve nothing)."""
        owed, self._undelivered = self._undelivered & set(self.servers), set()
        if owed:
            self.push(owed)

    def _store_changes(self, changes: Changes, extra_ops: list[ZkOp] = (),
                       extra_written: Callable[[], None] = lambda: None) -> Exception | None:
        """Write the changed assignments (a server with thousands of tables rejoining changes them all:
        in as many fenced multi-ops as ZooKeeper's write limit needs), then apply those written.
        Returns the first write's error, if any (raises Fenced and OutcomeUnknownError)."""
        ops = [self.assignments.set_op(t, plan) for t, plan in sorted(changes.items())]
        table_of = dict(zip((op.path for op in ops), sorted(changes)))
        batches = chunks(list(extra_ops) + ops)
        failure = None
        for batch, outcome in zip(batches, self.writer.commit_many(batches) if batches else []):
            if outcome is not None:
                failure = failure or outcome
                continue
            if extra_ops and batch is batches[0]:
                extra_written()
            for op in batch:
                if op.path in table_of:
                    self.assignments.set(table_of[op.path], changes[table_of[op.path]])
        return failure

    # -- a leader's and a stopping server's requests ------------------------------------------

    def alter_isr(self, server_id: int, table_id: int, bucket: int, leader_epoch: int, bucket_epoch: int,
                  isr: Iterable[int]) -> BucketAssignment:
        """The leader's ISR change (:func:`kvlease.coordinator.election_plan.alter_isr`), written and told; returns the
        bucket's state after it."""
        table = self.catalog.physical.get(table_id)
        if table is None:
            raise errors.TableNotExistError(f"table or partition id {table_id} does not exist", table_id=table_id)
        current = self.assignments.table(table_id).get(bucket)
        if current is None:
            raise errors.InvalidRequestError(f"{table.where} has no bucket {bucket}", table=table.path)
        new = election_plan.alter_isr(current, server_id, leader_epoch, bucket_epoch, isr, set(self.servers),
                                 where=f"bucket {bucket} of {table.where}")
        if new != current:
            self._apply({table_id: {**self.assignments.table(table_id), bucket: new}})
            log.info("ISR of bucket %d of %s: %s -> %s (bucket epoch %d)", bucket, table.where, list(current.isr),
                     list(new.isr), new.bucket_epoch)
        return new

    def controlled_shutdown(self, server_id: int) -> int:
        """Move the server's leaderships away and take it out of the ISRs; the buckets it still leads
        that had no other live in-sync replica."""
        changes, remaining = election_plan.controlled_shutdown(self.assignments, server_id, set(self.servers))
        self._apply(changes)
        log.info("controlled shutdown of tablet server %d: %d bucket(s) changed, %d leadership(s) left", server_id,
                 sum(len(p) for p in changes.values()), remaining)
        return remaining

    # -- telling the servers ---------------------------------------------------------------

    def push_all(self) -> None:
        """Tell every live tablet server what it holds (after becoming active)."""
        self.push(set(self.servers))

    def push(self, server_ids: Iterable[int], dropped: list[int] | None = None,
             removed: dict[int, list[tuple[int, int]]] | None = None) -> None:
        """Tell each server every bucket it holds; ``dropped`` tables; ``removed``: server -> (table id, bucket)
        a completed move took off it."""
        if self.notify is None:
            return
        removed = removed or {}
        for server_id in sorted(server_ids):
            address = self.servers.get(server_id)
            if address is None:
                continue
            held = [(self.catalog.physical[t], b, a, self.servers.get(a.leader, ""))
                    for t, b, a in self.assignments.held_by(server_id) if t in self.catalog.physical]
            gone = [(self.catalog.physical[t], b, self.assignments.table(t)[b], self.servers.get(
                     self.assignments.table(t)[b].leader, "")) for t, b in removed.get(server_id, ())]
            lease = self.leader_leases.push_for(server_id, [(t.physical_id, b) for t, b, a, _ in held
                                                            if a.leader == server_id])
            self.notify(server_id, address, held, list(dropped or []), gone, self.dirs.by_server.get(server_id, ""),
                        lease=lease)

    # -- queries and metrics -----------------------------------------------------------------

    def assignment_rows(self, table: TableInfo) -> list[tuple[TableInfo, int, BucketAssignment, str]]:
        """Per bucket of a physical table (an unpartitioned table, a partition's view): the table, the bucket,
        its state and its leader's address ("" if not live)."""
        return [(table, bucket, a, self.servers.get(a.leader, ""))
                for bucket, a in sorted(self.assignments.table(table.physical_id).items())]

    def server_rows(self) -> list[tuple[int, str, int, int, bool]]:
        """Live servers: (id, address, buckets led, replicas held, decommissioned)."""
        leaders, replicas = self.assignments.leaders_per_server(), self.assignments.load_per_server()
        return [(sid, address, leaders[sid], replicas[sid], sid in self.decommissioned)
                for sid, address in sorted(self.servers.items())]

    def health(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(offline, under-replicated) buckets, as (table id, bucket)."""
        return self.assignments.health(set(self.servers))

    def refresh_metrics(self) -> None:
        """Publish the offline and under-replicated bucket counts, in all and per table or partition (after
        every change: O(servers) from the counts :class:`Assignments` keeps while every bucket is healthy)."""
        if self.metrics is None:
            return
        if self.assignments.health_counts(set(self.servers)) == (0, 0):
            self.metrics.set_bucket_health((), (), self.catalog.physical)  # all healthy: nothing to walk
        else:  # which tables and partitions: a walk of the buckets, only while some are unhealthy
            self.metrics.set_bucket_health(*self.health(), self.catalog.physical)


def _log_leader_change(table_id: int, bucket: int, old: BucketAssignment | None, new: BucketAssignment) -> None:
    if old is None or old.leader == new.leader or new.replication_factor <= 1:
        return
    if new.offline:
        log.warning("bucket %d of table %d is offline: no live in-sync replica (ISR %s); it waits for one",
                    bucket, table_id, list(new.isr))
    else:
        log.info("bucket %d of table %d: leader %d -> %d (leader epoch %d)", bucket, table_id, old.leader,
                 new.leader, new.leader_epoch)
