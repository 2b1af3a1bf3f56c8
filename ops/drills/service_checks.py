"""Pure checkers of the replica drills (rolling-restart, disk-loss, decommission): what the clients were
refused, and the buckets' replicas, ISRs and leaders read back at the end.

No cluster, clock or I/O in here: a bucket's state is the
:class:`~kvlease.client.admin_types.BucketLeader` the coordinator answered (replicas,
ISR, leader), failures are counts per kind of call and error name. Each
checker returns a :class:`~kvlease.ops.drills.report.Check` naming what broke.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from kvlease.client.admin_types import BucketLeader
from kvlease.ops.check import Check


def no_client_errors(failures: Mapping[str, Mapping[str, int]], calls: Mapping[str, int]) -> Check:
    """No call failed after the client's retries: ``failures`` is kind (writes, lookups, scans) -> error
    name -> how many calls of that kind ended with it; ``calls`` how many were made of each kind."""
    violations = []
    for kind, errors in sorted(failures.items()):
        failed = sum(errors.values())
        if failed:
            named = ", ".join(f"{name} {n}" for name, n in sorted(errors.items()))
            violations.append(f"{failed} of {calls.get(kind, 0)} {kind} failed after the client's retries ({named})")
    return Check.of("no request failed beyond the client's retries", violations, sum(calls.values()))


def isr_full(state: Mapping[int, BucketLeader], replication: int, away: Iterable[int] = ()) -> Check:
    """Every bucket has ``replication`` distinct replicas, none on the servers ``away`` (e.g. one
    decommissioned), every replica in the ISR, and a live leader among them."""
    away = set(away)
    violations = []
    for bucket, b in sorted(state.items()):
        where = f"bucket {bucket} (replicas {list(b.replicas)}, ISR {list(b.isr)})"
        if len(set(b.replicas)) != len(b.replicas) or len(b.replicas) != replication:
            violations.append(f"{where}: {len(set(b.replicas))} distinct replicas, not {replication}")
        if on := sorted(away & set(b.replicas)):
            violations.append(f"{where}: still has a replica on tablet server {', '.join(map(str, on))}")
        if set(b.isr) != set(b.replicas):
            violations.append(f"{where}: not every replica is in sync")
        if b.leader_id not in b.isr or not b.leader_address:
            violations.append(f"{where}: no live in-sync leader (leader {b.leader_id})")
    return Check.of(f"every bucket has {replication} replicas, all in the ISR", violations, len(state))


def led_by_preferred(state: Mapping[int, BucketLeader]) -> Check:
    """Every bucket is led by its preferred replica (its first): where the preferred-leader election puts
    leadership back after a restart (automatically, or ``cluster rebalance --leaders``)."""
    violations = [f"bucket {bucket} (replicas {list(b.replicas)}) is led by {b.leader_id}, not its preferred replica "
                  f"{b.replicas[0] if b.replicas else '-'}" for bucket, b in sorted(state.items())
                  if not b.replicas or b.leader_id != b.replicas[0]]
    return Check.of("every bucket led by its preferred replica again", violations, len(state))


def leaders_spread(state: Mapping[int, BucketLeader], servers: Sequence[int]) -> Check:
    """The buckets' leaderships are spread over ``servers``: no server leads more than one bucket more than
    another (after a rolling restart the last server restarted leads none until its preferred-leader
    election)."""
    led = {server: 0 for server in servers}
    for b in state.values():
        led[b.leader_id] = led.get(b.leader_id, 0) + 1
    counts = ", ".join(f"tablet {s} leads {n}" for s, n in sorted(led.items()))
    violations = [f"leaders are not spread: {counts}"] if led and max(led.values()) - min(led.values()) > 1 else []
    return Check.of("leaders spread over the tablet servers again", violations, len(state))
