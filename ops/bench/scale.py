"""The scale parts of ``kvlease bench leases``: idle loop CPU by lease count, failover with every lease intact.

- Idle loop CPU: the coordinator's event loop accounts its own thread's CPU
  into ``kvlease_coordinator_loop_cpu_seconds_total``; with N leases held
  and no request, the bench reads that counter over a few seconds. The rule
  for "the same within noise": the rate at N leases is at most
  ``IDLE_SLACK`` x the rate at ``IDLE_BASE_LEASES`` leases plus
  ``IDLE_FLOOR_MS`` ms/s (an idle loop wakes once a tick; a few hundred
  microseconds of scheduling noise must not fail a 0.1 ms/s baseline). A loop
  that walks the leases every tick costs ~100 ms/s at 100,000: far outside.
- Leases intact: every lease the active coordinator lists before the kill,
  the new active lists after it, with the same deadline and buckets.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from kvlease.client.admin import AdminClient
from kvlease.common.model import Lease
from kvlease.ops.wait import poll

IDLE_BASE_LEASES = 1_000
IDLE_SLACK = 1.5
IDLE_FLOOR_MS = 1.0  # ms of loop CPU per second
IDLE_SETTLE_S = 1.0  # after the last request, before sampling (writes and replies finish)

_LOOP_CPU = re.compile(r"^kvlease_coordinator_loop_cpu_seconds_total\s+(\S+)$", re.MULTILINE)
_MIRROR_LOADED = re.compile(r"lease mirror loaded: (\d+) leases")
_ORPHANS_LISTED = re.compile(r"orphan lease files: \d+ of \d+ listed|could not list lease files")


def loop_cpu_s(metrics_port: int) -> float:
    """The coordinator's ``kvlease_coordinator_loop_cpu_seconds_total`` (its Prometheus endpoint)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = _LOOP_CPU.search(text)
    if match is None:
        raise RuntimeError("the coordinator exports no kvlease_coordinator_loop_cpu_seconds_total")
    return float(match.group(1))


def threads_cpu_s(pid: int) -> float:
    """CPU seconds the process's live threads have run so far, to the nanosecond
    (``/proc/PID/task/*/schedstat``): ``/proc/PID/stat`` counts 10 ms ticks, so an idle process's few
    ms per second read as 0 there. Threads that ended are not counted (an idle server starts none)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return total / 1e9


def idle_loop_cpu(metrics_port: int, process_cpu_s: Callable[[], float], leases: int,
                  seconds: float) -> dict[str, Any]:
    """Loop CPU (and the whole process's) per second over ``seconds`` with no request."""
    time.sleep(IDLE_SETTLE_S)
    loop0, proc0, t0 = loop_cpu_s(metrics_port), process_cpu_s(), time.perf_counter()
    time.sleep(seconds)
    loop1, proc1, t1 = loop_cpu_s(metrics_port), process_cpu_s(), time.perf_counter()
    elapsed = t1 - t0
    return {"leases": leases, "seconds": round(elapsed, 3),
            "loop_cpu_ms_per_s": round((loop1 - loop0) * 1000 / elapsed, 3),
            "process_cpu_ms_per_s": round((proc1 - proc0) * 1000 / elapsed, 3)}


def idle_limit_ms(base_ms_per_s: float) -> float:
    """The most loop CPU per second at N leases that is "the same within noise" as ``base_ms_per_s``."""
    return IDLE_SLACK * base_ms_per_s + IDLE_FLOOR_MS


def wait_mirror_loaded(log_path: Path, offset: int, leases: int, timeout_s: float) -> float:
    """Wait until the log (from byte ``offset``) says the lease mirror loaded at least ``leases``; seconds waited."""
    return _wait_log(log_path, offset, lambda text: any(int(n) >= leases for n in _MIRROR_LOADED.findall(text)),
                     timeout_s, f"the standby's lease mirror did not load {leases} leases")


def wait_orphans_listed(log_path: Path, offset: int, timeout_s: float) -> float:
    """Wait until a new active coordinator's background orphan-file listing is over (a one-off
    cost at start-up: listing 100,000 lease files is not what an idle coordinator costs)."""
    return _wait_log(log_path, offset, lambda text: _ORPHANS_LISTED.search(text) is not None, timeout_s,
                     "the active coordinator did not finish listing orphan lease files")


def _wait_log(log_path: Path, offset: int, found: Callable[[str], bool], timeout_s: float, what: str) -> float:
    t0 = time.perf_counter()

    def logged() -> bool:
        try:
            with open(log_path, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            text = ""
        return found(text)
    if not poll(logged, timeout_s, interval_s=0.2)[1]:
        raise RuntimeError(f"{what} within {timeout_s:g} s")
    return time.perf_counter() - t0


def lease_view(address: str) -> dict[str, tuple[int, dict]]:
    """Every lease ``address`` serves: id -> (deadline, buckets)."""
    with AdminClient([address], request_timeout_s=120.0, retry_total_s=30.0) as client:
        return view(client.list_leases())


def view(leases: list[Lease]) -> dict[str, tuple[int, dict]]:
    return {lease.lease_id: (lease.expiration_time, dict(lease.buckets)) for lease in leases}


def compare(before: dict[str, tuple[int, dict]], after: dict[str, tuple[int, dict]]) -> dict[str, Any]:
    """How the leases served after a failover differ from those before: counts and the first differences."""
    missing = sorted(set(before) - set(after))
    extra = sorted(set(after) - set(before))
    changed = sorted(lease_id for lease_id in set(before) & set(after) if before[lease_id] != after[lease_id])
    return {"before": len(before), "after": len(after), "missing": len(missing), "extra": len(extra),
            "changed": len(changed), "first_differences": (missing + extra + changed)[:5],
            "intact": not (missing or extra or changed)}
