"""A Spark bootstrap-then-tail query across a coordinator failover (and, if planned, a tablet server
failover): the scenario ``kvlease demo`` shows and the ``spark-failover`` drill checks.

:func:`run` works on a running local cluster (``ops.local_cluster``, at least two
coordinators and one tablet server; two for a tablet failover) and a SparkSession with the kvlease
source registered:

1. creates the table (:mod:`kvlease.ops.streaming.change_writer`), loads ``rows`` rows and
   snapshots every bucket: the bootstrap leases these snapshots;
2. starts the streaming query of :mod:`kvlease.ops.streaming.stream_query` (``lease.id``
   chosen here; Parquet, one directory per micro-batch) on a
   processing-time trigger;
3. a writer thread makes ``rows`` more changes (inserts, updates, deletes) in
   rounds and asks for new snapshots now and then, which would subsume the
   bootstrap's snapshots if the lease did not hold them;
4. inside the bootstrap micro-batch, once the writer has done
   ``kill_after_round`` rounds (it pauses there until then), kills the
   active coordinator with SIGKILL and waits until the standby serves (the
   query holds its lease and renews it meanwhile); only then does the
   bootstrap read its snapshots. The writer goes on during the failover;
   its last ``tail_rounds`` rounds wait until the bootstrap is written, so
   that the query tails them;
4b. if the plan says so (``kill_tablet_after_round``; the demo's table has
   replication factor 2), after that round, while the query tails, the
   tablet server leading bucket 0 is killed with SIGKILL in a thread of its
   own (:mod:`kvlease.ops.streaming.leader_kill`): the writer's and the query's clients
   follow the new leaders; the server is started again and catches up;
5. when the writer is done, waits until the query has read up to the
   table's end offsets, stops it and reads the output back with pyarrow;
6. checks (:mod:`kvlease.ops.streaming.feed_check`): the output applied in offset order equals
   the table, no change record is missing or doubled, the table holds every
   acknowledged write (and the changelog each of them once), the lease held
   every bucket's snapshot, survived the failover and was released once the
   bootstrap was committed; the killed tablet server's buckets were served
   again elsewhere and it came back in sync.

Everything it starts (the query, the writer, the lease watcher) is stopped
when it returns or raises; the table stays (the caller drops it).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops import local_cluster
import kvlease.ops.streaming.feed_check as feed_check
import kvlease.ops.streaming.stream_query as stream_query
from kvlease.ops.streaming.change_writer import COLUMNS, KEY, VALUES, ChangeWriter
from kvlease.ops.streaming.leader_kill import LeaderKill
from kvlease.ops.check import Check

Progress = Callable[[str], None]


class Aborted(errors.KvLeaseError):
    """The scenario was asked to stop (Ctrl-C) while the query was running."""


@dataclass(frozen=True)
class Plan:
    """What :func:`run` does; the defaults make a run of about a minute."""

    table: str = "demo.orders"
    rows: int = 100_000  # loaded before the snapshot; the writer then makes as many changes
    buckets: int = 4
    rounds: int = 30
    round_interval_s: float = 0.5
    kill_after_round: int = 8  # the writer pauses after it until the bootstrap has killed the coordinator
    tail_rounds: int = 10  # the last rounds wait until the bootstrap is in Parquet: the query tails them
    snapshot_every: int = 5  # writer rounds between snapshot requests
    lease_duration: str = "30s"  # renewed every third of it while the bootstrap runs; well above a failover
    trigger: str = "1 second"
    catch_up_timeout_s: float = 180.0
    failover_timeout_s: float = 60.0
    replication_factor: int = 1  # the table's; the demo's is 2
    min_insync_replicas: int = 1
    #: 0: no tablet failover; else after this writer round (one of the last ``tail_rounds``, while the query
    #: tails) the tablet server leading bucket 0 is killed with SIGKILL, then started again
    #: (:mod:`kvlease.ops.streaming.leader_kill`); needs ``replication_factor`` 2 or more
    kill_tablet_after_round: int = 0


@dataclass
class Outcome:
    """What a run observed: its checks and figures, and what the failover did."""

    plan: Plan
    lease_id: str
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    failover: dict[str, Any] = field(default_factory=dict)  # killed, killed_pid, active, seconds
    #: the tablet failover (:class:`kvlease.ops.streaming.leader_kill.LeaderKill` ``result``): killed, killed_pid, buckets,
    #: new_leaders, seconds, restarted, restart_s, in_sync_s; empty when the plan has none
    tablet_failover: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


# -- the lease, seen from outside ----------------------------------------------------------------------


class LeaseWatch:
    """Polls the active coordinator's lease list for one lease: every deadline it was given (acquire,
    renewals, a failover grace), and when it disappeared."""

    def __init__(self, addresses: list[str], lease_id: str, interval_s: float = 0.25) -> None:
        self.lease_id = lease_id
        self.deadlines: list[int] = []  # ms since the epoch, each new one once
        self.gone_at_ms: int | None = None
        self._admin = AdminClient(addresses, request_timeout_s=1.0, retry_total_s=0)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvlease-lease-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                leases = self._admin.list_leases()
            except errors.KvLeaseError:
                continue  # no active coordinator right now
            now_ms = int(time.time() * 1000)
            lease = next((lease for lease in leases if lease.lease_id == self.lease_id), None)
            if lease is not None:
                if not self.deadlines or lease.expiration_time != self.deadlines[-1]:
                    self.deadlines.append(lease.expiration_time)
                self.gone_at_ms = None
            elif self.deadlines and self.gone_at_ms is None:
                self.gone_at_ms = now_ms

    @property
    def released(self) -> bool:
        """Gone before its latest deadline: released, not expired."""
        return self.gone_at_ms is not None and bool(self.deadlines) and self.gone_at_ms < max(self.deadlines)

    def saw_deadline(self, expiration_time: int) -> None:
        """A deadline another client saw the lease with (call after :meth:`stop`). Polling from outside,
        the watch can miss a lease that lived a second or two on the new active coordinator."""
        if expiration_time not in self.deadlines:
            self.deadlines.append(expiration_time)

    def saw_gone(self, at_ms: int) -> None:
        """Another client's listing at ``at_ms`` did not hold the lease (call after :meth:`stop`)."""
        if self.gone_at_ms is None:
            self.gone_at_ms = at_ms

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._admin.close()


# -- the failover ------------------------------------------------------------------------------------


def fail_over(cluster_dir: str, admin: AdminClient, abort: threading.Event, timeout_s: float,
              progress: Progress, on_kill: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """``kill -9`` the active coordinator (then calls ``on_kill``); returns once another one is active and
    answers a lease listing."""
    old = local_cluster.active_coordinator(cluster_dir)
    started = time.monotonic()
    pid = local_cluster.kill(cluster_dir, "coordinators", old["id"])
    progress(f"killed the active coordinator {old['id']} (pid {pid}) with SIGKILL; waiting for the standby")
    on_kill()
    deadline = started + timeout_s
    while True:
        if abort.is_set():
            raise Aborted("stopped while waiting for the standby coordinator")
        try:
            new = local_cluster.active_coordinator(cluster_dir, timeout_s=0.2)
            admin.list_leases()
            break
        except errors.KvLeaseError:
            if time.monotonic() > deadline:
                raise local_cluster.ClusterError(f"no coordinator took over within {timeout_s:g}s of killing "
                                                 f"coordinator {old['id']}") from None
    seconds = time.monotonic() - started
    progress(f"coordinator {new['id']} is active and serving, {seconds:.1f}s after the kill")
    return {"killed": old["id"], "killed_pid": pid, "active": new["id"], "seconds": seconds}


# -- the run -------------------------------------------------------------------------------------------


def run(cluster_dir: str, spark, work_dir: str | Path, plan: Plan = Plan(), *,
        progress: Progress = lambda text: None, abort: threading.Event | None = None) -> Outcome:
    """Run the scenario (module docstring) on the cluster in ``cluster_dir``; see :class:`Outcome`.
    ``abort`` (set it from another thread, e.g. on Ctrl-C) stops the failover and the writer's waits."""
    return _Scenario(cluster_dir, Path(work_dir), plan, progress, abort or threading.Event()).run(spark)


class _Scenario:
    """One run: the writer thread and the query's bootstrap hook meet here."""

    def __init__(self, cluster_dir: str, work: Path, plan: Plan, progress: Progress, abort: threading.Event) -> None:
        self.cluster_dir = cluster_dir
        self.plan = plan
        self.progress = progress
        self.abort = abort
        self.output_dir, self.checkpoint = work / "output", work / "checkpoint"
        self.addresses = local_cluster.bootstrap(cluster_dir)
        self.outcome = Outcome(plan, lease_id=f"{plan.table}-{uuid.uuid4().hex[:12]}")
        self.kill_now = threading.Event()  # the writer has done plan.kill_after_round rounds (or stopped)
        self.killed = threading.Event()  # the active coordinator was killed
        self.bootstrapped = threading.Event()  # the bootstrap micro-batch is in Parquet
        self.stop_writer = threading.Event()
        self.writer_failed: list[BaseException] = []
        self.sink = stream_query.ParquetSink(self.output_dir, self._on_bootstrap, progress,
                                             on_written=lambda batch: self.bootstrapped.set())
        self.admin: AdminClient | None = None
        self.writer: ChangeWriter | None = None
        self.leader_kill: LeaderKill | None = None  # the plan's tablet failover, if any

    def run(self, spark) -> Outcome:
        plan, progress = self.plan, self.progress
        query = watch = writer_thread = None
        with AdminClient(self.addresses, retry_total_s=60) as self.admin:
            try:
                self._create_table()
                with TableClient(self.admin, plan.table) as client:
                    self.writer = ChangeWriter(client)
                    self._load(client)
                    if plan.kill_tablet_after_round:
                        self.leader_kill = LeaderKill(self.cluster_dir, self.admin, client.table.table_id, 0,
                                                      plan.failover_timeout_s, progress, self.abort)
                    watch = LeaseWatch(self.addresses, self.outcome.lease_id)
                    progress(f"starting the streaming query (bootstrap from leased snapshots, then the changelog; "
                             f"lease {self.outcome.lease_id}) -> Parquet in {self.output_dir}")
                    started = time.monotonic()
                    query = stream_query.start(spark, self.addresses, plan.table, self.outcome.lease_id,
                                               plan.lease_duration, plan.trigger, self.sink, self.checkpoint)
                    writer_thread = threading.Thread(target=self._write, name="kvlease-demo-writer", daemon=True)
                    writer_thread.start()
                    while writer_thread.is_alive():
                        writer_thread.join(0.2)
                        if not query.isActive:
                            raise stream_query.failed(query)
                    if self.writer_failed:
                        raise self.writer_failed[0]
                    return self._finish(client, query, watch, started)
            finally:
                self.abort.set()
                self.stop_writer.set()
                if query is not None and query.isActive:
                    query.stop()
                if writer_thread is not None:
                    writer_thread.join(60)
                if self.leader_kill is not None:  # it may be starting the server again: not after the caller's
                    self.leader_kill.join(15)     # cluster stop, which would leave that process running
                if watch is not None:
                    watch.stop()

    def _create_table(self) -> None:
        plan = self.plan
        if plan.kill_tablet_after_round and not (
                plan.replication_factor >= 2 and plan.rounds - plan.tail_rounds < plan.kill_tablet_after_round
                <= plan.rounds):
            raise errors.InvalidRequestError(
                f"a tablet failover needs replication factor 2 or more (got {plan.replication_factor}) and a "
                f"round among the last {plan.tail_rounds} of {plan.rounds} (got {plan.kill_tablet_after_round})")
        self.admin.create_table(plan.table, COLUMNS, KEY, plan.buckets, replication_factor=plan.replication_factor,
                                min_insync_replicas=plan.min_insync_replicas)

    def _finish(self, client: TableClient, query, watch: LeaseWatch, started: float) -> Outcome:
        """After the writer: the query catches up and stops, the tablet failover ends; the checks."""
        plan, progress = self.plan, self.progress
        final_ends = {b: latest for b, (_, latest) in client.list_offsets().items()}
        progress(f"writer done: {self.writer.changes:,} changes after the snapshot; waiting for the "
                 "query to read up to the end of every bucket")
        stream_query.catch_up(query, self.sink, self.checkpoint, final_ends, plan.catch_up_timeout_s,
                              self.abort.is_set)
        query.stop()
        query_s = time.monotonic() - started
        progress(f"the query caught up after {self.sink.last_batch + 1} micro-batches; stopped it; checking")
        if self.leader_kill is not None:
            self.leader_kill.join(2 * plan.failover_timeout_s)
            self.outcome.tablet_failover = dict(self.leader_kill.result)
        scan = client.scan()
        leases_now = {lease.lease_id for lease in self.admin.list_leases()}
        listed_at_ms = int(time.time() * 1000)  # after the answer: no earlier than it was gone
        watch.stop()
        if "lease_deadline" in self.outcome.failover:
            watch.saw_deadline(self.outcome.failover["lease_deadline"])
        if self.outcome.lease_id not in leases_now:
            watch.saw_gone(listed_at_ms)
        output = stream_query.read_output(self.output_dir)
        bootstrap = stream_query.checkpoint_offsets(self.checkpoint, 0)
        self.outcome.checks = _checks(self.outcome, output, scan.to_table(), self.writer, bootstrap,
                                      final_ends, scan.log_offsets, watch, leases_now)
        if self.leader_kill is not None:
            self.outcome.checks += self.leader_kill.checks()
        self.outcome.figures.update(_figures(self.outcome, output, self.writer, bootstrap, watch, query_s))
        return self.outcome

    def _load(self, client: TableClient) -> None:
        plan, reported = self.plan, [0]

        def loaded(done: int) -> None:
            if done - reported[0] >= plan.rows / 4 or done == plan.rows:
                reported[0] = done
                self.progress(f"loaded {done:,} rows")

        self.progress(f"created table {plan.table} ({plan.buckets} buckets); loading {plan.rows:,} rows")
        self.writer.load(plan.rows, loaded)
        committed = client.trigger_snapshot(wait=True)
        self.progress(f"snapshot of every bucket committed (snapshot ids "
                      f"{', '.join(f'{s.bucket}={s.snapshot_id}' for s in committed)}); the bootstrap will lease them")

    # -- the writer thread ---------------------------------------------------------------------------

    def _write(self) -> None:
        plan = self.plan
        try:
            self.writer.run(plan.rounds, max(4, plan.rows // plan.rounds), plan.round_interval_s, self.stop_writer,
                            snapshot_every=plan.snapshot_every, on_round=self._on_round)
        except BaseException as exc:  # raised again by the main thread
            self.writer_failed.append(exc)
        finally:
            self.kill_now.set()  # the bootstrap kills the coordinator anyway

    def _on_round(self, writer: ChangeWriter) -> None:
        plan, done = self.plan, writer.rounds_done
        if done % 5 == 0 or done == plan.rounds:
            self.progress(f"writer: round {done}/{plan.rounds}, {writer.changes:,} changes so far")
        if done == plan.kill_after_round:
            self.kill_now.set()
            if not self.killed.is_set():
                self.progress(f"writer: round {done} done; pausing until the query's bootstrap has started and "
                              "the coordinator is killed")
                self._wait_for(self.killed)
        if done == plan.kill_tablet_after_round and self.leader_kill is not None:
            self.leader_kill.trigger()  # in its own thread: the writer goes on at once
        if done == plan.rounds - plan.tail_rounds and self.sink.last_batch is None:
            self.progress(f"writer: pausing until the bootstrap is in Parquet, then the last {plan.tail_rounds} "
                          "rounds (the query tails them)")
            self._wait_for(self.bootstrapped)

    def _wait_for(self, event: threading.Event) -> None:
        while not event.is_set() and not self.stop_writer.wait(0.1):
            pass

    # -- inside the bootstrap micro-batch (a py4j callback thread) -------------------------------------

    def _on_bootstrap(self) -> None:
        while not self.kill_now.wait(0.1):
            if self.abort.is_set():
                raise Aborted("stopped before the failover")
        outcome = self.outcome
        outcome.failover = fail_over(self.cluster_dir, self.admin, self.abort, self.plan.failover_timeout_s,
                                     self.progress, on_kill=self.killed.set)
        held = self.admin.describe_lease(outcome.lease_id)
        outcome.failover["lease_snapshots"] = {tb.bucket: s for tb, s in held.buckets.items()}
        outcome.failover["lease_deadline"] = held.expiration_time
        self.progress(f"lease {outcome.lease_id} still holds {len(held.buckets)} snapshot(s) on the new active "
                      "coordinator; the bootstrap reads them now")


def _checks(outcome: Outcome, output: pa.Table, table: pa.Table, writer: ChangeWriter,
            bootstrap: dict[int, tuple[int, int]], final_ends: dict[int, int], scanned_at: dict[int, int],
            watch: LeaseWatch, leases_now: set[str]) -> list[Check]:
    plan = outcome.plan
    bootstrap_ends = {b: offset for b, (_, offset) in bootstrap.items()}
    leased = {b: s for b, (s, _) in bootstrap.items() if s != -1}
    after = outcome.failover.get("lease_snapshots", {})
    moved = [f"bucket {b}: scanned at offset {scanned_at.get(b)}, the query read to {end}"
             for b, end in final_ends.items() if scanned_at.get(b) != end]
    return [
        feed_check.check_bootstrap(output, KEY, bootstrap_ends),
        feed_check.check_tail(output, bootstrap_ends, final_ends),
        Check.of("the table was read at the offsets the query reached", moved, len(final_ends)),
        feed_check.check_state(output, table, KEY, VALUES),
        feed_check.check_written(writer.expected, table, KEY, VALUES),
        Check.of("the changelog holds every acknowledged write once (a retried write is not applied twice)",
                 [] if sum(final_ends.values()) == writer.records else
                 [f"the buckets' changelogs hold {sum(final_ends.values()):,} records, the writer's acknowledged "
                  f"writes make {writer.records:,}"], writer.records),
        Check.of("the bootstrap leased a snapshot of every bucket",
                 [f"bucket {b}: bootstrapped without a snapshot" for b in range(plan.buckets) if b not in leased],
                 plan.buckets),
        Check.of("the lease held the same snapshots on the new active coordinator",
                 [f"bucket {b}: snapshot {s} leased, {after.get(b)} after the failover"
                  for b, s in leased.items() if after.get(b) != s], len(leased)),
        Check.of("the lease was released (not expired) once the bootstrap was committed",
                 ([f"lease {outcome.lease_id} is still listed"] if outcome.lease_id in leases_now else [])
                 + ([] if watch.released else [f"lease {outcome.lease_id} was not seen released before its "
                                               "deadline"]), 1),
    ]


def _figures(outcome: Outcome, output: pa.Table, writer: ChangeWriter, bootstrap: dict[int, tuple[int, int]],
             watch: LeaseWatch, query_s: float) -> dict[str, Any]:
    batches = output.column("_batch").to_numpy()
    bootstrap_rows = int((batches == 0).sum())
    leased = sum(1 for s, _ in bootstrap.values() if s != -1)
    return {
        "rows_loaded": writer.loaded,
        "changes_written": writer.changes,
        "writer_longest_round_s": writer.longest_round_s,
        "table_rows": len(writer.expected),
        "bootstrap_rows": bootstrap_rows,
        "change_rows": output.num_rows - bootstrap_rows,
        "micro_batches": int(batches.max()) + 1 if len(batches) else 0,
        "snapshots_leased": leased,
        "snapshots_released": leased if watch.released else 0,
        "lease_renewals_seen": max(0, len(watch.deadlines) - 1),
        "failover_s": outcome.failover.get("seconds"),
        "query_s": query_s,
    }
