"""Lease traffic and what the lease drills read back (coordinator-failover, zk-leader-loss, remote-outage).

:class:`LeaseDrill` gives a drill its own table with real snapshots, a
*snapshotter* (writes rows and triggers a snapshot every 0.2 s, so old
snapshots are subsumed while leases hold some), and *clients*: threads, each
with its own :class:`~kvlease.client.admin.AdminClient`, that acquire (random
snapshots of random buckets), renew, release and drop their own leases and
record every call (:class:`~kvlease.ops.drills.checks.LeaseOp`). Once stopped it reads
the leases back from the active coordinator (describe and list) and from
ZooKeeper + the lease files (:mod:`kvlease.ops.drills.lease_layout`: the documented layout, not
the coordinator's code), and the files of every leased snapshot; then
:meth:`LeaseDrill.checks` runs the checkers. Closing drops the drill's leases
and its table.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Callable, Mapping

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.kvsnapshot import manifest_path, read_manifest
from kvlease.common.model import TableBucket
from kvlease.common.storage import StorageNotFound
from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.ops.check import Check
from kvlease.ops.drills.checks import (NOT_FOUND, OK, UNKNOWN, LeaseOp, LeaseView, leased_files_exist,
                                       leases_as_acknowledged, no_deposed_writes)
from kvlease.ops.drills.cluster import DrillCluster
from kvlease.ops.drills.crew import Crew
from kvlease.ops.drills.lease_layout import lease_nodes, persisted_views, view_of
from kvlease.ops.drills.workload import error_name
from kvlease.ops.drills.zk_txnlog import read_txns
from kvlease.ops.wait import poll

DURATION_MS = 10 * 60_000  # nothing expires during a drill
THINK_S = 0.05  # between two calls of one client
LEASES_PER_CLIENT = 2
SNAPSHOT_EVERY_S = 0.2
RECENT_SNAPSHOTS = 4  # a client picks among the newest few (the oldest may be gone: "unavailable")
#: Clients back off at most half a second between retries: they find a new active coordinator soon
#: after it serves, so the recovery time measured is the cluster's, not the clients' backoff.
CLIENT_CONFIG = cfg.Config({cfg.CLIENT_RETRY_MAX_WAIT.name: "500ms"}, env={})


class Snapshotter:
    """Writes a few rows and triggers a snapshot of the table every ``every_s``; keeps the newest ids."""

    def __init__(self, cluster: DrillCluster, table: str, every_s: float = SNAPSHOT_EVERY_S) -> None:
        self.client = TableClient(cluster.admin, table, retry_total_s=10.0, request_timeout_s=5.0,
                                  snapshot_timeout_s=10.0)
        self.every_s = every_s
        self.recent: dict[int, list[int]] = defaultdict(list)
        self.committed: set[tuple[int, int]] = set()
        self.failures: Counter = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._busy = threading.Lock()  # held while a snapshot is written: pause() waits for it
        self._thread = threading.Thread(target=self._run, name="drill-snapshotter", daemon=True)
        self._next_key = 0

    def snapshot_once(self, rows: int = 8) -> None:
        keys = range(self._next_key, self._next_key + rows)
        self._next_key += rows
        self.client.upsert([{"id": k % 1000, "v": k, "pad": "x" * 32} for k in keys])
        for s in self.client.trigger_snapshot(wait=True):
            with self._lock:
                self.committed.add((s.bucket, s.snapshot_id))
                self.recent[s.bucket] = (self.recent[s.bucket] + [s.snapshot_id])[-RECENT_SNAPSHOTS:]

    def wait_new(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` more snapshots than now are committed (so some get subsumed)."""
        with self._lock:
            target = len(self.committed) + count

        def committed_or_stopped() -> str | None:
            with self._lock:
                if len(self.committed) >= target:
                    return "committed"
            return None if self._thread.is_alive() else "stopped"
        return poll(committed_or_stopped, timeout_s, interval_s=0.02)[0] == "committed"

    def choices(self) -> dict[int, list[int]]:
        with self._lock:
            return {bucket: list(ids) for bucket, ids in self.recent.items() if ids}

    def start(self) -> None:
        self._thread.start()

    def pause(self) -> None:
        """No more writes or snapshots until :meth:`resume` (returns once the one in flight is done)."""
        self._paused.set()
        with self._busy:
            pass

    def resume(self) -> None:
        self._paused.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._busy:
                if self._paused.is_set():
                    continue
                try:
                    self.snapshot_once()
                except Exception as exc:  # counted in the figures; the snapshotter goes on
                    self.failures[error_name(exc)] += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.client.close()


class LeaseClients:
    """``count`` client threads calling lease procedures on their own lease ids; every call recorded."""

    def __init__(self, addresses: list[str], table_id: int, choices: Callable[[], dict[int, list[int]]],
                 prefix: str, count: int, seed: int, *, request_timeout_s: float = 5.0,
                 retry_total_s: float = 20.0) -> None:
        self.addresses = addresses
        self.table_id = table_id
        self.choices = choices
        self.prefix = prefix
        self.request_timeout_s = request_timeout_s
        self.retry_total_s = retry_total_s
        self.history: dict[str, list[LeaseOp]] = {f"{prefix}{i}-{k}": [] for i in range(count)
                                                  for k in range(LEASES_PER_CLIENT)}
        self.ops: list[LeaseOp] = []
        self._last_ok_start = [0.0] * count  # per client: when its last acknowledged call started
        self._lock = threading.Lock()
        self._crew = Crew("drill-client", self._run, [(i, random.Random(seed * 1000 + i)) for i in range(count)])
        self._stop = self._crew.stop_event

    def start(self) -> None:
        self._crew.start()

    def stop(self) -> None:
        stuck = self._crew.stop(self.retry_total_s + 2 * self.request_timeout_s + 10)
        if stuck:
            raise errors.KvLeaseError(f"drill clients did not stop: {', '.join(stuck)}")

    # -- what they did -------------------------------------------------------------------------

    def snapshot(self) -> list[LeaseOp]:
        with self._lock:
            return list(self.ops)

    def first(self, pred: Callable[[LeaseOp], bool]) -> LeaseOp | None:
        return min((op for op in self.snapshot() if pred(op)), key=lambda op: op.t1, default=None)

    def wait_for(self, pred: Callable[[LeaseOp], bool], timeout_s: float, count: int = 1) -> LeaseOp | None:
        """The first call (by end time) matching ``pred`` once ``count`` have, or None after ``timeout_s``."""
        def enough() -> list[LeaseOp] | None:
            matching = sorted((op for op in self.snapshot() if pred(op)), key=lambda op: op.t1)
            return matching if len(matching) >= count else None
        matching, found = poll(enough, timeout_s, interval_s=0.02)
        return matching[0] if found else None

    def more_acks(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` more calls than now are acknowledged; False if not within ``timeout_s``."""
        now = time.time()
        return self.wait_for(lambda op: op.outcome == OK and op.t1 > now, timeout_s, count) is not None

    def settled(self, after: float, timeout_s: float) -> bool:
        """Wait until every client had a call acknowledged that it sent after ``after`` (no call
        left from before a fault: the next fault then meets only new calls)."""
        return poll(lambda: min(self._last_ok_start) > after, timeout_s, interval_s=0.02)[1]

    def outcomes(self) -> dict[str, int]:
        counts = Counter(f"{op.kind} {op.outcome if op.outcome != UNKNOWN else op.error}" for op in self.snapshot())
        return dict(sorted(counts.items()))

    # -- one client -----------------------------------------------------------------------------

    def _run(self, index: int, rng: random.Random) -> None:
        ids = [f"{self.prefix}{index}-{k}" for k in range(LEASES_PER_CLIENT)]
        held: dict[str, dict[TableBucket, int]] = {}  # as last acknowledged, to pick what to release
        with AdminClient(self.addresses, CLIENT_CONFIG, request_timeout_s=self.request_timeout_s,
                         retry_total_s=self.retry_total_s) as client:
            while not self._stop.wait(rng.uniform(0, 2 * THINK_S)):
                lease_id = rng.choice(ids)
                op = self._call(client, rng, lease_id, held.get(lease_id))
                if op is None:
                    continue
                if op.outcome == OK and op.kind == "acquire":
                    held[lease_id] = {**held.get(lease_id, {}), **op.acquired} if op.expiration else {}
                elif op.outcome == OK and op.kind == "release" and held.get(lease_id):
                    held[lease_id].pop(op.bucket, None)
                elif op.kind in ("drop",) or op.outcome != OK:
                    held.pop(lease_id, None)
                self.history[lease_id].append(op)
                with self._lock:
                    self.ops.append(op)
                if op.outcome == OK:
                    self._last_ok_start[index] = op.t0

    def _call(self, client: AdminClient, rng: random.Random, lease_id: str,
              held: Mapping[TableBucket, int] | None) -> LeaseOp | None:
        choices = self.choices()
        kind = rng.choices(["acquire", "renew", "release", "drop"], weights=[4, 3, 2, 1])[0] if held else "acquire"
        base: dict[str, Any] = {"lease_id": lease_id, "kind": kind}
        if kind == "acquire":
            if not choices:
                return None
            picked = rng.sample(sorted(choices), rng.randint(1, len(choices)))
            base["snapshots"] = {TableBucket(self.table_id, b): rng.choice(choices[b]) for b in picked}
            base["duration_ms"] = DURATION_MS
        elif kind == "renew":
            base["duration_ms"] = DURATION_MS
        elif kind == "release":
            base["bucket"] = rng.choice(sorted(held, key=TableBucket.sort_key))
        return self._invoke(client, base)

    def move_all(self, duration_ms: int) -> int:
        """Once the clients are stopped: move every lease the cluster holds to the newest snapshots of its
        buckets with a new deadline, then renew it to another one (each call recorded like the clients').
        Returns how many leases were moved."""
        moved = 0
        choices = self.choices()
        with AdminClient(self.addresses, CLIENT_CONFIG, request_timeout_s=self.request_timeout_s,
                         retry_total_s=self.retry_total_s) as client:
            for lease_id in sorted(self.history):
                try:
                    held = client.describe_lease(lease_id).buckets
                except errors.LeaseNotFoundError:
                    continue
                newest = {tb: choices[tb.bucket][-1] for tb in held if choices.get(tb.bucket)}
                for base in ({"lease_id": lease_id, "kind": "acquire", "snapshots": newest, "duration_ms": duration_ms},
                             {"lease_id": lease_id, "kind": "renew", "duration_ms": duration_ms + 60_000}):
                    op = self._invoke(client, base)
                    self.history[lease_id].append(op)
                    with self._lock:
                        self.ops.append(op)
                moved += 1
        return moved

    def _invoke(self, client: AdminClient, base: dict[str, Any]) -> LeaseOp:
        """Make the call ``base`` describes and record what came of it."""
        kind = base["kind"]
        t0 = time.time()
        try:
            lease_id = base["lease_id"]
            if kind == "acquire":
                result = client.acquire_lease(lease_id, base["snapshots"], base["duration_ms"])
                base.update(expiration=result.expiration_time, acquired=dict(result.acquired))
            elif kind == "renew":
                base["expiration"] = client.renew_lease(lease_id, base["duration_ms"])
            elif kind == "release":
                base["remains"] = client.release_lease(lease_id, [base["bucket"]]).lease_remains
            else:
                client.drop_lease(lease_id)
            return LeaseOp(**base, t0=t0, t1=time.time(), outcome=OK, address=client.address)
        except errors.LeaseNotFoundError as exc:
            outcome = NOT_FOUND if kind == "renew" else UNKNOWN
            return LeaseOp(**base, t0=t0, t1=time.time(), outcome=outcome, error=error_name(exc))
        except Exception as exc:  # the drill records every failure; the checkers judge it
            return LeaseOp(**base, t0=t0, t1=time.time(), outcome=UNKNOWN, error=error_name(exc))


class LeaseDrill:
    """A drill's table, snapshotter and lease clients; ``with`` cleans up (leases, table)."""

    def __init__(self, cluster: DrillCluster, clients: int = 16, seed: int = 0, *, request_timeout_s: float = 5.0,
                 retry_total_s: float = 20.0) -> None:
        self.cluster = cluster
        self.prefix = f"drill-{cluster.drill}-{cluster.run_id}-"
        self.since_zxid = cluster.zxid()
        self.table = cluster.create_table()
        try:
            self.table_id = cluster.admin.get_table(self.table).table_id
            self.snapshotter = Snapshotter(cluster, self.table)
        except BaseException:
            cluster.drop_table(self.table)
            raise
        self.clients = LeaseClients(cluster.addresses, self.table_id, self.snapshotter.choices, self.prefix,
                                    clients, seed, request_timeout_s=request_timeout_s, retry_total_s=retry_total_s)
        self._running = False

    def start(self) -> None:
        for _ in range(2):  # two snapshots of every bucket before the clients start
            self.snapshotter.snapshot_once(rows=64)
        self.snapshotter.start()
        self.clients.start()
        self._running = True

    def before_fault(self, acks: int = 100, timeout_s: float = 30.0) -> None:
        """Let traffic run: ``acks`` more acknowledged calls and a new snapshot of every bucket (older,
        unleased ones are subsumed meanwhile)."""
        self.clients.more_acks(acks, timeout_s)
        self.snapshotter.wait_new(len(self.snapshotter.choices()) or 1, timeout_s)

    def stop(self) -> None:
        if self._running:
            self._running = False
            try:
                self.clients.stop()
            finally:
                self.snapshotter.stop()

    # -- after the traffic -----------------------------------------------------------------------------

    def read_back(self) -> dict[str, dict[str, LeaseView | None]]:
        """The drill's leases from describe and list on the active coordinator, and from ZooKeeper + files."""
        admin = self.cluster.admin
        described: dict[str, LeaseView | None] = {}
        for lease_id in self.clients.history:
            try:
                described[lease_id] = view_of(admin.describe_lease(lease_id))
            except errors.LeaseNotFoundError:
                described[lease_id] = None
        listed = {lease.lease_id: view_of(lease) for lease in admin.list_leases()
                  if lease.lease_id.startswith(self.prefix)}
        persisted = persisted_views(lease_nodes(self.cluster.zk, self.prefix), self.cluster.storage.read)
        return {"describe": described, "list": listed, "zookeeper+files": persisted}

    def leased_files(self, readbacks: Mapping[str, Mapping[str, LeaseView | None]]) -> Check:
        """Every snapshot a lease holds as any source reads it: its manifest and files exist."""
        storage = self.cluster.storage
        leased: dict[tuple[TableBucket, int], set[str]] = defaultdict(set)
        for views in readbacks.values():
            for lease_id, view in views.items():
                for tb, sid in (view[1].items() if view else ()):
                    leased[(tb, sid)].add(lease_id)
        manifests: dict[tuple[TableBucket, int], list[str] | None] = {}
        existing = set()
        for tb, sid in leased:
            try:
                manifests[(tb, sid)] = [f.path for f in read_manifest(storage, manifest_path(tb, sid)).files]
            except StorageNotFound:
                manifests[(tb, sid)] = None
                continue
            existing.update(path for path in manifests[(tb, sid)] if storage.exists(path))
        return leased_files_exist(leased, manifests, existing)

    def checks(self) -> list[Check]:
        """Stop the traffic if needed, then every lease check: read-back, leased files, fencing."""
        self.stop()
        readbacks = self.read_back()
        txns = read_txns(self.cluster.zk_data_dirs())
        return [leases_as_acknowledged(self.clients.history, readbacks),
                self.leased_files(readbacks),
                no_deposed_writes(txns, self.cluster.root, self.since_zxid)]

    def figures(self) -> dict[str, Any]:
        ops = self.clients.snapshot()
        listed = {(s.bucket.bucket, s.snapshot_id) for s in self.cluster.admin.list_kv_snapshots(self.table_id)}
        start = min((op.t0 for op in ops), default=0.0)
        failed = [f"{op.kind} {op.lease_id}: {op.error} at +{op.t0 - start:.1f}s after {op.t1 - op.t0:.1f}s"
                  for op in ops if op.outcome != OK]
        return {"calls": len(ops), "acknowledged": sum(op.outcome == OK for op in ops),
                "outcomes": self.clients.outcomes(), "failed_calls": failed[:10],
                "snapshots_committed": len(self.snapshotter.committed),
                "snapshots_deleted": len(self.snapshotter.committed - listed),
                "snapshot_failures": dict(self.snapshotter.failures)}

    # -- cleanup -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop, drop the drill's leases and its table."""
        try:
            self.stop()
        finally:
            admin = self.cluster.admin
            for lease in admin.list_leases():
                if lease.lease_id.startswith(self.prefix):
                    admin.drop_lease(lease.lease_id)
            self.cluster.drop_table(self.table)

    def __enter__(self) -> "LeaseDrill":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
