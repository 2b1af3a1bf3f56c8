"""Bucket leaders: which tablet server leads each bucket, with a leader epoch.

One replica per bucket for now: a bucket's data lives on its leader's disk,
so a bucket is never moved to another server; while its server is gone the
bucket answers ``LEADER_NOT_AVAILABLE``. The stored shape already has
``replicas`` so replication can come without a migration.

``/tables/{table_id}/assignment`` holds ``{"buckets": {"0": {"leader": 3,
"leader_epoch": 2, "replicas": [3]}, …}}``; leader -1 means not assigned yet
(no live tablet server with room when the table was created).

Capacity: a tablet server registers the most buckets it leads
(``max_buckets``, ``tablet.buckets.max``); planning takes ``capacity``
(server id -> that number, or None: no limit) and places no bucket on a
server that leads that many.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from common import zkpaths
from common.zk import ZkOp, dumps, loads

UNASSIGNED = -1

Capacity = Mapping[int, "int | None"]  # server id -> the most buckets it leads (None or absent: no limit)


@dataclass(frozen=True)
class BucketAssignment:
    leader: int
    leader_epoch: int

    def to_json(self) -> dict:
        replicas = [] if self.leader == UNASSIGNED else [self.leader]
        return {"leader": self.leader, "leader_epoch": self.leader_epoch, "replicas": replicas}


class Assignments:
    def __init__(self) -> None:
        self.by_table: dict[int, dict[int, BucketAssignment]] = {}

    # -- queries --------------------------------------------------------------------

    def table(self, table_id: int) -> dict[int, BucketAssignment]:
        return self.by_table.get(table_id, {})

    def load_per_server(self) -> Counter[int]:
        return Counter(a.leader for buckets in self.by_table.values() for a in buckets.values()
                       if a.leader != UNASSIGNED)

    def led_by(self, server_id: int) -> list[tuple[int, int, BucketAssignment]]:
        return sorted((t, b, a) for t, buckets in self.by_table.items() for b, a in buckets.items()
                      if a.leader == server_id)

    def leaders_of(self, table_id: int) -> set[int]:
        return {a.leader for a in self.table(table_id).values() if a.leader != UNASSIGNED}

    def room(self, live: list[int], capacity: Capacity) -> dict[int, int | None]:
        """How many more buckets each live server takes (None: no limit)."""
        load = self.load_per_server()
        return {s: None if capacity.get(s) is None else max(0, capacity[s] - load[s]) for s in sorted(live)}

    # -- planning (no side effects) --------------------------------------------------------

    def plan_new(self, buckets: int, live: list[int], capacity: Capacity | None = None) -> dict[int, BucketAssignment]:
        """Spread a new table's buckets over the live servers with room, least loaded first; a
        bucket no server has room for stays unassigned (check :meth:`room` first)."""
        load = self.load_per_server()
        plan = {}
        for bucket in range(buckets):
            server = _least_loaded(live, load, capacity or {})
            plan[bucket] = BucketAssignment(server, 0 if server == UNASSIGNED else 1)
        return plan

    def plan_servers_joined(self, joined: set[int], live: list[int],
                            capacity: Capacity | None = None) -> dict[int, dict[int, BucketAssignment]]:
        """New assignments after servers (re)joined: their buckets get a new leader
        epoch; unassigned buckets go to the least loaded live servers with room."""
        load = self.load_per_server()
        changed: dict[int, dict[int, BucketAssignment]] = {}
        for table_id, buckets in self.by_table.items():
            for bucket, current in buckets.items():
                if current.leader in joined:
                    new = replace(current, leader_epoch=current.leader_epoch + 1)
                elif current.leader == UNASSIGNED and live:
                    server = _least_loaded(live, load, capacity or {})
                    if server == UNASSIGNED:
                        continue
                    new = BucketAssignment(server, current.leader_epoch + 1)
                else:
                    continue
                changed.setdefault(table_id, dict(buckets))[bucket] = new
        return changed

    @staticmethod
    def node(plan: dict[int, BucketAssignment]) -> bytes:
        return dumps({"buckets": {str(b): a.to_json() for b, a in sorted(plan.items())}})

    def create_op(self, table_id: int, plan: dict[int, BucketAssignment]) -> ZkOp:
        return ZkOp("create", zkpaths.table_assignment(table_id), self.node(plan))

    def set_op(self, table_id: int, plan: dict[int, BucketAssignment]) -> ZkOp:
        return ZkOp("set", zkpaths.table_assignment(table_id), self.node(plan))

    @staticmethod
    def delete_op(table_id: int) -> ZkOp:
        return ZkOp("delete", zkpaths.table_assignment(table_id))

    # -- applying -------------------------------------------------------------------

    def set(self, table_id: int, plan: dict[int, BucketAssignment]) -> None:
        self.by_table[table_id] = dict(plan)

    def remove(self, table_id: int) -> None:
        self.by_table.pop(table_id, None)

    def load(self, zk: KazooClient, table_ids: list[int]) -> list[int]:
        """Load every table's assignment; returns the tables that have none (created
        before assignments existed), which the caller assigns."""
        self.by_table = {}
        missing = []
        pending = [(t, zk.get_async(zkpaths.table_assignment(t))) for t in table_ids]
        for table_id, result in pending:
            try:
                data, _ = result.get()
            except NoNodeError:
                missing.append(table_id)
                continue
            node = loads(data)
            self.by_table[table_id] = {int(b): BucketAssignment(int(a["leader"]), int(a["leader_epoch"]))
                                       for b, a in node["buckets"].items()}
        return missing


def _least_loaded(live: list[int], load: Counter[int], capacity: Capacity) -> int:
    """The least loaded live server with room (counted into ``load``), or UNASSIGNED if none has."""
    with_room = [s for s in sorted(live) if capacity.get(s) is None or load[s] < capacity[s]]
    if not with_room:
        return UNASSIGNED
    server = min(with_room, key=lambda s: load[s])
    load[server] += 1
    return server
