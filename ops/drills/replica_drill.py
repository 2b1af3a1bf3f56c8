"""What the replica drills (rolling-restart, disk-loss, decommission) share: a replicated table of their own
under load (ops/drills/replica_traffic.py) while the drill moves servers, then everything read back and judged.

:func:`run_replica_drill` creates ``drill.<name>_<run id>`` (4 buckets, the
drill's replication factor and min.insync-replicas), waits until every
replica is in sync, writes every key once, runs the drill's ``faults`` under
the load, waits until every ISR is full again and judges: no call failed
beyond the client's retries; every bucket's replicas all in sync (none on a
server the drill moved them away from); every acknowledged write exactly
once in every replica's changelog and its effect in every replica's table;
every value a reader saw committed; the replicas' changelogs byte for byte
identical below the high watermark; the scans right and read to their end.

A replica's table is read from its data dir (ops/drills/replica_logs.py): the
rows of the snapshot it was rebuilt from, if its changelog starts above 0
(read from remote storage), with its changelog applied up to the high
watermark.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from kvlease.client.snapshot_read import read_snapshot
from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.ops.drills.cluster import DRILL_DB, DrillCluster
from kvlease.ops.drills.disk_loss_checks import replica_table
from kvlease.ops.drills.failover_checks import (Read, acknowledged_writes_in_changelog, reads_committed,
                                                replicas_identical, tables_as_acknowledged)
from kvlease.ops.drills.replica_logs import change_records, describe_frame, fingerprints, log_starts, read_replica_logs
from kvlease.ops.drills.replica_traffic import Load
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report
from kvlease.ops.drills.row_checks import scans_end_cleanly, scans_match
from kvlease.ops.drills.service_checks import isr_full, no_client_errors
import kvlease.ops.wait as ops_wait

KEYS = 400
BUCKETS = 4
IN_SYNC_BOUND_S = 30.0
REBUILD_BASE_LEASE_MS = 600_000  # longer than any drill; the lease is dropped at its end

#: ``faults(cluster, client, load, report) -> outcome``: the drill's own part, run under the load; it adds its
#: own checks to ``report`` and returns figures, with optional keys ``away`` (tablet ids no replica may be on
#: at the end) and ``judge`` (a callable given every replica's table, name -> key -> value, returning checks).
Faults = Callable[[DrillCluster, TableClient, Load, Report], dict[str, Any]]


def run_replica_drill(cluster_dir: str, name: str, replication: int, min_insync: int, seed: int,
                      faults: Faults, *, snapshot_first: bool = False) -> Report:
    """Run drill ``name``'s ``faults`` on a table of its own; ``snapshot_first``: take a snapshot of every
    bucket before the load starts and lease the oldest kept one until the end (a rebuild starts from it)."""
    report = Report(name)
    with DrillCluster(cluster_dir, name, retry_total_s=60.0) as cluster:
        path = f"{DRILL_DB}.{name.replace('-', '_')}_{cluster.run_id}"
        columns = [Column("id", "BIGINT"), Column("v", "BIGINT"), Column("pad", "STRING")]
        cluster.admin.create_table(path, columns, ["id"], BUCKETS, replication_factor=replication,
                                   min_insync_replicas=min_insync)
        try:
            with TableClient(cluster.admin, path, request_timeout_s=5.0) as client:
                _run(cluster, client, replication, seed, faults, snapshot_first, report)
            report.add(cluster.whole_again())
        finally:
            if snapshot_first:
                cluster.admin.drop_lease(_base_lease_id(cluster))
            cluster.drop_table(path)
    return report


def wait_in_sync(cluster: DrillCluster, table_id: int, timeout_s: float = IN_SYNC_BOUND_S,
                 away: frozenset[int] = frozenset()) -> tuple[dict, float | None]:
    """Wait up to ``timeout_s`` until every bucket has a live leader, every replica in its ISR and none on
    ``away`` (:func:`kvlease.ops.wait.wait_in_sync` with :func:`~kvlease.ops.drills.service_checks.isr_full` as its rule);
    returns the buckets' state then and the seconds it took (None: it did not happen)."""
    def lagging(state: dict) -> list[str]:
        return list(isr_full(state, len(next(iter(state.values())).replicas), away).violations)

    state, _behind, took = ops_wait.wait_in_sync(cluster.admin, table_id, timeout_s, lagging=lagging)
    return state, took


def _lease_rebuild_bases(cluster: DrillCluster, table_id: int) -> None:
    """Lease the oldest kept snapshot of every bucket (``drill-<name>-<run id>``, dropped before the table) until
    the drill ends: a rebuild starts from the oldest kept snapshot, and the judge reads a rebuilt replica's rows
    from it (:func:`_snapshot_bases`). Unleased, ``kv.snapshot.num-retained`` (2) deletes it once two newer
    ones are taken (one every ``kv.snapshot.interval``, 30 s), which a loaded machine reaches within one drill:
    the check then failed with "no kept snapshot has that log offset" although no replica lost anything."""
    oldest: dict = {}
    for info in cluster.admin.list_kv_snapshots(table_id):
        if info.bucket not in oldest or info.snapshot_id < oldest[info.bucket]:
            oldest[info.bucket] = info.snapshot_id
    if oldest:
        cluster.admin.acquire_lease(_base_lease_id(cluster), oldest, REBUILD_BASE_LEASE_MS)


def _base_lease_id(cluster: DrillCluster) -> str:
    return f"{DRILL_DB}-{cluster.drill}-{cluster.run_id}"


def _run(cluster: DrillCluster, client: TableClient, replication: int, seed: int, faults: Faults,
         snapshot_first: bool, report: Report) -> None:
    table_id = client.table.table_id
    wait_in_sync(cluster, table_id)  # a new table's followers join
    keys = list(range(KEYS))
    bucket_of = {k: b for b, _rows, idx in client.split(client.key_batch(keys)) for k in (keys[i] for i in idx)}
    load = Load(client, bucket_of, seed)
    if snapshot_first:
        client.trigger_snapshot(wait=True)
        _lease_rebuild_bases(cluster, table_id)
    with load:
        time.sleep(0.5)  # the load under way
        outcome = faults(cluster, client, load, report)
        time.sleep(0.5)  # the load after the last fault
    away = frozenset(outcome.pop("away", ()))
    judge = outcome.pop("judge", None)
    state, in_sync_s = wait_in_sync(cluster, table_id, IN_SYNC_BOUND_S, away)
    hws = {b: latest for b, (_, latest) in client.list_offsets().items()}
    looked_up = {k: None if r is None else r["v"] for k, r in zip(keys, client.lookup(keys))}
    report.add(no_client_errors(load.failures(), load.calls()))
    report.add(isr_full(state, replication, away))
    tables = _judge_replicas(cluster, client, state, hws, load, looked_up, report)
    if judge is not None:
        report.checks.extend(judge(tables))
    writes = [w for ws in load.writers.history.values() for w in ws]
    report.figures.update(outcome)
    report.figures.update(
        in_sync_at_end_s=in_sync_s, calls=load.calls(), client_errors=load.failures(),
        acknowledged_writes=len(load.writers.acked), unacknowledged_writes=sum(not w.acked for w in writes),
        scans_resumed=sum(s.resumed for s in load.scans.records), high_watermarks=hws,
        leaders={b: s.leader_id for b, s in sorted(state.items())})


def _judge_replicas(cluster: DrillCluster, client: TableClient, state: dict, hws: dict[int, int], load: Load,
                    looked_up: dict[int, int | None], report: Report) -> dict[str, dict[int, int]]:
    """The data checks on every assigned replica's changelog and table; returns the tables."""
    table_id, codec = client.table.table_id, client.codec
    assigned = {b: {f"tablet {r}" for r in s.replicas} for b, s in state.items()}
    # a server no bucket is assigned to is no replica, even if its data dir still has the table's buckets (a
    # restarted server that was moved off them deletes them right after it starts: the drill may read first)
    logs = {name: held for name, buckets in read_replica_logs(cluster.doc["tablets"], table_id).items()
            if (held := {b: frames for b, frames in buckets.items() if name in assigned.get(b, ())})}
    starts = log_starts(cluster.doc["tablets"], table_id)
    decoded: dict = {}
    changelogs = {name: {b: change_records(codec, frames, hws.get(b, 0), decoded) for b, frames in buckets.items()}
                  for name, buckets in logs.items()}
    bases = _snapshot_bases(cluster, client, starts, logs)
    tables, unreadable = {}, []
    for name, buckets in changelogs.items():
        table: dict[int, int] = {}
        for b, records in buckets.items():
            base = bases.get((b, starts[name][b])) if starts[name][b] else {}
            if base is None:
                unreadable.append(f"{name}: bucket {b}'s changelog starts at {starts[name][b]} and no kept snapshot "
                                  f"has that log offset: its rows cannot be read back")
            table.update(replica_table(base, records))
        tables[name] = table
    fullest = {b: min((n for n in changelogs if b in changelogs[n]), key=lambda n: starts[n][b]) for b in state}
    committed = {b: changelogs[n][b] for b, n in fullest.items()}
    prints = {name: {b: fingerprints(frames, hws.get(b, 0)) for b, frames in buckets.items()}
              for name, buckets in logs.items()}
    reads = load.reader.reads + [Read(s.name, k, v) for s in load.scans.records for k, v in s.rows]
    report.add(acknowledged_writes_in_changelog(load.writers.acked, changelogs, starts))
    report.add(tables_as_acknowledged(load.writers.history, {"the leaders' lookup": looked_up, **tables}))
    if unreadable:
        report.add(Check.of("every replica's table read back", unreadable, len(tables)))
    report.add(reads_committed(reads, committed))
    report.add(replicas_identical(prints, hws, describe_frame))
    report.add(scans_match(load.scans.records, load.writers.history, load.writers.bucket_of))
    report.add(scans_end_cleanly(load.scans.records))
    report.figures["replica_log_starts"] = {n: s for n, s in sorted(starts.items()) if n in logs}
    return tables


def _snapshot_bases(cluster: DrillCluster, client: TableClient, starts: dict[str, dict[int, int]],
                    logs: dict) -> dict[tuple[int, int], dict[int, int] | None]:
    """``(bucket, log offset) -> rows`` of the kept snapshot at each log start above 0 of an assigned
    replica (None: no kept snapshot has it)."""
    wanted = {(b, s) for name, buckets in starts.items() if name in logs for b, s in buckets.items()
              if s and b in logs[name]}
    if not wanted:
        return {}
    kept = cluster.admin.list_kv_snapshots(client.table.table_id)
    handles = {(i.bucket.bucket, i.log_offset): i.handle for i in kept}
    bases: dict[tuple[int, int], dict[int, int] | None] = {}
    for at in sorted(wanted):
        handle = handles.get(at)
        bases[at] = None if handle is None else {
            r["id"]: r["v"] for r in read_snapshot(cluster.admin, handle, table=client.table,
                                                    storage=cluster.storage).to_pylist()}
    return bases
