"""Bucket replicas and leaders: who holds each bucket, who leads it, who is in sync
(docs/architecture.md, "Losing and moving replicas").

Per bucket: ``replicas`` (ordered tablet ids on distinct servers, the
preferred leader first), ``leader`` (-1: none), ``leader_epoch`` (+1 on every
leader change), ``isr`` (the in-sync replicas, in ``replicas`` order, always
holding the leader when there is one) and ``bucket_epoch`` (+1 on every
change of this state).

``/tables/{table_id}/assignment`` holds ``{"buckets": {"0": {"replicas": [3, 1], "leader": 3,
"leader_epoch": 2, "isr": [3, 1], "bucket_epoch": 4}, …}}``. A node written before replication
has no ``isr`` / ``bucket_epoch``: its replicas and ISR are its leader (none if -1) and its bucket
epoch is its leader epoch. A bucket whose replicas are being moved also has
``"reassign": {"target": [4, 1]}`` (:mod:`kvlease.coordinator.reassignment_plan`; omitted when none), and one whose replicas
reported their data lost since they last were in sync ``"lost": [2]`` (:mod:`kvlease.coordinator.data_loss_plan`; omitted
when none; a replica back in the ISR, or no longer a replica, leaves it). Leader -1 with no
replicas: not assigned yet (a one-replica table created while no tablet server was live). A restore's loss
record keeps the replicas that still owe it (``owed_by``, :attr:`BucketAssignment.restore_owed_by`): a
replica moved off the bucket leaves it in the same write, and so does one that joins the ISR
(:meth:`BucketAssignment.in_sync`).

Capacity: a tablet server registers the most bucket replicas it holds (``max_buckets``,
``tablet.buckets.max``); every replica counts. Planning is pure:
:mod:`kvlease.coordinator.placement_plan` places new tables, :mod:`kvlease.coordinator.election_plan` moves leaders and ISRs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import zkpaths
from kvlease.common.data_loss import RESTORE, DataLoss
from kvlease.common.zk import ZkOp, dumps, loads
from kvlease.coordinator.zk_reads import DATA, read_many

UNASSIGNED = -1

Capacity = Mapping[int, "int | None"]  # server id -> the most replicas it holds (None or absent: no limit)


@dataclass(frozen=True)
class BucketAssignment:
    """One bucket's replication state. Built with only ``leader`` and ``leader_epoch`` (a one-replica
    bucket, or an old node), its replicas and ISR are the leader and its bucket epoch the leader epoch."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...] = field(default=None)  # type: ignore[assignment]
    isr: tuple[int, ...] = field(default=None)  # type: ignore[assignment]
    bucket_epoch: int = field(default=None)  # type: ignore[assignment]
    #: A replica move in progress (:mod:`kvlease.coordinator.reassignment_plan`): the replicas the bucket moves to; None: none.
    reassign: tuple[int, ...] | None = None
    #: Why the bucket has no leader when its data is lost ("": not lost); see coordinator/data_loss_plan.py.
    offline_reason: str = ""
    #: The losses operators accepted (restore, unclean election), oldest first.
    losses: tuple[DataLoss, ...] = ()
    #: Replicas that reported their data lost (a wiped dir, damaged files), or dropped it to carry out a
    #: restore another replica led, since they last were in the ISR: an unclean election prefers the others
    #: (coordinator/data_loss_plan.py). Never an ISR member.
    lost: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        alone = () if self.leader == UNASSIGNED else (self.leader,)
        object.__setattr__(self, "replicas", alone if self.replicas is None else tuple(self.replicas))
        object.__setattr__(self, "isr", alone if self.isr is None else tuple(self.isr))
        if self.bucket_epoch is None:
            object.__setattr__(self, "bucket_epoch", self.leader_epoch)
        if self.reassign is not None:
            object.__setattr__(self, "reassign", tuple(self.reassign))
        # a server moved off the bucket (a move, a restore onto others) owes nothing: it never restores a
        # bucket it no longer holds
        object.__setattr__(self, "losses", tuple(loss.owed_only_by(lambda r: r in self.replicas)
                                                 for loss in self.losses))
        object.__setattr__(self, "lost", tuple(r for r in self.replicas if r in self.lost and r not in self.isr))

    @property
    def replication_factor(self) -> int:
        return len(self.replicas)

    @property
    def latest_restore(self) -> DataLoss | None:
        """The bucket's latest restore (a later unclean election may follow it), None: never restored."""
        return next((loss for loss in reversed(self.losses) if loss.kind == RESTORE), None)

    @property
    def restore_owed_by(self) -> tuple[int, ...]:
        """The replicas that have not carried out the bucket's latest restore yet (its record's ``owed_by``;
        () when none is known): each holds its data from before the restore, or nothing, so it must never
        lead without restoring first (coordinator/data_loss_plan.py ``unclean_choice``)."""
        latest = self.latest_restore
        return () if latest is None or latest.owed_by is None else latest.owed_by

    def in_sync(self, joined: Iterable[int]) -> "BucketAssignment":
        """``self`` once the ``joined`` replicas caught up with the leader (added to the ISR): they hold
        what it holds, so they owe no restore any more. (A replica owing the latest restore fetches
        nothing before it carried it out; one that owed it when a later unclean election gave the bucket
        another leader follows that leader and truncates what it had from before the restore.)"""
        joined = set(joined)
        if not joined & set(self.restore_owed_by):
            return self
        return replace(self, losses=tuple(loss.owed_only_by(lambda r: r not in joined) for loss in self.losses))

    @property
    def offline(self) -> bool:
        """No leader (its replicas are gone, or none is in sync)."""
        return self.leader == UNASSIGNED

    def in_replica_order(self, servers) -> tuple[int, ...]:
        """``servers`` (a subset of the replicas) in ``replicas`` order."""
        wanted = set(servers)
        return tuple(r for r in self.replicas if r in wanted)

    def to_json(self) -> dict:
        node = {"leader": self.leader, "leader_epoch": self.leader_epoch, "replicas": list(self.replicas),
                "isr": list(self.isr), "bucket_epoch": self.bucket_epoch}
        if self.reassign is not None:
            node["reassign"] = {"target": list(self.reassign)}
        if self.offline_reason:
            node["offline_reason"] = self.offline_reason
        if self.losses:
            node["losses"] = [loss.to_json() for loss in self.losses]
        if self.lost:
            node["lost"] = list(self.lost)
        return node

    @classmethod
    def from_json(cls, node: Mapping) -> "BucketAssignment":
        leader, epoch = int(node["leader"]), int(node["leader_epoch"])
        replicas = node.get("replicas")
        isr = node.get("isr")
        move = node.get("reassign")
        return cls(leader, epoch,
                   None if replicas is None or isr is None else tuple(int(r) for r in replicas),
                   None if replicas is None or isr is None else tuple(int(r) for r in isr),
                   int(node["bucket_epoch"]) if "bucket_epoch" in node else epoch,
                   None if move is None else tuple(int(r) for r in move["target"]),
                   str(node.get("offline_reason", "")),
                   tuple(DataLoss.from_json(loss) for loss in node.get("losses", ())),
                   tuple(int(r) for r in node.get("lost", ())))


Plan = dict[int, BucketAssignment]  # bucket -> its state
Changes = dict[int, Plan]  # table id -> every bucket of the table (the changed ones changed)


class Assignments:
    """Every table's bucket states, with the counts the health metrics read kept as they change (a walk of
    all buckets after every change was 15% of the loop at 1,000 partitions)."""

    def __init__(self) -> None:
        self._by_table: dict[int, Plan] = {}
        self._led: Counter[int] = Counter()  # leader (UNASSIGNED: none) -> the buckets it leads
        self._short: Counter[int] = Counter()  # leader -> those of its buckets whose ISR is short of the replicas
        self._preferred: Counter[int] = Counter()  # first replica -> the replicated buckets not moving it is first of
        self._not_led: Counter[int] = Counter()  # first replica -> those of them another server leads, or none

    @property
    def by_table(self) -> dict[int, Plan]:
        """table id -> its plan. Change it through :meth:`set`, :meth:`remove` or by assigning a new dict
        (counted again), never in place."""
        return self._by_table

    @by_table.setter
    def by_table(self, tables: dict[int, Plan]) -> None:
        self._by_table = tables
        self._led, self._short, self._preferred, self._not_led = Counter(), Counter(), Counter(), Counter()
        for plan in tables.values():
            self._count(plan, 1)

    def _count(self, plan: Plan | None, sign: int) -> None:
        for a in (plan or {}).values():
            self._led[a.leader] += sign
            if len(a.isr) < len(a.replicas):
                self._short[a.leader] += sign
            if a.replication_factor > 1 and a.reassign is None:
                self._preferred[a.replicas[0]] += sign
                self._not_led[a.replicas[0]] += sign * (a.leader != a.replicas[0])

    # -- queries --------------------------------------------------------------------

    def table(self, table_id: int) -> Plan:
        return self.by_table.get(table_id, {})

    def all(self):
        """Every bucket: (table id, bucket, state)."""
        return ((t, b, a) for t, buckets in self.by_table.items() for b, a in buckets.items())

    def load_per_server(self) -> Counter[int]:
        """Replicas per server (what its capacity counts)."""
        return Counter(r for _t, _b, a in self.all() for r in a.replicas)

    def leaders_per_server(self) -> Counter[int]:
        """Buckets each server leads now."""
        return Counter(a.leader for _t, _b, a in self.all() if a.leader != UNASSIGNED)

    def preferred_per_server(self) -> Counter[int]:
        """Buckets each server is the preferred leader of: the first replica (of a move in progress, the first
        of its target), whether it leads now or not (coordinator/leader_balance_plan.py)."""
        return Counter((a.reassign or a.replicas)[0] for _t, _b, a in self.all() if a.replicas)

    def led_by(self, server_id: int) -> list[tuple[int, int, BucketAssignment]]:
        return sorted((t, b, a) for t, b, a in self.all() if a.leader == server_id)

    def held_by(self, server_id: int) -> list[tuple[int, int, BucketAssignment]]:
        """The buckets the server holds a replica of (led or followed)."""
        return sorted((t, b, a) for t, b, a in self.all() if server_id in a.replicas or a.leader == server_id)

    def leaders_of(self, table_id: int) -> set[int]:
        return {a.leader for a in self.table(table_id).values() if a.leader != UNASSIGNED}

    def holders_of(self, table_id: int) -> set[int]:
        """Every server holding a replica of the table."""
        return {r for a in self.table(table_id).values() for r in a.replicas} | self.leaders_of(table_id)

    def room(self, live: list[int], capacity: Capacity) -> dict[int, int | None]:
        """How many more replicas each live server takes (None: no limit)."""
        load = self.load_per_server()
        return {s: None if capacity.get(s) is None else max(0, capacity[s] - load[s]) for s in sorted(live)}

    def preferred_leaderships(self) -> dict[int, tuple[int, int]]:
        """server -> (replicated buckets not being moved whose first replica it is, those of them it does not
        lead), for every server first of one: from the kept counts, O(servers)
        (coordinator/leader_balance_plan.py, ``imbalance``)."""
        return {s: (n, self._not_led[s]) for s, n in sorted(self._preferred.items()) if n > 0}

    def health_counts(self, live: set[int]) -> tuple[int, int]:
        """How many buckets :meth:`health` lists, from the kept counts: O(servers)."""
        offline = sum(n for leader, n in self._led.items() if leader == UNASSIGNED or leader not in live)
        under = sum(n for leader, n in self._short.items() if leader != UNASSIGNED and leader in live)
        return offline, under

    def validate(self) -> None:
        """The kept counts are those of the plans."""
        led, short = Counter(), Counter()
        for _t, _b, a in self.all():
            led[a.leader] += 1
            short[a.leader] += len(a.isr) < len(a.replicas)
        assert +led == +self._led and +short == +self._short, "health counts differ from the plans"

    def health(self, live: set[int]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(offline, under_replicated)`` (table id, bucket) lists: no live leader; a live leader with
        an ISR smaller than the replicas."""
        offline, under = [], []
        for t, b, a in sorted(self.all(), key=lambda x: (x[0], x[1])):
            if a.leader == UNASSIGNED or a.leader not in live:
                offline.append((t, b))
            elif len(a.isr) < len(a.replicas):
                under.append((t, b))
        return offline, under

    # -- ZooKeeper ops ---------------------------------------------------------------------

    @staticmethod
    def node(plan: Plan) -> bytes:
        return dumps({"buckets": {str(b): a.to_json() for b, a in sorted(plan.items())}})

    def create_op(self, table_id: int, plan: Plan) -> ZkOp:
        return ZkOp("create", zkpaths.table_assignment(table_id), self.node(plan))

    def set_op(self, table_id: int, plan: Plan) -> ZkOp:
        return ZkOp("set", zkpaths.table_assignment(table_id), self.node(plan))

    @staticmethod
    def delete_op(table_id: int) -> ZkOp:
        return ZkOp("delete", zkpaths.table_assignment(table_id))

    # -- applying -------------------------------------------------------------------

    def set(self, table_id: int, plan: Plan) -> None:
        self._count(self._by_table.get(table_id), -1)
        self._by_table[table_id] = dict(plan)
        self._count(plan, 1)

    def remove(self, table_id: int) -> None:
        self._count(self._by_table.pop(table_id, None), -1)

    def load(self, zk: KazooClient, table_ids: list[int]) -> list[int]:
        """Load every table's assignment; returns the tables that have none (created
        before assignments existed), which the caller assigns."""
        tables: dict[int, Plan] = {}
        missing = []
        answers = read_many(zk, [(DATA, zkpaths.table_assignment(t)) for t in table_ids])  # a few requests
        for table_id, answer in zip(table_ids, answers):
            if isinstance(answer, NoNodeError):
                missing.append(table_id)
                continue
            if isinstance(answer, Exception):
                raise answer
            node = loads(answer[0])
            tables[table_id] = {int(b): BucketAssignment.from_json(a) for b, a in node["buckets"].items()}
        self.by_table = tables
        return missing
