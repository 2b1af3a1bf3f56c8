"""The chaos drill's fault sequence: a pure function of the seed and the cluster's shape.

:func:`plan` draws ``rounds`` faults, one after another, from the kinds the
cluster's shape allows (a 3-node ensemble to lose its leader, a ``file://``
remote to take away, …), each with how long it lasts and how long the drill
waits before it. The gap is drawn short on purpose: a fault often lands
while the cluster is still recovering from the one before, which is what a
single-fault drill never tries. The same seed and shape give the same plan,
so a failure is reproduced with ``kvlease drill chaos --seed N --rounds R``
on a cluster of the same shape (what the processes do meanwhile is not
deterministic: the seed fixes the faults, not the timing of the traffic).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping

ZK_RESTART = "zk-restart"  # kill -9 of one ZooKeeper node, started again after hold_s
ZK_LEADER_LOSS = "zk-leader-loss"  # kill -9 of the ensemble's leader, started again after hold_s
COORDINATOR_KILL = "coordinator-kill"  # kill -9 of the active coordinator, started again at once
COORDINATOR_PAUSE = "coordinator-pause"  # SIGSTOP of the active coordinator for hold_s, then SIGCONT
TABLET_RESTART = "tablet-restart"  # kill -9 of one tablet server, started again at once
REMOTE_OUTAGE = "remote-outage"  # the file:// remote storage taken away for hold_s

KINDS = (ZK_RESTART, ZK_LEADER_LOSS, COORDINATOR_KILL, COORDINATOR_PAUSE, TABLET_RESTART, REMOTE_OUTAGE)
MAX_GAP_S = 2.0


@dataclass(frozen=True)
class Fault:
    kind: str
    target: int = 0  # which node of its role, for kinds that do not pick theirs at run time (0-based)
    hold_s: float = 0.0  # how long the node stays down / paused / the remote away
    gap_s: float = 0.0  # the wait before the fault

    def describe(self) -> str:
        what = {ZK_RESTART: f"kill -9 ZooKeeper node #{self.target + 1}, back after {self.hold_s:.1f}s",
                ZK_LEADER_LOSS: f"kill -9 the ZooKeeper leader, back after {self.hold_s:.1f}s",
                COORDINATOR_KILL: "kill -9 the active coordinator, started again at once",
                COORDINATOR_PAUSE: f"SIGSTOP the active coordinator for {self.hold_s:.1f}s",
                TABLET_RESTART: f"kill -9 tablet server #{self.target + 1}, started again at once",
                REMOTE_OUTAGE: f"remote storage away for {self.hold_s:.1f}s"}[self.kind]
        return f"after {self.gap_s:.1f}s: {what}"


def allowed_kinds(doc: Mapping[str, Any]) -> list[str]:
    """The fault kinds a cluster of this shape (its ``cluster.json``) can take and recover from."""
    zk = len(doc.get("zookeeper", []))
    kinds = [ZK_RESTART]
    if zk >= 3:
        kinds.append(ZK_LEADER_LOSS)
    if len(doc.get("coordinators", [])) >= 2:
        kinds += [COORDINATOR_KILL, COORDINATOR_PAUSE]
    if doc.get("tablets"):
        kinds.append(TABLET_RESTART)
    if str(doc.get("remote", "")).startswith("file://"):
        kinds.append(REMOTE_OUTAGE)
    return kinds


def plan(seed: int, rounds: int, doc: Mapping[str, Any], session_timeout_s: float) -> list[Fault]:
    """``rounds`` faults for a cluster of shape ``doc``; a coordinator pause lasts up to the ZooKeeper
    session timeout + 2 s (so some pauses outlive the session: the standby takes over while the paused
    one still believes it is active)."""
    rng = random.Random(seed)
    kinds = allowed_kinds(doc)
    counts = {"zookeeper": len(doc.get("zookeeper", [])), "tablets": len(doc.get("tablets", []))}
    faults = []
    for _ in range(rounds):
        kind = rng.choice(kinds)
        gap = round(rng.uniform(0.0, MAX_GAP_S), 2)
        if kind == ZK_RESTART:
            fault = Fault(kind, rng.randrange(counts["zookeeper"]), round(rng.uniform(0.0, 3.0), 2), gap)
        elif kind == ZK_LEADER_LOSS:
            fault = Fault(kind, 0, round(rng.uniform(0.0, 3.0), 2), gap)
        elif kind == COORDINATOR_PAUSE:
            fault = Fault(kind, 0, round(rng.uniform(0.5, session_timeout_s + 2.0), 2), gap)
        elif kind == TABLET_RESTART:
            fault = Fault(kind, rng.randrange(counts["tablets"]), 0.0, gap)
        elif kind == REMOTE_OUTAGE:
            fault = Fault(kind, 0, round(rng.uniform(1.0, 3.0), 2), gap)
        else:
            fault = Fault(kind, 0, 0.0, gap)
        faults.append(fault)
    return faults
