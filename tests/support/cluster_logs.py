"""A local cluster's logs as a failed drill test prints them: what each process logged since the drill began.

A drill runs for tens of seconds and ends by making the cluster whole again, so
the last lines of a log tell what happened after a failure, not before it: a
zk-leader-loss run whose first acquire after the kill never came printed only
the final recovery. :func:`cluster_logs` shows each log from the first line
stamped at or after ``since`` (the drill's start: its first :data:`HEAD` lines
and its last :data:`TAIL`), and the last :data:`TAIL` lines of a log with no
such line.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from kvlease.ops import local_cluster

HEAD = 300
TAIL = 60
# kvlease's servers stamp "2026-12-01 08:00:00,123", ZooKeeper's "08:00:00.123": the time of day is compared
_STAMP = re.compile(r"^(?:\d{4}-\d\d-\d\d )?(\d\d):(\d\d):(\d\d)")


def cluster_logs(directory: Path, since: float | None = None) -> str:
    """The coordinators', tablet servers' and ZooKeeper nodes' logs of the cluster in ``directory``, each from
    ``since`` (a ``time.time()``; None: its last :data:`TAIL` lines)."""
    logs = (sorted(directory.glob("coordinator-*/coordinator.log")) + sorted(directory.glob("tablet-*/tablet.log"))
            + sorted(directory.glob("zookeeper/*/zookeeper.log")))
    return "\n".join(f"==> {log} <==\n{log_since(log, since)}" for log in logs)


def log_since(path: Path, since: float | None) -> str:
    """The lines of the log ``path`` from the first one stamped at or after ``since`` (see the module
    docstring)."""
    if since is None:
        return local_cluster.log_tail(path, TAIL)
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    start = _first_at_or_after(lines, _seconds_of_day(since))
    if start is None:
        return "\n".join(lines[-TAIL:]) or "(empty log)"
    window = lines[start:]
    if len(window) <= HEAD + TAIL:
        return "\n".join(window)
    return "\n".join(window[:HEAD] + [f"[... {len(window) - HEAD - TAIL} lines ...]"] + window[-TAIL:])


def _first_at_or_after(lines: list[str], second: int) -> int | None:
    """The index of the first line stamped at or after ``second`` (of the day), None if there is none. A run
    that crossed midnight is not told apart: its logs are shown from the first line after the stamp."""
    for i, line in enumerate(lines):
        if (match := _STAMP.match(line)) is not None:
            h, m, s = (int(g) for g in match.groups())
            if h * 3600 + m * 60 + s >= second:
                return i
    return None


def _seconds_of_day(when: float) -> int:
    t = time.localtime(when)
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec
