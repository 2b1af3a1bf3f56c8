"""The point-lookup figures of ``kvlease bench lookups``: kvlease against raw rocksdict of the same keys.

For one table (``(id BIGINT, v STRING of 100 bytes)``, ``rows`` rows) this measures, in one run:

- the anchor: a raw rocksdict (``Options(raw_mode=True)``, in this process) loaded with the same encoded keys
  and values in the same batches; its multi-get rows/s of the same key batches, and its single ``get`` latency
  of the same single keys;
- ``lookup_batch`` rows/s of ``batches`` batches of ``batch_keys`` random keys each (one bucket);
- ``lookup([key])`` latency p50/p99 of ``singles`` random keys, one call at a time (over the tablet servers'
  lookup ports, docs/architecture.md), the same lookups by a client with ``client.lookup-port`` off (over
  gRPC only: shown, not judged) and the same number of bare gRPC echo round trips to a process of its own
  (:mod:`kvlease.ops.bench.grpc_floor`: the gRPC floor, reported), in alternating chunks, started once the
  whole machine is idle (busy < 10 % of its CPUs over a second, or after a minute; the targets are for low
  load, and another benchmark's cluster may still be stopping);
- lookups/s of ``threads`` client threads each doing single-key lookups on a ``buckets``-bucket table (the
  same rows), against the one-thread lookups/s of the same client.

Raw multi-gets and kvlease batch lookups alternate for ``rounds`` rounds, the best of each counts (this VM's
speed drifts); every answer is checked (each key found, its row's ``id`` the key).
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from kvlease.common.codec import RowCodec
from kvlease.common.tables import Column, TableInfo
from kvlease.ops.bench import grpc_floor
from kvlease.ops.bench.machine import wait_machine_idle
from kvlease.ops.bench.writes import make_batch

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]
LOAD_BATCH = 10_000
CHUNKS = 4  # single-key lookups and echo round trips alternate in this many chunks


def load(client, rows: int) -> None:
    for start in range(0, rows, LOAD_BATCH):
        client.upsert(make_batch(np.arange(start, min(start + LOAD_BATCH, rows))))


class RawAnchor:
    """A raw rocksdict in ``directory`` holding the encoded rows ``0..rows-1`` of :func:`make_batch` (loaded
    as kvlease loads them, :data:`LOAD_BATCH` rows per WriteBatch). Close it."""

    def __init__(self, directory: str, rows: int) -> None:
        from rocksdict import Options, Rdict, WriteBatch

        self.directory = directory
        self.codec = RowCodec(TableInfo(0, "bench", "raw", tuple(COLUMNS), ("id",), 1))
        self.db = Rdict(directory, Options(raw_mode=True))
        for start in range(0, rows, LOAD_BATCH):
            keys, values = self.codec.encode(make_batch(np.arange(start, min(start + LOAD_BATCH, rows))))
            batch = WriteBatch(raw_mode=True)
            for key, value in zip(keys, values):
                batch.put(key, value)
            self.db.write(batch)

    def keys(self, ids: np.ndarray) -> list[bytes]:
        return self.codec.encode_keys(pa.record_batch({"id": pa.array(ids, pa.int64())}))

    def multi_get_rows_per_s(self, batches: list[list[bytes]]) -> float:
        rows = 0
        t0 = time.perf_counter()
        for keys in batches:
            values = self.db.get(keys)
            rows += len(values) - values.count(None)
        return rows / (time.perf_counter() - t0)

    def get_ms(self, keys: list[bytes]) -> np.ndarray:
        out = np.empty(len(keys))
        for i, key in enumerate(keys):
            t0 = time.perf_counter()
            if self.db.get(key) is None:
                raise RuntimeError("raw rocksdict lost a key it was loaded with")
            out[i] = time.perf_counter() - t0
        return out * 1000

    def close(self) -> None:
        self.db.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def batch_rows_per_s(client, batches: list[pa.RecordBatch]) -> float:
    rows = 0
    t0 = time.perf_counter()
    for keys in batches:
        found = client.lookup_batch(keys)
        rows += found.num_rows
        if found.column("id").null_count or not found.column("id").equals(keys.column("id")):
            raise RuntimeError("a batch lookup answered other rows than the keys asked for")
    return rows / (time.perf_counter() - t0)


def single_ms(client, ids: list[int]) -> np.ndarray:
    out = np.empty(len(ids))
    for i, key in enumerate(ids):
        t0 = time.perf_counter()
        found = client.lookup([key])
        out[i] = time.perf_counter() - t0
        if found[0] is None or found[0]["id"] != key:
            raise RuntimeError(f"lookup of key {key} answered {found[0]}")
    return out * 1000


def singles_and_floor(client, grpc_client, ids: list[int], idle_wait_s: float = 60.0
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The single-key lookup latencies (ms) of ``ids`` by ``client`` and by ``grpc_client`` (gRPC only), and as
    many echo round trips (ms), in :data:`CHUNKS` alternating chunks, so that all meet the same moments of the
    machine; started once the machine is idle, or after ``idle_wait_s`` (the single-key targets hold at low
    load: the machine's busy fraction then is returned)."""
    with grpc_floor.EchoServer() as echo:
        busy = wait_machine_idle(step_s=min(1.0, max(0.1, idle_wait_s)), timeout_s=idle_wait_s)
        lookups, grpc_lookups, echoes = [], [], []
        for chunk in np.array_split(np.array(ids, dtype=np.int64), CHUNKS):
            lookups.append(single_ms(client, chunk.tolist()))
            grpc_lookups.append(single_ms(grpc_client, chunk.tolist()))
            echoes.append(echo.ms(len(chunk)))
    return np.concatenate(lookups), np.concatenate(grpc_lookups), np.concatenate(echoes), busy


def concurrent_per_s(client, ids: list[int], threads: int) -> float:
    """Single-key lookups/s of ``threads`` threads sharing ``client``, ``ids`` split between them."""
    failures: list[BaseException] = []
    parts = [ids[i::threads] for i in range(threads)]
    start = threading.Barrier(threads + 1)

    def worker(part: list[int]) -> None:
        start.wait()
        try:
            single_ms(client, part)
        except BaseException as exc:  # reported below
            failures.append(exc)

    workers = [threading.Thread(target=worker, args=(p,), name=f"bench-lookup-{i}") for i, p in enumerate(parts)]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    if failures:
        raise failures[0]
    return len(ids) / elapsed


def measure(client, grpc_client, client4, raw: RawAnchor, *, rows: int, batches: int, batch_keys: int, singles: int,
            threads: int, rounds: int, rng, progress: Callable[[str], None], label: str,
            idle_wait_s: float = 60.0) -> dict[str, Any]:
    """The figures of one replication factor (see the module docstring): ``client`` on the one-bucket table
    (``grpc_client`` too, with the lookup port off), ``client4`` on the table of several buckets, ``raw`` the
    anchor of the same rows."""
    key_ids = [rng.integers(0, rows, batch_keys) for _ in range(batches)]
    key_batches = [pa.record_batch({"id": pa.array(ids, pa.int64())}) for ids in key_ids]
    raw_batches = [raw.keys(ids) for ids in key_ids]
    single_ids = rng.integers(0, rows, singles).tolist()
    client.lookup_batch(key_batches[0])  # channels, routing and caches warm, on both sides
    single_ms(client, single_ids[:20])
    single_ms(grpc_client, single_ids[:20])
    raws, lookups = [], []
    for round_ in range(1, rounds + 1):
        progress(f"{label}: round {round_} of {rounds}: {batches} multi-gets / lookups of {batch_keys:,} keys")
        raws.append(raw.multi_get_rows_per_s(raw_batches))
        lookups.append(batch_rows_per_s(client, key_batches))
    progress(f"{label}: {singles:,} single-key lookups and as many bare gRPC echo round trips (the floor), "
             f"interleaved, on an idle machine; raw gets of the same keys")
    raw_ms = raw.get_ms(raw.keys(np.array(single_ids)))
    ms, grpc_ms, echo, busy = singles_and_floor(client, grpc_client, single_ids, idle_wait_s)
    progress(f"{label}: {singles:,} single-key lookups from 1 thread, then {threads} threads")
    single_ms(client4, single_ids[:20])
    one = float(len(single_ids) / (single_ms(client4, single_ids).sum() / 1000))
    many = concurrent_per_s(client4, single_ids, threads)
    return {"batch_rows_per_s": max(lookups), "raw_multi_get_rows_per_s": max(raws),
            "batch_vs_raw": max(lookups) / max(raws),
            "round_rows_per_s": [{"lookup": lk, "raw": r} for lk, r in zip(lookups, raws)],
            "single_p50_ms": float(np.percentile(ms, 50)), "single_p99_ms": float(np.percentile(ms, 99)),
            "grpc_single_p50_ms": float(np.percentile(grpc_ms, 50)),
            "grpc_single_p99_ms": float(np.percentile(grpc_ms, 99)),
            "raw_get_p50_ms": float(np.percentile(raw_ms, 50)), "raw_get_p99_ms": float(np.percentile(raw_ms, 99)),
            "echo_p50_ms": float(np.percentile(echo, 50)), "echo_p99_ms": float(np.percentile(echo, 99)),
            "machine_busy_before_singles": busy,
            "one_thread_per_s": one, "threads_per_s": many}
