"""Whether a tablet server can serve what it leads: buckets it cannot serve, capacity, file descriptors.

The coordinator's assignment says which buckets a server *should* lead; this
says which it *can* serve. A server is unhealthy when a bucket it was told to
lead is not served (over its capacity ``tablet.buckets.max``, or failed: a
full disk, too many open files, a damaged changelog), when it gave up leading
buckets whose local writes failed and they are not back in sync yet, or kept
such a bucket for want of another in-sync replica (``tablet/replicas/step_down.py``),
or when its open file descriptors near its limit. It is exported as Prometheus
gauges (``kvlease_tablet_*``, below), which ``kvlease cluster status`` reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvlease.common.tables import TableInfo
from kvlease.tablet.bucket.open_buckets import fd_limit
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.tablet.replicas.step_down import StepDown, SteppedDown

FD_WARNING = 0.9  # open fds above this share of the limit make the server unhealthy


@dataclass(frozen=True)
class Health:
    buckets: int  # told to lead (served or not)
    unserved: int  # of those: refused over capacity, or failed
    capacity: int  # tablet.buckets.max
    open_buckets: int  # with open files
    max_open_buckets: int
    recovering: int  # not opened since this server started (the keeper opens them)
    parked_total: int  # buckets parked so far
    open_fds: int
    max_fds: int
    problems: tuple[str, ...]
    #: the most changelog records of one bucket not yet in a committed snapshot (of the buckets whose
    #: offsets are known without opening them); a reader bootstrapping it replays that many
    snapshot_lag_records: int = 0
    #: buckets that gave up their leadership because their local writes failed, not back in sync yet:
    #: (physical id, bucket) -> table path, partition and cause (tablet/replicas/step_down.py)
    stepped_down: Mapping[tuple[int, int], SteppedDown] = field(default_factory=dict)
    resignations: int = 0  # leaderships given up so far

    @property
    def healthy(self) -> bool:
        return not self.problems


def open_fd_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: unknown
        return 0


def _named(table: TableInfo, bucket: int) -> str:
    """``bucket 0 of table 3``, or ``bucket 0 of table 3 partition 20261127 (id 7)`` of a partition's view."""
    part = "" if table.partition_id is None else f" partition {table.partition_name} (id {table.partition_id})"
    return f"bucket {bucket} of table {table.table_id}{part}"


def health(replicas: ReplicaManager, step_down: StepDown | None = None) -> Health:
    """The server's health now (reads only memory and ``/proc/self/fd``); ``step_down``: the server's
    :class:`~kvlease.tablet.replicas.step_down.StepDown` (None: no step-downs to report)."""
    problems = []
    refused = sorted(replicas.refused)
    if refused:
        first_refused = refused[0]
        problems.append(f"{len(refused)} bucket(s) over its capacity of {replicas.max_buckets} (tablet.buckets.max) "
                        f"are not served, e.g. {_named(replicas.refused[first_refused], first_refused[1])}")
    led = replicas.replicas()
    failed = [r for r in led if r.store.files.failure is not None]
    if failed:
        first = failed[0]
        alone = sum(not r.replicated for r in failed)
        note = f" ({alone} with one replica: no other can serve it meanwhile)" if alone else ""
        problems.append(f"{len(failed)} bucket(s) failed and wait to be reopened{note}, e.g. "
                        f"{_named(first.table, first.bucket)}: {first.store.files.failure}")
    stepped_down = dict(step_down.stepped_down) if step_down is not None else {}
    problems += step_down_problems(stepped_down, dict(step_down.kept) if step_down is not None else {})
    fds, limit = open_fd_count(), fd_limit()
    if fds > FD_WARNING * limit:
        problems.append(f"{fds} of {limit} file descriptors open")
    return Health(buckets=len(led) + len(refused), unserved=len(refused) + len(failed),
                  capacity=replicas.max_buckets, open_buckets=len(replicas.budget),
                  max_open_buckets=replicas.budget.capacity,
                  recovering=sum(not r.store.files.known for r in led), parked_total=replicas.budget.parked,
                  open_fds=fds, max_fds=limit, problems=tuple(problems), snapshot_lag_records=snapshot_lag(led),
                  stepped_down=stepped_down, resignations=step_down.resignations if step_down is not None else 0)


def step_down_problems(stepped_down: Mapping[tuple[int, int], SteppedDown], kept: Mapping[tuple[int, int], str],
                       shown: int = 3) -> list[str]:
    """The problems of buckets whose local writes failed: those that gave up their leadership (until back
    in sync) and those that keep it for want of another in-sync replica; ``shown`` of each named."""
    problems = []
    if stepped_down:
        named = ", ".join(f"bucket {b} of table {s.table}{f' partition {s.partition}' if s.partition else ''} ({s.cause})"
                          for (_t, b), s in sorted(stepped_down.items())[:shown])
        more = f" and {len(stepped_down) - shown} more" if len(stepped_down) > shown else ""
        problems.append(f"gave up leading {len(stepped_down)} bucket(s) whose local writes failed: {named}{more}; "
                        "each follows its new leader until its writes work and it is back in sync")
    if kept:
        named = "; ".join(why for _key, why in sorted(kept.items())[:shown])
        more = f"; and {len(kept) - shown} more" if len(kept) > shown else ""
        problems.append(f"{len(kept)} bucket(s) cannot write and keep their leadership here: {named}{more}")
    return problems


def snapshot_lag(led: list) -> int:
    """The most changelog records of one of ``led`` not in its last committed snapshot (0: none)."""
    lag = 0
    for replica in led:
        offsets = replica.store.files.known_offsets()
        if offsets is not None:
            lag = max(lag, offsets[1] - max(replica.snapshot_offset, 0))
    return lag


class HealthCollector:
    """The ``kvlease_tablet_*`` gauges, computed at scrape time; register it with a CollectorRegistry."""

    def __init__(self, replicas: ReplicaManager, step_down: StepDown | None = None) -> None:
        self.replicas = replicas
        self.step_down = step_down

    def describe(self):  # registering must not call collect()
        return []

    def collect(self):
        h = health(self.replicas, self.step_down)
        for name, text, value in (
                ("kvlease_tablet_healthy", "1 if the server serves every bucket it leads and has file descriptors "
                                           "to spare", int(h.healthy)),
                ("kvlease_tablet_buckets", "buckets this server is told to lead", h.buckets),
                ("kvlease_tablet_buckets_unserved", "buckets it leads but cannot serve (over capacity, or failed)",
                 h.unserved),
                ("kvlease_tablet_buckets_max", "the most buckets it leads (tablet.buckets.max)", h.capacity),
                ("kvlease_tablet_buckets_open", "buckets with open files", h.open_buckets),
                ("kvlease_tablet_buckets_open_max", "the most buckets with open files (tablet.buckets.max-open)",
                 h.max_open_buckets),
                ("kvlease_tablet_buckets_recovering", "buckets not opened since the server started", h.recovering),
                ("kvlease_tablet_open_fds", "file descriptors open", h.open_fds),
                ("kvlease_tablet_max_fds", "the open-file limit", h.max_fds),
                ("kvlease_tablet_snapshot_lag_records", "the most changelog records of one bucket it leads not yet "
                                                        "in a committed snapshot", h.snapshot_lag_records)):
            yield GaugeMetricFamily(name, text, value=value)
        yield CounterMetricFamily("kvlease_tablet_buckets_parked", "buckets whose files were closed while idle",
                                  value=h.parked_total)
        yield CounterMetricFamily("kvlease_tablet_leader_resignations", "leaderships given up because the "
                                  "bucket's local writes failed (tablet/replicas/step_down.py)", value=h.resignations)
        stepped = GaugeMetricFamily("kvlease_tablet_bucket_stepped_down", "1 for each bucket that gave up its "
                                    "leadership because its local writes failed, until it is back in sync",
                                    labels=["table_id", "table", "partition", "bucket", "cause"])
        for (physical_id, bucket), s in sorted(h.stepped_down.items()):
            stepped.add_metric([str(s.table_id or physical_id), s.table, s.partition, str(bucket), s.cause], 1)
        yield stepped
        problems = GaugeMetricFamily("kvlease_tablet_problem", "why the server is unhealthy (one series each)",
                                     labels=["problem"])
        for problem in h.problems:
            problems.add_metric([problem], 1)
        yield problems
