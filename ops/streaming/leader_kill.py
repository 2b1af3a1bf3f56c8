"""The demo's second failover: ``kill -9`` of the tablet server that leads a bucket of a replicated table while
a streaming query tails it and a writer writes to it; then the server is started again.

:class:`LeaderKill` is a thread that waits until it is triggered, then:

1. asks the coordinator which tablet server leads ``bucket`` and which other
   buckets it leads, and kills it with SIGKILL;
2. waits until every bucket it led answers (ListOffsets) on another replica:
   the seconds this took are the failover (about the ZooKeeper session
   timeout plus an election);
3. starts the killed server again (:func:`kvlease.ops.local_cluster.restart`: it
   registers and every bucket is served) and waits until every bucket's ISR
   holds all its replicas again, so the cluster ends healthy.

The writer and the query are not touched: their clients follow the new
leaders by themselves. :attr:`LeaderKill.result` says what happened,
:attr:`LeaderKill.error` what went wrong (the caller turns it into a check).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops import local_cluster
from kvlease.ops.check import Check

Progress = Callable[[str], None]
POLL_S = 0.05


class LeaderKill:
    """Kills the leader of ``bucket`` of table ``table_id`` once :meth:`trigger` is called (see the module)."""

    def __init__(self, cluster_dir: str, admin: AdminClient, table_id: int, bucket: int, timeout_s: float,
                 progress: Progress, abort: threading.Event) -> None:
        self.cluster_dir, self.admin, self.table_id, self.bucket = cluster_dir, admin, table_id, bucket
        self.timeout_s, self.progress, self.abort = timeout_s, progress, abort
        self.result: dict[str, Any] = {}
        self.error: str | None = None
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvlease-demo-leader-kill", daemon=True)
        self._thread.start()

    def trigger(self) -> None:
        self._go.set()

    @property
    def triggered(self) -> bool:
        return self._go.is_set()

    def join(self, timeout_s: float) -> None:
        """Wait until it is done (an untriggered one is done at once); an error if it is still busy."""
        if self._go.is_set():
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self.error is None:
                self.error = f"the tablet failover was still under way {timeout_s:g}s after the writer was done"

    def checks(self) -> list[Check]:
        """Its two checks (call after :meth:`join`): the buckets served again elsewhere, the server back."""
        r = self.result
        if not self.triggered:
            failed = ["the writer stopped before the round that triggers the kill"]
        else:
            failed = [self.error] if self.error else []
        served = failed if "seconds" not in r else []
        back = (failed or ["not started again"]) if "in_sync_s" not in r else []
        return [Check.of("the killed tablet server's buckets were served again by another replica", served,
                         len(r.get("buckets", [])) or 1),
                Check.of("the killed tablet server was started again and every bucket's ISR is full again", back,
                         1)]

    def _run(self) -> None:
        while not self._go.wait(0.1):
            if self.abort.is_set():
                return
        try:
            self._kill_and_wait()
            self._restart()
        except errors.KvLeaseError as exc:
            self.error = exc.message
        except Exception as exc:  # a bug here must not vanish with the thread: the caller reports it
            self.error = f"{type(exc).__name__}: {exc}"

    def _kill_and_wait(self) -> None:
        _, leaders = self.admin.get_table_assignment(self.table_id)
        victim = leaders[self.bucket].leader_id
        led = sorted(b for b, leader in leaders.items() if leader.leader_id == victim)
        started = time.monotonic()
        pid = local_cluster.kill(self.cluster_dir, "tablets", victim)
        self.result.update(killed=victim, killed_pid=pid, buckets=led)
        self.progress(f"killed tablet server {victim} (pid {pid}), the leader of bucket(s) "
                      f"{', '.join(map(str, led))}, with SIGKILL; the writer and the query go on")
        new = self._wait_served(victim, led, started)
        self.result.update(seconds=time.monotonic() - started, new_leaders=new)
        self.progress(f"bucket(s) {', '.join(map(str, led))} served again by tablet server(s) "
                      f"{', '.join(sorted({str(n) for n in new.values()}))}, {self.result['seconds']:.1f}s after "
                      "the kill")

    def _wait_served(self, victim: int, led: list[int], started: float) -> dict[int, int]:
        """Bucket -> new leader, once every bucket of ``led`` has a leader other than ``victim`` that answers."""
        deadline = started + self.timeout_s
        with TableClient(self.admin, self.table_id, retry_total_s=0, request_timeout_s=1.0) as client:
            while True:
                self._check(deadline, f"bucket(s) {led} were not served again within {self.timeout_s:g}s of "
                                      f"killing tablet server {victim}")
                try:
                    _, leaders = self.admin.get_table_assignment(self.table_id)
                    new = {b: leaders[b].leader_id for b in led}
                    if all(leader not in (victim, -1) for leader in new.values()):
                        client.list_offsets(led)
                        return new
                except errors.KvLeaseError:
                    pass  # no leader yet, or it does not serve yet
                time.sleep(POLL_S)

    def _restart(self) -> None:
        victim = self.result["killed"]
        started = time.monotonic()
        self._check(started + self.timeout_s, "")  # stopped (Ctrl-C): no new process the caller would not stop
        local_cluster.restart(self.cluster_dir, "tablets", victim, ready_timeout_s=self.timeout_s)
        self.result.update(restarted=True, restart_s=time.monotonic() - started)
        deadline = started + self.timeout_s
        while True:
            self._check(deadline, f"tablet server {victim} was started again but not every bucket's ISR held all "
                                  f"its replicas within {self.timeout_s:g}s")
            try:
                _, leaders = self.admin.get_table_assignment(self.table_id)
                if all(set(leader.isr) == set(leader.replicas) for leader in leaders.values()):
                    break
            except errors.KvLeaseError:
                pass
            time.sleep(POLL_S)
        self.result.update(in_sync_s=time.monotonic() - started)
        self.progress(f"tablet server {victim} started again; every bucket's ISR holds all its replicas again, "
                      f"{self.result['in_sync_s']:.1f}s after the restart began")

    def _check(self, deadline: float, timeout_message: str) -> None:
        if self.abort.is_set():
            raise errors.KvLeaseError("stopped during the tablet failover")
        if time.monotonic() > deadline:
            raise local_cluster.ClusterError(timeout_message)
