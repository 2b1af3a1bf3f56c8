"""``kvlease bench rebuild`` (or ``python -m kvlease.ops.bench.rebuild``): how fast a wiped replica is rebuilt from
the bucket's remote snapshot, against a plain download of the same files.

For each ``--remote`` storage (``both``, the default: ``file`` then ``s3``), a
cluster of its own: its own ZooKeeper, coordinator and leader tablet server
(processes in a temp directory; stopped at the end whatever happens) and a
follower tablet server in this process; ``s3`` is a bucket on moto's S3
server in a process of its own (``ops/bench/local_s3.py``: the files travel
over HTTP through boto3, as from S3), ``file`` a directory of the temp
directory (with fsync; a "download" is a copy between two page-cached files
of one disk). Then:

- a one-bucket table of replication factor 2 (``min.insync-replicas`` 1); the
  follower is stopped and ``--rows`` rows (default 1,000,000; batches of
  ``--batch`` from ``--threads``) are loaded into the leader alone;
- a snapshot is committed; the table keeps no changelog it does not need
  (``log.retention`` 0 ms, ``log.segment.bytes`` 1 MB at 1M rows), so the leader's log
  now starts near the snapshot's ``log_offset``, not at 0: a replica without
  data could not fetch the whole log anyway (it rebuilds from the snapshot
  either way: it has no local data);
- a tail of ``--tail-percent`` (10) % of the rows is updated after the
  snapshot (changelog only, not in the snapshot);
- ``--rounds`` (2) times, alternating, best of each counts:
  (a) **download**: ``common.kvsnapshot.download`` of the snapshot's files
  through the storage interface into an empty directory, as the rebuild
  itself fetches them (same I/O threads), each file fsynced (``durable``:
  a replica's files must be durable, and the rebuild fsyncs each one as it
  lands): the target's anchor; and the same download into the page cache
  only (nothing durable), shown beside it;
  (b) **rebuild**: the follower's data dir is deleted and the follower
  started again; timed from its start until it is back in the ISR with
  every changelog offset of the leader applied to its RocksDB. This is the
  real code path: the fetcher finds the replica without local data, the
  ``Rebuilder`` downloads and installs the snapshot, the fetcher
  fetches and applies the tail, the leader adds it to the ISR. The time is
  split into rebuild started / snapshot installed / tail applied / back in
  the ISR; ``replica.rebuild.max-bytes-per-s`` is 0 (the rebuild's speed,
  not the operator's bound, is measured); the round
  fails if the follower was not rebuilt from the snapshot.

Each remote's rounds run twice: **quiet** (the leader idle), and **busy**: a
writer (``ops/bench/paced_writer.py``, a process of its own: a client elsewhere) upserts ``--load-rows-per-s`` (10,000)
rows/s of the table into the leader during the downloads and the rebuilds
(the rebuild then ends once the follower is in the ISR with every offset the
leader had at its start applied). Four cases, each a target row.

rows/s is the bucket's rows (``--rows``) per second, MB/s the snapshot's
bytes per second, for both; the ratio is rebuild / download (the download's
seconds over the rebuild's). Target >= 0.5: installing the snapshot and
applying the tail must not dominate the copy.

The follower runs in this process so that the time is the rebuild's, not a
Python interpreter's start (the leader serving it is a process of its own).

The suite interface (``OPTIONS``, ``run``, ``target_rows``, ``report``) is
:mod:`kvlease.ops.bench.suite`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from kvlease.common import config as cfg, kvsnapshot
from kvlease.common.tables import Column
import kvlease.ops.bench.suite as bench_suite
from kvlease.ops import local_cluster
from kvlease.ops.bench.local_s3 import local_s3
from kvlease.ops.bench.rebuild_report import TARGET_RATIO, report, target_rows
from kvlease.ops.bench.machine import wait_idle
from kvlease.ops.bench.suite import MB, Option, non_negative_int, positive_int
from kvlease.ops.bench.writes import load, make_batch
from kvlease.ops.wait import wait_until

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]
TABLE = "bench.rebuild"
FOLLOWER_ID = 2
#: Little changelog kept (the leader's log starts near the snapshot), a manual snapshot only.
#: ``replica.rebuild.max-bytes-per-s`` 0: the rebuild's own speed is measured, not the operator's bound (its
#: default, 100 MiB/s, alone holds a 123 MB snapshot's download to ~1.2 s).
CLUSTER_OVERRIDES = {"kv.snapshot.interval": "1h", "log.retention": "0ms", "replica.max-lag": "5s",
                     "replica.rebuild.max-bytes-per-s": "0"}
POLL_S = 0.005
REMOTES = ("file", "s3")
LOADS = ("quiet", "busy")


def remote_kind(text: str) -> str:
    """``--remote``: one of :data:`REMOTES`, or ``both`` (each, a cluster of its own, one after the other)."""
    if text != "both" and text not in REMOTES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(REMOTES)} or both")
    return text


REBUILD_TIMEOUT_S = 600.0

OPTIONS = (
    Option("--rows", positive_int, 1_000_000, "rows of the bucket (in its snapshot)"),
    Option("--tail-percent", positive_int, 10,
           "rows updated after the snapshot (the changelog tail), as a percentage of --rows"),
    Option("--batch", positive_int, 10_000, "rows per upsert call"),
    Option("--threads", positive_int, 4, "client threads loading the rows"),
    Option("--rounds", positive_int, 2, "downloads and rebuilds, alternating; the best of each counts"),
    Option("--remote", remote_kind, "both", "the remote storage: file (a local directory), s3 (moto's S3 "
           "server, a process of its own) or both (a cluster each)", metavar="KIND"),
    Option("--load-rows-per-s", non_negative_int, 10_000, "the busy runs: a writer upserts this many rows/s into the leader "
           "during the downloads and the rebuilds (0: quiet runs only)"),
)


# -- the follower in this process -------------------------------------------------------------------


def segment_kb(rows: int) -> int:
    """``log.segment.bytes`` in KB for ``rows`` rows: about 130 segments (1 MB at 1,000,000 rows, at least
    64 KB), so retention can remove the log below the snapshot whole segments at a time."""
    return max(64, min(1024, rows // 1000))


def follower_config(directory: str, data_dir: str) -> cfg.Config:
    """The config of a tablet server of the local cluster in ``directory`` (its first one's, which
    names ZooKeeper, the remote storage and the overrides) as server :data:`FOLLOWER_ID` in ``data_dir``."""
    return cfg.Config.load(Path(directory) / "tablet-1" / "config.toml", {
        cfg.TABLET_ID.name: FOLLOWER_ID, cfg.TABLET_PORT.name: 0, cfg.METRICS_PORT.name: -1,
        cfg.TABLET_DATA_DIR.name: data_dir}, env={})


def start_follower(config: cfg.Config):
    from kvlease.tablet.server import TabletServer

    return TabletServer(config).start()


def bucket_state(admin, table_id: int):
    return admin.get_table_assignment(table_id)[1][0]


def applied_offset(server, table_id: int) -> int:
    """The follower's first changelog offset not yet in its RocksDB; -1 while it has no replica or its files
    are not open. Read from memory: asking the store would open its files (the fresh replica's empty
    RocksDB, created only to be replaced) and hold them, so that the install waits for this poll."""
    try:
        known = server.replicas.replica(table_id, 0).store.files.known_offsets()
    except Exception:  # not told of the bucket yet
        return -1
    return -1 if known is None else known[2]


def rebuild_once(config: cfg.Config, admin, table_id: int, log_end: int) -> tuple[Any, dict[str, float]]:
    """Wipe the (stopped) follower's data dir, start it, wait until it is in the ISR with ``log_end``
    applied; returns the server and the seconds from its start until its snapshot was installed, the
    tail applied, it was in the ISR (``total_s``: the last of these)."""
    shutil.rmtree(config[cfg.TABLET_DATA_DIR], ignore_errors=True)
    marks: dict[str, float] = {}
    t0 = time.perf_counter()
    server = start_follower(config)
    try:
        deadline = t0 + REBUILD_TIMEOUT_S
        next_isr_check = 0.0
        while not {"installed_s", "applied_s", "in_isr_s"} <= set(marks):
            now = time.perf_counter()
            rebuilder = server.fetchers.rebuilder
            if "started_s" not in marks and (rebuilder.in_progress or rebuilder.rebuilt):
                marks["started_s"] = now - t0
            if "installed_s" not in marks and rebuilder.rebuilt:
                marks["installed_s"] = now - t0
            if "applied_s" not in marks and applied_offset(server, table_id) >= log_end:
                marks["applied_s"] = now - t0
            # an RPC, in this process: asked less often, and only once installed (a replica without its snapshot
            # cannot be in the ISR; polling the coordinator meanwhile took CPU from the download it times); as
            # often as the rest once the tail is applied (only the ISR is left to wait for)
            if "in_isr_s" not in marks and "installed_s" in marks and now >= next_isr_check:
                next_isr_check = now + (POLL_S if "applied_s" in marks else 0.02)
                if FOLLOWER_ID in bucket_state(admin, table_id).isr:
                    marks["in_isr_s"] = time.perf_counter() - t0
            if now > deadline:
                raise RuntimeError(f"the wiped follower was not rebuilt within {REBUILD_TIMEOUT_S:g}s "
                                   f"(reached so far: {sorted(marks) or 'nothing'})")
            if "applied_s" in marks and "installed_s" not in marks:
                raise RuntimeError("the wiped follower caught up without a rebuild from the snapshot: it fetched "
                                   "the whole changelog (the leader's log still starts at 0?)")
            time.sleep(POLL_S)
    except BaseException:
        server.stop()
        raise
    return server, {**marks, "total_s": max(marks.values())}


def stop_follower(server, admin, table_id: int) -> None:
    server.stop()
    wait_until(lambda: FOLLOWER_ID not in bucket_state(admin, table_id).isr, 120.0,
               "the stopped follower to leave the ISR")


def download_once(storage, handle, target: str, io_threads: int, durable: bool = False) -> float:
    """Seconds of a ``kvsnapshot.download`` of ``handle`` into ``target`` (removed after); ``durable``:
    each file fsynced, as a rebuild keeps them."""
    shutil.rmtree(target, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        kvsnapshot.download(storage, handle, target, io_threads=io_threads, durable=durable)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(target, ignore_errors=True)


def follower_rows(server, table_id: int) -> int:
    store = server.replicas.replica(table_id, 0).store
    with store.snapshot() as snapshot:
        return sum(1 for _ in store.iter_rows(snapshot))


# -- the run ----------------------------------------------------------------------------------------


def fill(admin, table_id: int, rows: int, tail_rows: int, batch: int, threads: int, progress):
    """Load ``rows`` rows, commit a snapshot (retention then removes the log below it), update
    ``tail_rows`` rows after it; returns the snapshot's handle and the leader's log start and end."""
    from kvlease.client.table import TableClient

    with TableClient(admin, TABLE, parallelism=threads, retry_total_s=60) as client:
        progress(f"loading {rows:,} rows into the leader")
        load(client, rows, batch, threads)
        progress("committing a snapshot (the changelog below it is removed)")
        client.trigger_snapshot(wait=True)
        handle = max(admin.list_kv_snapshots(table_id), key=lambda s: s.snapshot_id).handle
        progress(f"updating {tail_rows:,} rows after the snapshot (the changelog tail)")
        for start in range(0, tail_rows, batch):
            client.upsert(make_batch(np.arange(start, min(start + batch, tail_rows)), salt=1))
        (log_start, log_end), = client.list_offsets([0]).values()
    if log_start == 0:
        raise RuntimeError("the leader's changelog still starts at offset 0 after the snapshot: a wiped "
                           "follower would fetch it whole instead of rebuilding from the snapshot")
    return handle, log_start, log_end


def start_cluster(base: str, directory: str, rows: int, remote: str, stack: contextlib.ExitStack, progress):
    """The local cluster in ``directory`` (its cluster.json document), stopped when ``stack`` closes, with moto's
    S3 server (stopped after it) as its remote storage for ``remote`` "s3", else a directory of ``directory``."""
    overrides = {**CLUSTER_OVERRIDES, "log.segment.bytes": f"{segment_kb(rows)}kb"}
    remote_uri = None
    if remote == "s3":
        progress("starting moto's S3 server")
        s3 = stack.enter_context(local_s3(base))
        remote_uri = s3.pop(cfg.REMOTE_DATA_DIR.name)
        overrides.update(s3)
    return stack.enter_context(local_cluster.running(directory, tablets=1, remote=remote_uri,
                                                     config_overrides=overrides, progress=progress))


def speeds(rows: int, handle, downloads: list[float], durable_downloads: list[float],
           rebuilds: list[dict[str, float]]) -> dict[str, Any]:
    """The rounds' times and the best of each as rows/s, MB/s and the ratio. The anchor is the durable download
    (each file fsynced, as a replica must keep them: the rebuild does the same); the page-cache-only download
    is reported beside it."""
    snapshot_bytes = sum(f.size for f in handle.files)
    download_s, page_cache_s = min(durable_downloads), min(downloads)
    rebuild_s = min(r["total_s"] for r in rebuilds)
    return {"snapshot_bytes": snapshot_bytes, "snapshot_files": len(handle.files),
            "download_s": downloads, "durable_download_s": durable_downloads, "rebuild": rebuilds,
            "download_rows_per_s": rows / download_s, "download_mb_per_s": snapshot_bytes / MB / download_s,
            "page_cache_download_rows_per_s": rows / page_cache_s,
            "rebuild_rows_per_s": rows / rebuild_s, "rebuild_mb_per_s": snapshot_bytes / MB / rebuild_s,
            "rebuild_vs_download": download_s / rebuild_s, "rebuild_vs_page_cache_download": page_cache_s / rebuild_s,
            "target_ratio": TARGET_RATIO}


def log_end(admin) -> int:
    """The leader's changelog end now."""
    from kvlease.client.table import TableClient

    with TableClient(admin, TABLE, retry_total_s=60) as client:
        (_start, end), = client.list_offsets([0]).values()
    return end


def measure(ctx: dict[str, Any], load: str, load_rows_per_s: int, rows: int, rounds: int, progress) -> dict:
    """``rounds`` alternating downloads and rebuilds (``ctx``: the cluster's), with a writer loading the
    leader at ``load_rows_per_s`` for ``load`` "busy"; the case's figures."""
    from kvlease.ops.bench.paced_writer import paced_writer

    admin, table_id, handle, storage, base = ctx["admin"], ctx["table_id"], ctx["handle"], ctx["storage"], ctx["base"]
    downloads, durable_downloads, rebuilds = [], [], []
    if load == "busy":  # a quiet round waits for the leader's idleness itself
        wait_idle(ctx["leader_pid"])
    busy = paced_writer(ctx["bootstrap"], TABLE, rows, load_rows_per_s) if load == "busy" else contextlib.nullcontext()
    with busy as writer:
        for round_ in range(1, rounds + 1):
            if writer is None:
                wait_idle(ctx["leader_pid"])
            what = f"{ctx['remote']}://, {load}, round {round_} of {rounds}"
            progress(f"{what}: downloading the snapshot's files")
            downloads.append(download_once(storage, handle, f"{base}/download", ctx["io_threads"]))
            durable_downloads.append(download_once(storage, handle, f"{base}/download", ctx["io_threads"],
                                                   durable=True))
            if writer is None:
                wait_idle(ctx["leader_pid"])
            progress(f"{what}: rebuilding the wiped follower")
            end = log_end(admin)
            follower, marks = rebuild_once(ctx["config"], admin, table_id, end)
            ctx["follower"] = follower
            rebuilds.append({**marks, "log_end": end})
            if round_ == rounds and (held := follower_rows(follower, table_id)) != rows:
                raise RuntimeError(f"the rebuilt follower holds {held:,} rows, the table {rows:,}")
            stop_follower(follower, admin, table_id)
            ctx["follower"] = None
    written = {"writer_rows": writer.rows, "writer_rows_per_s": writer.rows / writer.seconds} if writer else {}
    return {"remote": ctx["remote"], "load": load, **written,
            **speeds(rows, handle, downloads, durable_downloads, rebuilds)}


def run_remote(remote: str, *, rows: int, tail_rows: int, batch: int, threads: int, rounds: int,
               load_rows_per_s: int, progress) -> dict[str, Any]:
    """A cluster with ``remote`` storage: the snapshot and its tail, then the quiet and the busy cases."""
    from kvlease.client.admin import AdminClient
    from kvlease.common.storage import open_storage

    base = tempfile.mkdtemp(prefix="kvlease-bench-rebuild-")
    directory = f"{base}/cluster"
    ctx: dict[str, Any] = {"remote": remote, "base": base, "follower": None}
    stack = contextlib.ExitStack()
    try:
        doc = start_cluster(base, directory, rows, remote, stack, progress)
        ctx["leader_pid"] = int(doc["tablets"][0]["pid"])
        config = ctx["config"] = follower_config(directory, f"{base}/follower")
        ctx["storage"] = open_storage(config[cfg.REMOTE_DATA_DIR], config)
        ctx["io_threads"] = config[cfg.SNAPSHOT_UPLOAD_THREADS]
        ctx["follower"] = start_follower(config)
        ctx["bootstrap"] = local_cluster.bootstrap(directory)
        with AdminClient(ctx["bootstrap"], retry_total_s=60) as admin:
            ctx["admin"] = admin
            wait_until(lambda: len(admin.list_tablet_servers()) == 2, 120.0, "the follower to register")
            table = admin.create_table(TABLE, COLUMNS, ["id"], 1, replication_factor=2, min_insync_replicas=1)
            table_id = ctx["table_id"] = table.table_id
            wait_until(lambda: len(bucket_state(admin, table_id).isr) == 2, 120.0, "the follower to join the ISR")
            stop_follower(ctx["follower"], admin, table_id)
            ctx["follower"] = None
            handle, log_start, end = fill(admin, table_id, rows, tail_rows, batch, threads, progress)
            ctx["handle"] = handle
            loads = LOADS if load_rows_per_s > 0 else LOADS[:1]
            cases = [measure(ctx, load, load_rows_per_s, rows, rounds, progress) for load in loads]
        return {"remote": remote, "snapshot_log_offset": handle.log_offset, "leader_log_start": log_start,
                "leader_log_end": end, "cases": cases}
    finally:  # each step whatever the one before raised: nothing is left running or on disk
        try:
            if ctx["follower"] is not None:
                ctx["follower"].stop()
        finally:
            try:
                stack.close()  # the cluster, then the S3 server
            finally:
                shutil.rmtree(base, ignore_errors=True)


def run(*, rows: int, tail_percent: int, batch: int, threads: int, rounds: int, remote: str = "both",
        load_rows_per_s: int = 10_000, progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    tail_rows = max(1, rows * tail_percent // 100)
    remotes = REMOTES if remote == "both" else (remote,)
    runs = [run_remote(kind, rows=rows, tail_rows=tail_rows, batch=batch, threads=threads, rounds=rounds,
                       load_rows_per_s=load_rows_per_s, progress=progress) for kind in remotes]
    return {"rows": rows, "tail_rows": tail_rows, "rounds": rounds, "remotes": list(remotes),
            "load_rows_per_s": load_rows_per_s, "runs": runs}


__all__ = ["OPTIONS", "report", "run", "target_rows"]  # the suite's interface


if __name__ == "__main__":
    bench_suite.module_main("rebuild")
