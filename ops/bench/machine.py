"""The machine a benchmark runs on: CPU seconds of a process, waiting until a process or the whole machine is
idle, and what a recorded run says it was measured on."""

from __future__ import annotations

import os
import platform
import time
from datetime import datetime
from typing import Any


def _stat(path: str) -> list[str] | None:
    """The fields of a ``/proc/.../stat`` file after the command name (which may hold spaces): the state
    first; None if the process or thread is gone."""
    try:
        with open(path) as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):  # gone, or gone while read (nothing after the name)
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (RocksDB's flushes and
    compactions too); 0 if it is gone."""
    stat = _stat(f"/proc/{pid}/stat")
    return 0.0 if stat is None else (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def demand_seconds(pid: int) -> float:
    """Seconds the threads of process ``pid`` have so far spent on a CPU or waiting in a run queue for one
    (``/proc/PID/task/*/schedstat``): a process that computes on a machine so loaded that it seldom gets a core
    still wants one. The kernel adds a thread's wait when the thread gets the core, so a thread that got none
    yet shows no wait (:func:`runnable` sees it). :func:`cpu_seconds` where the kernel keeps no schedstat; 0
    if it is gone."""
    total, seen = 0, False
    for task in _tasks(pid):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                on_cpu_ns, waiting_ns = fh.read().split()[:2]
        except (OSError, ValueError):  # a thread that ended meanwhile, or no schedstat at all
            continue
        total, seen = total + int(on_cpu_ns) + int(waiting_ns), True
    return total / 1e9 if seen else cpu_seconds(pid)


def runnable(pid: int) -> bool:
    """Whether a thread of process ``pid`` is on a CPU or waiting for one now (state R)."""
    return any((stat := _stat(f"/proc/{pid}/task/{task}/stat")) is not None and stat[0] == "R"
               for task in _tasks(pid))


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


#: A step of :func:`wait_idle` looks at the process's threads this many times.
IDLE_SAMPLES = 10


def wait_idle(pid: int, busy_below: float = 0.05, step_s: float = 1.0, timeout_s: float = 90.0) -> float:
    """Wait until ``pid`` runs or waits to run less than ``busy_below`` of a core over ``step_s`` (e.g. the
    flushes and compactions after a load are done) or ``timeout_s`` passed; returns the seconds waited.
    Waiting for a core counts as busy: on a loaded machine a computing process is not idle because others
    held the cores, so a step is idle only if no thread of it was found runnable either (:func:`runnable`,
    :data:`IDLE_SAMPLES` times a step: the wait of a thread that never got a core in it is not counted yet)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        before, ran = demand_seconds(pid), False
        for _ in range(IDLE_SAMPLES):
            time.sleep(step_s / IDLE_SAMPLES)
            ran = ran or runnable(pid)
        if not ran and demand_seconds(pid) - before < busy_below * step_s:
            break
    return time.monotonic() - t0


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU ticks of the whole machine so far (``/proc/stat``; idle and iowait are not busy)."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def wait_machine_idle(busy_below: float = 0.1, step_s: float = 1.0, timeout_s: float = 60.0) -> float:
    """Wait until the whole machine is busy less than ``busy_below`` of its CPUs over ``step_s`` (another
    benchmark's cluster gone, the page cache written back) or ``timeout_s`` passed; returns the busy fraction
    of the last step."""
    t0 = time.monotonic()
    while True:
        busy, total = machine_cpu()
        time.sleep(step_s)
        busy2, total2 = machine_cpu()
        fraction = (busy2 - busy) / max(1, total2 - total)
        if fraction < busy_below or time.monotonic() - t0 >= timeout_s:
            return fraction


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> dict[str, Any]:
    """What the figures were measured on (load average now: call it before the run)."""
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "date": datetime.now().astimezone().isoformat(timespec="seconds")}
