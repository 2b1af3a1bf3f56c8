"""``kvlease bench lookups [--prefix]`` (or ``python -m kvlease.ops.bench.lookups``): point and prefix lookups.

Starts its own local cluster (ZooKeeper, one coordinator, three tablet servers, one with ``--skip-rf3``;
processes in a temp directory, stopped at the end whatever happens) and measures in one run, for a table
``(id BIGINT, v STRING of 100 bytes)`` of ``--rows`` rows (200,000) at replication factor 1, then 3
(:mod:`kvlease.ops.bench.point_lookups`):

- batch lookups: rows/s of ``lookup_batch`` of ``--batches`` (20) batches of ``--batch-keys`` (10,000) random
  keys, one bucket, against the rows/s of a raw rocksdict multi-get of the same keys (the same encoded rows
  loaded into a rocksdict in this process), alternating for ``--rounds`` (3), the best of each counting;
  target: at least 0.5 of raw;
- single-key lookups: p50 / p99 ms of ``--singles`` (2,000) ``lookup([key])`` calls, one at a time; targets
  0.5 ms and 2 ms (the raw rocksdict ``get`` of the same keys is their anchor);
- ``--threads`` (16) client threads doing single-key lookups on a table of ``--buckets`` (4) buckets:
  lookups/s, against one thread's (target: at least as many).

At replication factor 3 every read goes to the bucket's leader (followers serve no reads:
docs/replication.md, "Reads").

With ``--prefix`` also a table ``(user BIGINT, seq BIGINT, v STRING of 100 bytes)``, primary key ``(user,
seq)``, bucket key ``user``, ``--buckets`` buckets, ``--per-prefix`` rows (100) per user:

- ``point``: rows/s of ``TableClient.lookup_batch`` of every key of ``--users`` random users (20) per call;
- ``prefix``: rows/s of ``TableClient.lookup_prefix_batch`` of the same users per call: the same rows, found
  by one RocksDB range scan per user instead of a multi-get of their keys; the figure judged is prefix rows/s
  over point rows/s of the same rows (target: at least 1, as a range scan of a user's rows should cost no
  more than looking each of them up).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

import kvlease.ops.bench.suite as bench_suite
from kvlease.common import config as cfg
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.bench import point_lookups
from kvlease.ops.bench.machine import wait_idle
from kvlease.ops.bench.suite import Option, Row, positive_int
from kvlease.ops.bench.writes import make_batch

TABLE = "bench.lookups"
POINT_TABLE = "bench.point"  # + "_rf1" / "_rf3"; "4" for the table of --buckets buckets
COLUMNS = [Column("user", "BIGINT"), Column("seq", "BIGINT"), Column("v", "STRING")]
TARGET_RATIO = 1.0
TARGET_BATCH_VS_RAW = 0.5  # issue 44
TARGET_SINGLE_P50_MS = 0.5
TARGET_SINGLE_P99_MS = 2.0
TARGET_THREADS_VS_ONE = 1.0
CALLS = 50  # prefix-mode lookup calls per timed pass

OPTIONS = (
    Option("--rows", positive_int, 200_000, "rows loaded (each table)"),
    Option("--batch-keys", positive_int, 10_000, "keys per batch lookup"),
    Option("--batches", positive_int, 20, "batch lookups per timed pass"),
    Option("--singles", positive_int, 2000, "single-key lookups timed"),
    Option("--threads", positive_int, 16, "client threads of the concurrent single-key lookups"),
    Option("--per-prefix", positive_int, 100, "rows per user (per bucket-key value), --prefix"),
    Option("--users", positive_int, 20, "users looked up per call, --prefix"),
    Option("--buckets", positive_int, 4, "buckets of the concurrent lookups' table (and the --prefix one)"),
    Option("--rounds", positive_int, 3, "timed passes of each kind, alternating; the best counts"),
    Option("--prefix", bool, False, "also time prefix lookups of users' rows against point lookups of them"),
    Option("--skip-rf3", bool, False, "measure replication factor 1 only (one tablet server)"),
)


def rows_of(users: np.ndarray, per_prefix: int) -> pa.RecordBatch:
    """Every row of ``users``: ``seq`` 0..per_prefix-1 each, ``v`` 100 random hex digits."""
    ids = np.repeat(users, per_prefix)
    base = make_batch(np.arange(len(ids)))
    return pa.record_batch({"user": pa.array(ids, pa.int64()),
                            "seq": pa.array(np.tile(np.arange(per_prefix), len(users)), pa.int64()),
                            "v": base.column("v")})


def load(client, users: int, per_prefix: int, batch_users: int = 100) -> None:
    for start in range(0, users, batch_users):
        client.upsert(rows_of(np.arange(start, min(start + batch_users, users)), per_prefix))


def timed(calls: list, call) -> float:
    """rows/s of ``call`` over every item of ``calls``; each answer's rows counted."""
    rows = 0
    t0 = time.perf_counter()
    for item in calls:
        rows += call(item).num_rows
    return rows / (time.perf_counter() - t0)


def run(*, rows: int, batch_keys: int = 10_000, batches: int = 20, singles: int = 2000, threads: int = 16,
        per_prefix: int = 100, users: int = 20, buckets: int = 4, rounds: int = 3, prefix: bool = False,
        skip_rf3: bool = False, seed: int = 7, progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    from kvlease.client.admin import AdminClient

    rng = np.random.default_rng(seed)
    base = tempfile.mkdtemp(prefix="kvlease-bench-lookups-")
    factors = (1,) if skip_rf3 else (1, 3)
    figures: dict[str, Any] = {"rows": rows, "batch_keys": batch_keys, "batches": batches, "singles": singles,
                               "threads": threads, "buckets": buckets, "rounds": rounds}
    try:
        with local_cluster.running(f"{base}/cluster", tablets=max(factors), progress=progress,
                                   config_overrides={"kv.snapshot.interval": "1h"}):
            with AdminClient(local_cluster.bootstrap(f"{base}/cluster"), retry_total_s=30) as admin:
                progress(f"loading {rows:,} rows into a raw rocksdict (the anchor)")
                raw = point_lookups.RawAnchor(f"{base}/raw", rows)
                try:
                    for factor in factors:
                        figures[f"rf{factor}"] = _point_figures(admin, raw, factor, f"{base}/cluster", rows=rows,
                                                                batch_keys=batch_keys,
                                                                batches=batches, singles=singles, threads=threads,
                                                                buckets=buckets, rounds=rounds, rng=rng,
                                                                progress=progress)
                finally:
                    raw.close()
                if prefix:
                    figures["prefix"] = _prefix_figures(admin, rows=rows, per_prefix=per_prefix, users=users,
                                                        buckets=buckets, rounds=rounds, rng=rng, progress=progress)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return figures


def _point_figures(admin, raw, factor: int, directory: str, *, rows: int, buckets: int,
                   progress: bench_suite.Progress, **options: Any) -> dict[str, Any]:
    from kvlease.client.table import TableClient

    one, many = f"{POINT_TABLE}_rf{factor}", f"{POINT_TABLE}4_rf{factor}"
    admin.create_table(one, point_lookups.COLUMNS, ["id"], 1, replication_factor=factor)
    admin.create_table(many, point_lookups.COLUMNS, ["id"], buckets, replication_factor=factor)
    grpc_only = cfg.Config({cfg.CLIENT_LOOKUP_PORT.name: False}, env={})
    with TableClient(admin, one) as client, TableClient(admin, one, grpc_only) as grpc_client, \
            TableClient(admin, many, parallelism=options["threads"]) as client4:
        progress(f"RF {factor}: loading {rows:,} rows into a table of 1 bucket and one of {buckets}")
        point_lookups.load(client, rows)
        point_lookups.load(client4, rows)
        for tablet in local_cluster.load(directory)["tablets"]:  # the loads' flushes and compactions done
            wait_idle(int(tablet["pid"]))
        return point_lookups.measure(client, grpc_client, client4, raw, rows=rows, progress=progress,
                                     label=f"RF {factor}", **options)


def _prefix_figures(admin, *, rows: int, per_prefix: int, users: int, buckets: int, rounds: int, rng,
                    progress: bench_suite.Progress) -> dict[str, Any]:
    from kvlease.client.table import TableClient

    all_users = max(1, rows // per_prefix)
    picks = [np.sort(rng.choice(all_users, min(users, all_users), replace=False)) for _ in range(CALLS)]
    points, prefixes = [], []
    admin.create_table(TABLE, COLUMNS, ["user", "seq"], buckets, bucket_key=["user"])
    with TableClient(admin, TABLE) as client:
        progress(f"loading {all_users * per_prefix:,} rows ({all_users:,} users of {per_prefix})")
        load(client, all_users, per_prefix)
        keys = [rows_of(p, per_prefix).select(["user", "seq"]) for p in picks]
        starts = [pa.record_batch({"user": pa.array(p, pa.int64())}) for p in picks]
        expected = len(picks) * len(picks[0]) * per_prefix
        for round_ in range(1, rounds + 1):
            progress(f"round {round_} of {rounds}: {CALLS} point lookups of {users} users' rows, then as prefixes")
            points.append(timed(keys, client.lookup_batch))
            prefixes.append(timed(starts, client.lookup_prefix_batch))
        check = sum(client.lookup_prefix_batch(s).num_rows for s in starts)
        if check != expected:
            raise RuntimeError(f"prefix lookups found {check} rows, expected {expected}")
    return {"rows": all_users * per_prefix, "per_prefix": per_prefix, "users_per_call": len(picks[0]),
            "calls": CALLS, "point_rows_per_s": max(points), "round_point_rows_per_s": points,
            "prefix_rows_per_s": max(prefixes), "round_prefix_rows_per_s": prefixes,
            "prefix_vs_point": max(prefixes) / max(points), "target_ratio": TARGET_RATIO}


def _current(figures: dict[str, Any]) -> dict[str, Any]:
    """``figures``, or those of a run before point lookups were measured (2026-11-30: prefix mode only, its
    figures at the top) as a run of now reports them."""
    return {"prefix": figures} if "prefix_rows_per_s" in figures else figures


def report(result: dict[str, Any]) -> str:
    r = _current(result)
    lines = [] if "batch_keys" not in r else [
        f"{r['rows']:,} rows (id BIGINT, v STRING 100 B); batch lookups of {r['batch_keys']:,} keys (one "
        f"bucket), {r['batches']} per pass, best of {r['rounds']}; {r['singles']:,} single-key lookups; "
        f"{r['threads']} threads over {r['buckets']} buckets"]
    for factor in (1, 3):
        f = r.get(f"rf{factor}")
        if f is None:
            continue
        lines += [f"  RF {factor}: raw rocksdict multi-get        {f['raw_multi_get_rows_per_s']:>12,.0f} rows/s",
                  f"  RF {factor}: batch lookups                  {f['batch_rows_per_s']:>12,.0f} rows/s  "
                  f"({f['batch_rows_per_s'] / f['raw_multi_get_rows_per_s']:.2f} of raw, "
                  f"target >= {TARGET_BATCH_VS_RAW})",
                  f"  RF {factor}: single-key lookup              p50 {f['single_p50_ms']:.3f} ms, p99 "
                  f"{f['single_p99_ms']:.3f} ms (raw get p50 {f['raw_get_p50_ms'] * 1000:.1f} us)",
                  *([f"  RF {factor}: the same over gRPC only       p50 {f['grpc_single_p50_ms']:.3f} ms, p99 "
                     f"{f['grpc_single_p99_ms']:.3f} ms (client.lookup-port off: shown, not judged)"]
                    if "grpc_single_p50_ms" in f else []),
                  *([f"  RF {factor}: bare gRPC echo round trip     p50 {f['echo_p50_ms']:.3f} ms, p99 "
                     f"{f['echo_p99_ms']:.3f} ms (the floor: a Python gRPC call to another process)"]
                    if "echo_p50_ms" in f else []),
                  *([f"  RF {factor}: machine busy before them    {f['machine_busy_before_singles']:>12.0%}   "
                     f"(of its CPUs, over a second: the singles wait for < 10 %)"]
                    if "machine_busy_before_singles" in f else []),
                  f"  RF {factor}: single-key lookups, 1 thread   {f['one_thread_per_s']:>12,.0f} /s",
                  f"  RF {factor}: single-key lookups, {r['threads']} threads  {f['threads_per_s']:>12,.0f} /s"]
    p = r.get("prefix")
    if p is not None:
        ok = "ok" if p["prefix_vs_point"] >= p["target_ratio"] else "BELOW TARGET"
        lines += [f"{p['rows']:,} rows (user, seq, v), {p['per_prefix']} per user; {p['calls']} calls of "
                  f"{p['users_per_call']} users each",
                  f"  point lookups (lookup_batch of the users' keys)  {p['point_rows_per_s']:>12,.0f} rows/s",
                  f"  prefix lookups (lookup_prefix_batch of users)   {p['prefix_rows_per_s']:>12,.0f} rows/s",
                  f"  ratio                                           {p['prefix_vs_point']:>12.2f}   "
                  f"(target >= {p['target_ratio']}: {ok})"]
    return "\n".join(lines)


def target_rows(figures: dict[str, Any]) -> list[Row]:
    figures, rows = _current(figures), []
    for factor in (1, 3):
        f = figures.get(f"rf{factor}")
        if f is None:
            continue
        rf = f"RF {factor}"
        rows += [Row.ratio(f"{rf} batch lookup ({figures['batch_keys']:,} keys) / raw rocksdict multi-get",
                           f["batch_rows_per_s"], f["raw_multi_get_rows_per_s"], "rows/s", TARGET_BATCH_VS_RAW),
                 Row.limit(f"{rf} single-key lookup p50 (anchor: raw get)", f["single_p50_ms"], f["raw_get_p50_ms"],
                           "ms", TARGET_SINGLE_P50_MS),
                 Row.limit(f"{rf} single-key lookup p99 (anchor: raw get)", f["single_p99_ms"], f["raw_get_p99_ms"],
                           "ms", TARGET_SINGLE_P99_MS),
                 Row.ratio(f"{rf} lookups/s, {figures['threads']} threads over {figures['buckets']} buckets / 1 "
                           f"thread", f["threads_per_s"], f["one_thread_per_s"], "lookups/s", TARGET_THREADS_VS_ONE)]
    p = figures.get("prefix")
    if p is not None:
        rows.append(Row.ratio("prefix lookup / point lookups of the same rows", p["prefix_rows_per_s"],
                              p["point_rows_per_s"], "rows/s", TARGET_RATIO))
    return rows


if __name__ == "__main__":
    bench_suite.module_main("lookups")
