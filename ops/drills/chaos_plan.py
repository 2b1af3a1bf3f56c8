"""The chaos drill's fault sequence: a pure function of the seed and the cluster's shape.

:func:`plan` draws ``rounds`` faults, one after another, from the kinds the
cluster's shape allows (a 3-node ensemble to lose its leader, a ``file://``
remote to take away, a small disk of its own for each tablet server to fill,
…), each with how long it lasts and how long the drill waits before it. The gap is drawn short on purpose: a fault often lands
while the cluster is still recovering from the one before, which is what a
single-fault drill never tries. The same seed and shape give the same plan,
so a failure is reproduced with ``kvlease drill chaos --seed N --rounds R``
on a cluster of the same shape (what the processes do meanwhile is not
deterministic: the seed fixes the faults, not the timing of the traffic).

A new kind of fault is a name in :data:`KINDS`, its condition in
:func:`allowed_kinds`, how its target and duration are drawn in
:data:`DRAWS`, its sentence in :data:`SAYS`, and how it is carried out in
:data:`kvlease.ops.drills.chaos_faults.HANDLERS`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvlease.common import config as cfg
from kvlease.ops import local_cluster

ZK_RESTART = "zk-restart"  # kill -9 of one ZooKeeper node, started again after hold_s
ZK_LEADER_LOSS = "zk-leader-loss"  # kill -9 of the ensemble's leader, started again after hold_s
COORDINATOR_KILL = "coordinator-kill"  # kill -9 of the active coordinator, started again at once
COORDINATOR_PAUSE = "coordinator-pause"  # SIGSTOP of the active coordinator for hold_s, then SIGCONT
TABLET_RESTART = "tablet-restart"  # kill -9 of one tablet server, started again at once
REMOTE_OUTAGE = "remote-outage"  # the file:// remote storage taken away for hold_s
TABLET_PAUSE = "tablet-pause"  # SIGSTOP of the leader of bucket `target` of the drill's row table for hold_s
DISK_FULL = "disk-full"  # the disk of the leader of bucket `target` of the row table full for hold_s, then freed

KINDS = (ZK_RESTART, ZK_LEADER_LOSS, COORDINATOR_KILL, COORDINATOR_PAUSE, TABLET_RESTART, REMOTE_OUTAGE, TABLET_PAUSE,
         DISK_FULL)
MAX_GAP_S = 2.0
ROW_BUCKETS = 4  # buckets of the drill's row table (the one its writers and readers use)
MIN_PAUSE_S = 0.5
MIN_FULL_S = 1.0
FULL_PAST_FAILURE_TIMEOUT_S = 4.0  # a full disk lasts up to replica.leader.failure-timeout + this
#: replica.leader.failure-timeout's default: how long a leader whose writes fail keeps leading
DEFAULT_FAILURE_TIMEOUT_S = cfg.Config({}, env={})[cfg.REPLICA_LEADER_FAILURE_TIMEOUT] / 1000.0


@dataclass(frozen=True)
class Fault:
    kind: str
    target: int = 0  # which node of its role (0-based), or which bucket whose leader it strikes
    hold_s: float = 0.0  # how long the node stays down / paused / the remote away
    gap_s: float = 0.0  # the wait before the fault

    def describe(self) -> str:
        return f"after {self.gap_s:.1f}s: {SAYS[self.kind](self)}"


@dataclass(frozen=True)
class Shape:
    """What a plan needs of the cluster: how many ZooKeeper nodes and tablet servers, its session timeout, how
    long a leader whose writes fail keeps leading (``replica.leader.failure-timeout``)."""

    zookeeper: int
    tablets: int
    session_timeout_s: float
    failure_timeout_s: float = DEFAULT_FAILURE_TIMEOUT_S


SAYS: dict[str, Callable[[Fault], str]] = {
    ZK_RESTART: lambda f: f"kill -9 ZooKeeper node #{f.target + 1}, back after {f.hold_s:.1f}s",
    ZK_LEADER_LOSS: lambda f: f"kill -9 the ZooKeeper leader, back after {f.hold_s:.1f}s",
    COORDINATOR_KILL: lambda f: "kill -9 the active coordinator, started again at once",
    COORDINATOR_PAUSE: lambda f: f"SIGSTOP the active coordinator for {f.hold_s:.1f}s",
    TABLET_RESTART: lambda f: f"kill -9 tablet server #{f.target + 1}, started again at once",
    REMOTE_OUTAGE: lambda f: f"remote storage away for {f.hold_s:.1f}s",
    TABLET_PAUSE: lambda f: f"SIGSTOP the leader of bucket {f.target} for {f.hold_s:.1f}s",
    DISK_FULL: lambda f: f"fill the disk of the leader of bucket {f.target} for {f.hold_s:.1f}s",
}


def _pause_s(rng: random.Random, shape: Shape) -> float:
    """Up to the session timeout + 2 s: some pauses outlive the session (another process takes over)."""
    return round(rng.uniform(MIN_PAUSE_S, shape.session_timeout_s + 2.0), 2)


def _full_s(rng: random.Random, shape: Shape) -> float:
    """From 1 s to ``replica.leader.failure-timeout`` + 4 s: in the longer ones the leader steps down (within
    about a second after the timeout), in the shorter ones it keeps its leadership and writes again."""
    return round(rng.uniform(MIN_FULL_S, shape.failure_timeout_s + FULL_PAST_FAILURE_TIMEOUT_S), 2)


#: kind -> (target, hold_s) drawn for it
DRAWS: dict[str, Callable[[random.Random, Shape], tuple[int, float]]] = {
    ZK_RESTART: lambda rng, shape: (rng.randrange(shape.zookeeper), round(rng.uniform(0.0, 3.0), 2)),
    ZK_LEADER_LOSS: lambda rng, shape: (0, round(rng.uniform(0.0, 3.0), 2)),
    COORDINATOR_KILL: lambda rng, shape: (0, 0.0),
    COORDINATOR_PAUSE: lambda rng, shape: (0, _pause_s(rng, shape)),
    TABLET_RESTART: lambda rng, shape: (rng.randrange(shape.tablets), 0.0),
    REMOTE_OUTAGE: lambda rng, shape: (0, round(rng.uniform(1.0, 3.0), 2)),
    TABLET_PAUSE: lambda rng, shape: (rng.randrange(ROW_BUCKETS), _pause_s(rng, shape)),
    DISK_FULL: lambda rng, shape: (rng.randrange(ROW_BUCKETS), _full_s(rng, shape)),
}


def allowed_kinds(doc: Mapping[str, Any]) -> list[str]:
    """The fault kinds a cluster of this shape (its ``cluster.json``) can take and recover from."""
    return [kind for kind in KINDS if kind not in left_out(doc)]


def left_out(doc: Mapping[str, Any]) -> dict[str, str]:
    """The fault kinds a cluster of this shape cannot take, each with what it would need (a report says so)."""
    tablets = bool(doc.get("tablets"))
    needs = {
        ZK_LEADER_LOSS: (len(doc.get("zookeeper", [])) >= 3, "a 3-node ZooKeeper ensemble (--zk-nodes 3)"),
        COORDINATOR_KILL: (len(doc.get("coordinators", [])) >= 2, "a standby coordinator (--coordinators 2)"),
        COORDINATOR_PAUSE: (len(doc.get("coordinators", [])) >= 2, "a standby coordinator (--coordinators 2)"),
        TABLET_RESTART: (tablets, "tablet servers (--tablets 1 or more)"),
        REMOTE_OUTAGE: (str(doc.get("remote", "")).startswith("file://"), "a file:// remote (no --remote)"),
        # a one-replica bucket is unavailable while paused; a replicated one fails over
        TABLET_PAUSE: (tablets, "tablet servers (--tablets 1 or more)"),
        # never the host's disk: only tablet servers on small disks of their own are filled
        DISK_FULL: (local_cluster.tablet_disks.every_tablet_has_one(doc),
                    "tablet servers on small disks of their own (kvlease cluster start --tablet-disk SIZE, root only)"),
    }
    return {kind: f"needs {what}" for kind, (allowed, what) in needs.items() if not allowed}


def plan(seed: int, rounds: int, doc: Mapping[str, Any], session_timeout_s: float,
         failure_timeout_s: float = DEFAULT_FAILURE_TIMEOUT_S) -> list[Fault]:
    """``rounds`` faults for a cluster of shape ``doc``; a pause (of the active coordinator, of a bucket's
    leader) lasts up to the ZooKeeper session timeout + 2 s, so some pauses outlive the session: another
    process takes over while the paused one still believes it leads; a full disk lasts up to
    ``failure_timeout_s`` (``replica.leader.failure-timeout``) + 4 s, so in some rounds its leader steps down."""
    rng = random.Random(seed)
    kinds = allowed_kinds(doc)
    shape = Shape(len(doc.get("zookeeper", [])), len(doc.get("tablets", [])), session_timeout_s, failure_timeout_s)
    faults = []
    for _ in range(rounds):
        kind = rng.choice(kinds)
        gap = round(rng.uniform(0.0, MAX_GAP_S), 2)
        target, hold = DRAWS[kind](rng, shape)
        faults.append(Fault(kind, target, hold, gap))
    return faults
