"""``kvlease bench writes`` (or ``python -m kvlease.ops.bench.writes``): the write and read path end to end.

Starts its own local cluster (ZooKeeper, one coordinator, one tablet server;
processes in a temp directory, stopped at the end whatever happens) and
measures in one run:

- ``upsert``: rows/s of ``TableClient.upsert`` (PutKv) loading ``--rows``
  rows (default 1,000,000) into a new one-bucket table ``(id BIGINT primary
  key, v STRING of ~100 bytes)`` (``--schema wide``: 20 columns of mixed
  types, :mod:`kvlease.ops.bench.wide_schema`; target ratio >= 0.3) in batches of ``--batch`` rows (10,000) from
  ``--threads`` client threads (4), against ``rocksdb``: rows/s of raw
  rocksdict ``WriteBatch`` writes (default options, WAL on, no fsync) of the
  same encoded rows into a new RocksDB in this process, the floor of what
  storing them costs (encoding not timed). Both are measured ``--rounds``
  times (3), alternating, and the best of each counts (as ``bench scan``
  does): this VM's speed drifts from minute to minute, and a ratio of two
  figures taken minutes apart measured the drift as much as the code. Each
  raw round starts once the tablet server is idle (its flushes done), each
  upsert round once the raw RocksDB is closed. Target: ratio >= 0.4.
  Reported besides: the CPU the tablet server process and this (client)
  process spent per row during the best load, and the raw writes' CPU per
  row: on a loaded machine the rows/s follow the CPU the processes get,
  these do not.
- ``lookup``: p50/p99 latency of ``--lookups`` single-key lookups (2,000)
  and rows/s of 10,000-key batch lookups, on the last round's table;
- ``snapshot``: the bytes uploaded by a snapshot after changing 1% of the
  rows, against the first (full) snapshot: the sizes of the files that are
  new in snapshot 2 (not in snapshot 1) vs all files of snapshot 1.
- with ``--engine aggregation`` and/or ``--partial``: ``merge``, writes through a merge engine or as partial
  updates next to last-write-wins in each round (:mod:`kvlease.ops.bench.merge_writes`).

The tablet server runs with its defaults (changelog fsync per write), except
``kv.snapshot.interval`` = 1h so that only the two snapshots this benchmark
triggers exist. The suite interface (``OPTIONS``, ``run``, ``target_rows``, ``report``)
is :mod:`kvlease.ops.bench.suite`'s.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from kvlease.common.codec import RowCodec
from kvlease.common.tables import Column, TableInfo
import kvlease.ops.bench.suite as bench_suite
from kvlease.ops import local_cluster
from kvlease.ops.bench import merge_writes
from kvlease.ops.bench.machine import cpu_seconds, wait_idle
from kvlease.ops.bench.suite import Option, Row, positive_int
from kvlease.ops.bench.wide_schema import WIDE_COLUMNS, schema_name, wide_batch

TABLE = "bench.writes"
COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]
TARGET_RATIO = 0.4  # issue 12
TARGET_RATIO_WIDE = 0.3  # issue 42

OPTIONS = (
    Option("--rows", positive_int, 1_000_000, "rows loaded"),
    Option("--batch", positive_int, 10_000, "rows per upsert call"),
    Option("--threads", positive_int, 4, "client threads loading the rows"),
    Option("--lookups", positive_int, 2000, "single-key lookups timed"),
    Option("--rounds", positive_int, 3, "loads of each kind (upsert, raw WriteBatch), alternating; the best counts"),
    Option("--engine", merge_writes.engine_name, "none", "also load a table with this merge engine (aggregation) "
           "next to last-write-wins, each twice (insert, update)", metavar="NAME"),
    Option("--partial", bool, False, "also load a table by partial updates next to last-write-wins"),
    Option("--schema", schema_name, "narrow", "the table: narrow (id BIGINT, v STRING 100 B) or wide (20 columns "
           "of mixed types: DECIMAL, DATE, TIMESTAMP, ARRAY, …)", metavar="NAME"),
)


def make_batch(ids: np.ndarray, salt: int = 0) -> pa.RecordBatch:
    """Rows ``(id, v)``; ``v`` is 100 random hex digits, a function of ``(id, salt)``
    (incompressible like real data, so snapshot sizes are not flattered by compression)."""
    rng = np.random.default_rng([salt, int(ids[0]) if len(ids) else 0, len(ids)])
    digits = rng.integers(0, 16, size=(len(ids), 100), dtype=np.uint8)
    text = np.frombuffer(b"0123456789abcdef", np.uint8)[digits].tobytes()
    offsets = pa.py_buffer(np.arange(0, 100 * (len(ids) + 1), 100, dtype=np.int32))
    values = pa.Array.from_buffers(pa.string(), len(ids), [None, offsets, pa.py_buffer(text)])
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "v": values})


def batch_maker(schema: str):
    """The rows of ``--schema``: :func:`make_batch` or :func:`kvlease.ops.bench.wide_schema.wide_batch`."""
    return make_batch if schema == "narrow" else wide_batch


def load(client, rows: int, batch_rows: int, threads: int, server_pid: int | None = None,
         make=make_batch) -> dict[str, float]:
    """Upsert ids 0..rows-1 from ``threads`` threads (batch building not timed): ``rows_per_s``, and
    the CPU µs per row of this process and of ``server_pid`` meanwhile."""
    batches = [make(np.arange(start, min(start + batch_rows, rows)))
               for start in range(0, rows, batch_rows)]
    queue = collections.deque(batches)
    lock, failures = threading.Lock(), []

    def worker() -> None:
        while True:
            with lock:
                if not queue or failures:
                    return
                batch = queue.popleft()
            try:
                client.upsert(batch)
            except BaseException as exc:  # reported by the caller
                failures.append(exc)
                return

    workers = [threading.Thread(target=worker, name=f"bench-writer-{i}") for i in range(threads)]
    server_cpu = cpu_seconds(server_pid) if server_pid else 0.0
    start, client_cpu = time.perf_counter(), time.process_time()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - client_cpu
    server_cpu = cpu_seconds(server_pid) - server_cpu if server_pid else None
    if failures:
        raise failures[0]
    return {"rows_per_s": rows / elapsed, "client_cpu_us_per_row": client_cpu / rows * 1e6,
            "server_cpu_us_per_row": None if server_cpu is None else server_cpu / rows * 1e6}


def rocksdb_baseline(codec, rows: int, batch_rows: int, directory: str, make=make_batch) -> tuple[float, float]:
    """rows/s of rocksdict WriteBatch writes of the encoded rows (encoding not timed), and the
    CPU µs per row of this thread meanwhile."""
    from rocksdict import Options, Rdict, WriteBatch

    db = Rdict(directory, Options(raw_mode=True))
    elapsed = cpu = 0.0
    try:
        for start in range(0, rows, batch_rows):
            keys, values = codec.encode(make(np.arange(start, min(start + batch_rows, rows))))
            t0, c0 = time.perf_counter(), time.thread_time()
            batch = WriteBatch(raw_mode=True)
            collections.deque(map(batch.put, keys, values), maxlen=0)
            db.write(batch)
            elapsed += time.perf_counter() - t0
            cpu += time.thread_time() - c0
    finally:
        db.close()
    return rows / elapsed, cpu / rows * 1e6


def lookup_rates(client, rows: int, singles: int, batches: int, batch_keys: int, rng) -> dict[str, float]:
    latencies = []
    for key in rng.integers(0, rows, singles).tolist():
        t0 = time.perf_counter()
        found = client.lookup([key])
        latencies.append(time.perf_counter() - t0)
        assert found[0] is not None and found[0]["id"] == key
    keys = [pa.record_batch({"id": pa.array(rng.integers(0, rows, batch_keys), pa.int64())})
            for _ in range(batches)]
    t0 = time.perf_counter()
    for key_batch in keys:
        result = client.lookup_batch(key_batch)
        assert result.num_rows == batch_keys and result.column("id").null_count == 0
    batch_rate = batches * batch_keys / (time.perf_counter() - t0)
    ms = np.array(latencies) * 1000
    return {"single_count": singles, "single_p50_ms": float(np.percentile(ms, 50)),
            "single_p99_ms": float(np.percentile(ms, 99)), "batch_keys": batch_keys,
            "batch_rows_per_s": batch_rate}


def snapshot_sizes(admin, client, rows: int, changed: int, rng, make=make_batch) -> dict[str, Any]:
    t0 = time.perf_counter()
    first = client.trigger_snapshot(wait=True)
    full_s = time.perf_counter() - t0
    ids = np.sort(rng.choice(rows, changed, replace=False))
    client.upsert(make(ids, salt=1))
    t0 = time.perf_counter()
    second = client.trigger_snapshot(wait=True)
    incremental_s = time.perf_counter() - t0
    if len(first) != 1 or len(second) != 1:
        raise RuntimeError(f"expected one committed snapshot each time, got {first} and {second}")
    by_id = {s.snapshot_id: s for s in admin.list_kv_snapshots(client.table.table_id)}
    files_1 = {f.path: f.size for f in by_id[first[0].snapshot_id].handle.files}
    files_2 = {f.path: f.size for f in by_id[second[0].snapshot_id].handle.files}
    full = sum(files_1.values())
    new = sum(size for path, size in files_2.items() if path not in files_1)
    return {"changed_rows": changed, "full_bytes": full, "incremental_bytes": new,
            "incremental_ratio": new / full if full else None, "snapshot_2_total_bytes": sum(files_2.values()),
            "full_files": len(files_1), "new_files": sum(1 for p in files_2 if p not in files_1),
            "full_s": full_s, "incremental_s": incremental_s}


def run(*, rows: int, batch: int, threads: int, lookups: int, rounds: int, schema: str = "narrow", seed: int = 7,
        engine: str = "none", partial: bool = False,
        progress: bench_suite.Progress = lambda text: None) -> dict[str, Any]:
    """The figures (see the module docstring); options as in ``OPTIONS``."""
    from kvlease.client.admin import AdminClient
    from kvlease.client.table import TableClient

    rng = np.random.default_rng(seed)
    base = tempfile.mkdtemp(prefix="kvlease-bench-writes-")
    directory = f"{base}/cluster"
    columns, make = (COLUMNS if schema == "narrow" else WIDE_COLUMNS), batch_maker(schema)
    codec = RowCodec(TableInfo(0, *TABLE.split("."), tuple(columns), ("id",), 1))
    raws: list[tuple[float, float]] = []
    upserts: list[dict[str, float]] = []
    merges: list[dict[str, float]] = []
    try:
        with local_cluster.running(directory, tablets=1, config_overrides={"kv.snapshot.interval": "1h"},
                                   progress=progress):
            tablet_pid = int(local_cluster.load(directory)["tablets"][0]["pid"])
            with AdminClient(local_cluster.bootstrap(directory), retry_total_s=30) as admin:
                for round_ in range(1, rounds + 1):
                    wait_idle(tablet_pid)  # the last round's flushes and table drop are done
                    progress(f"round {round_} of {rounds}: raw rocksdict WriteBatch of {rows:,} rows")
                    try:
                        raws.append(rocksdb_baseline(codec, rows, batch, f"{base}/rocksdb", make))
                    finally:
                        shutil.rmtree(f"{base}/rocksdb", ignore_errors=True)
                    table = TABLE if round_ == rounds else f"{TABLE}_{round_}"
                    admin.create_table(table, columns, ["id"], 1)
                    with TableClient(admin, table, parallelism=threads) as client:
                        progress(f"round {round_} of {rounds}: upserting {rows:,} rows from {threads} threads")
                        upserts.append(load(client, rows, batch, threads, tablet_pid, make))
                        if round_ == rounds:
                            progress(f"{lookups:,} single-key lookups, 20 lookups of 10,000 keys")
                            read = lookup_rates(client, rows, lookups, batches=20, batch_keys=10_000, rng=rng)
                            progress("two snapshots, 1% of the rows changed in between")
                            snapshots = snapshot_sizes(admin, client, rows, max(1, rows // 100), rng, make)
                    if round_ < rounds:
                        admin.drop_table(table)  # its RocksDB and changelog go before the next round
                    if engine != "none" or partial:
                        merges.append(merge_writes.one_round(admin, round_, engine, partial, rows, batch, threads,
                                                             tablet_pid, load, make_batch, progress))
            upsert = max(upserts, key=lambda u: u["rows_per_s"])
            baseline, baseline_cpu = max(raws)
            return {"rows": rows, "batch_rows": batch, "client_threads": threads, "rounds": rounds, "schema": schema,
                    "upsert_rows_per_s": upsert["rows_per_s"], "rocksdb_writebatch_rows_per_s": baseline,
                    "upsert_vs_rocksdb": upsert["rows_per_s"] / baseline,
                    "target_ratio": TARGET_RATIO if schema == "narrow" else TARGET_RATIO_WIDE,
                    "round_rows_per_s": [{"upsert": u["rows_per_s"], "rocksdb_writebatch": r[0]}
                                         for u, r in zip(upserts, raws)],
                    "cpu_us_per_row": {"tablet_server": upsert["server_cpu_us_per_row"],
                                       "client": upsert["client_cpu_us_per_row"], "rocksdb_writebatch": baseline_cpu},
                    "lookup": read, "snapshot": snapshots,
                    **({"merge": merge_writes.figures(merges, baseline, engine, partial)} if merges else {})}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def report(result: dict[str, Any]) -> str:
    r, lk, snap = result, result["lookup"], result["snapshot"]
    ok = "ok" if r["upsert_vs_rocksdb"] >= r["target_ratio"] else "BELOW TARGET"
    rounds = r.get("round_rows_per_s")  # absent from figures recorded before rounds
    table = ("20 columns of mixed types" if r.get("schema") == "wide" else "id BIGINT, v STRING 100 B")
    lines = [
        f"{r['rows']:,} rows ({table}), 1 bucket, batches of {r['batch_rows']:,}, "
        f"{r['client_threads']} client thread(s)" + (f", best of {len(rounds)} alternating rounds" if rounds else ""),
        f"  upsert (PutKv via TableClient)   {r['upsert_rows_per_s']:>12,.0f} rows/s",
        f"  rocksdict WriteBatch in-process  {r['rocksdb_writebatch_rows_per_s']:>12,.0f} rows/s",
        f"  ratio                            {r['upsert_vs_rocksdb']:>12.2f}   (target >= {r['target_ratio']}: {ok})",
        f"  lookup, one key                  p50 {lk['single_p50_ms']:.2f} ms, p99 {lk['single_p99_ms']:.2f} ms "
        f"({lk['single_count']} lookups)",
        f"  lookup, {lk['batch_keys']:,} keys per call      {lk['batch_rows_per_s']:>12,.0f} rows/s",
        f"  snapshot 1 (full)                {snap['full_bytes']:>12,} bytes in {snap['full_files']} files "
        f"({snap['full_s']:.1f} s)",
        f"  snapshot 2 after {snap['changed_rows']:,} changed rows: {snap['incremental_bytes']:,} bytes new in "
        f"{snap['new_files']} files = {snap['incremental_ratio']:.1%} of the full one ({snap['incremental_s']:.1f} s)",
    ]
    if rounds:
        each = [f"{x['upsert'] / 1e6:.2f}M / {x['rocksdb_writebatch'] / 1e6:.2f}M" for x in rounds]
        lines.insert(4, f"  rounds (upsert / raw rows/s)     {', '.join(each)}")
    cpu = r.get("cpu_us_per_row")  # absent from figures recorded before it was measured
    if cpu is not None:
        lines.insert(4, f"  CPU per row: tablet server {cpu['tablet_server']:.2f} us + client {cpu['client']:.2f} us "
                        f"(raw WriteBatch {cpu['rocksdb_writebatch']:.2f} us)")
    if r.get("merge"):
        lines += merge_writes.report(r["merge"])
    return "\n".join(lines)


def target_rows(figures: dict[str, Any]) -> list[Row]:
    wide = figures.get("schema") == "wide"
    return [Row.ratio("PutKv upsert / raw WriteBatch" + (" (wide rows)" if wide else ""), figures["upsert_rows_per_s"],
                      figures["rocksdb_writebatch_rows_per_s"], "rows/s", TARGET_RATIO_WIDE if wide else TARGET_RATIO),
            *(merge_writes.target_rows(figures["merge"]) if figures.get("merge") else [])]


if __name__ == "__main__":
    bench_suite.module_main("writes")
