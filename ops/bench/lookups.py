"""``kvlease bench lookups [--prefix]`` (or ``python -m kvlease.ops.bench.lookups``): point and prefix lookups.

Starts its own local cluster (ZooKeeper, one coordinator, one tablet server; processes in a temp directory,
stopped at the end whatever happens), loads ``--rows`` rows (200,000) into a table ``(user BIGINT, seq BIGINT,
v STRING of 100 bytes)``, primary key ``(user, seq)``, bucket key ``user``, ``--buckets`` buckets (4), with
``--per-prefix`` rows (100) per user, and measures in one run:

- ``point``: rows/s of ``TableClient.lookup_batch`` of every key of ``--users`` random users (20) per call;
- with ``--prefix``, ``prefix``: rows/s of ``TableClient.lookup_prefix_batch`` of the same users per call: the
  same rows, found by one RocksDB range scan per user instead of a multi-get of their keys.

Each is timed ``--rounds`` times (3), alternating, over the same calls, and the best of each counts (this
VM's speed drifts). The figure judged: prefix rows/s over point rows/s of the same rows (target: at least
1, as a range scan of a user's rows should cost no more than looking each of them up).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

import kvlease.ops.bench.suite as bench_suite
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.bench.suite import Option, Row, positive_int
from kvlease.ops.bench.writes import make_batch

TABLE = "bench.lookups"
COLUMNS = [Column("user", "BIGINT"), Column("seq", "BIGINT"), Column("v", "STRING")]
TARGET_RATIO = 1.0
CALLS = 50  # lookup calls per timed pass

OPTIONS = (
    Option("--rows", positive_int, 200_000, "rows loaded"),
    Option("--per-prefix", positive_int, 100, "rows per user (per bucket-key value)"),
    Option("--users", positive_int, 20, "users looked up per call"),
    Option("--buckets", positive_int, 4, "buckets of the table"),
    Option("--rounds", positive_int, 3, "timed passes of each kind, alternating; the best counts"),
    Option("--prefix", bool, False, "also time prefix lookups of the same rows (the ratio judged)"),
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


def run(*, rows: int, per_prefix: int, users: int, buckets: int, rounds: int, prefix: bool = False, seed: int = 7,
        progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    from kvlease.client.admin import AdminClient
    from kvlease.client.table import TableClient

    rng = np.random.default_rng(seed)
    all_users = max(1, rows // per_prefix)
    picks = [np.sort(rng.choice(all_users, min(users, all_users), replace=False)) for _ in range(CALLS)]
    base = tempfile.mkdtemp(prefix="kvlease-bench-lookups-")
    points, prefixes = [], []
    try:
        with local_cluster.running(f"{base}/cluster", tablets=1, config_overrides={"kv.snapshot.interval": "1h"},
                                   progress=progress):
            with AdminClient(local_cluster.bootstrap(f"{base}/cluster"), retry_total_s=30) as admin:
                admin.create_table(TABLE, COLUMNS, ["user", "seq"], buckets, bucket_key=["user"])
                with TableClient(admin, TABLE) as client:
                    progress(f"loading {all_users * per_prefix:,} rows ({all_users:,} users of {per_prefix})")
                    load(client, all_users, per_prefix)
                    keys = [rows_of(p, per_prefix).select(["user", "seq"]) for p in picks]
                    starts = [pa.record_batch({"user": pa.array(p, pa.int64())}) for p in picks]
                    expected = len(picks) * len(picks[0]) * per_prefix
                    for round_ in range(1, rounds + 1):
                        progress(f"round {round_} of {rounds}: {CALLS} point lookups of {users} users' rows"
                                 + (", then as prefixes" if prefix else ""))
                        points.append(timed(keys, client.lookup_batch))
                        if prefix:
                            prefixes.append(timed(starts, client.lookup_prefix_batch))
                    check = sum(client.lookup_prefix_batch(s).num_rows for s in starts) if prefix else expected
                    if check != expected:
                        raise RuntimeError(f"prefix lookups found {check} rows, expected {expected}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures = {"rows": all_users * per_prefix, "per_prefix": per_prefix, "users_per_call": len(picks[0]),
               "calls": CALLS, "buckets": buckets, "rounds": rounds, "point_rows_per_s": max(points),
               "round_point_rows_per_s": points}
    if prefix:
        figures.update(prefix_rows_per_s=max(prefixes), round_prefix_rows_per_s=prefixes,
                       prefix_vs_point=max(prefixes) / max(points), target_ratio=TARGET_RATIO)
    return figures


def report(result: dict[str, Any]) -> str:
    r = result
    lines = [f"{r['rows']:,} rows (user BIGINT, seq BIGINT, v STRING 100 B), {r['per_prefix']} per user, "
             f"{r['buckets']} buckets; {r['calls']} calls of {r['users_per_call']} users each, best of {r['rounds']}",
             f"  point lookups (lookup_batch of the users' keys)  {r['point_rows_per_s']:>12,.0f} rows/s"]
    if "prefix_rows_per_s" in r:
        ok = "ok" if r["prefix_vs_point"] >= r["target_ratio"] else "BELOW TARGET"
        lines += [f"  prefix lookups (lookup_prefix_batch of users)   {r['prefix_rows_per_s']:>12,.0f} rows/s",
                  f"  ratio                                           {r['prefix_vs_point']:>12.2f}   "
                  f"(target >= {r['target_ratio']}: {ok})"]
    return "\n".join(lines)


def target_rows(figures: dict[str, Any]) -> list[Row]:
    if "prefix_rows_per_s" not in figures:
        return []
    return [Row.ratio("prefix lookup / point lookups of the same rows", figures["prefix_rows_per_s"],
                      figures["point_rows_per_s"], "rows/s", TARGET_RATIO)]


if __name__ == "__main__":
    bench_suite.module_main("lookups")
