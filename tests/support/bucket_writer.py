"""Crash-test helper and throughput benchmark for ``tablet/bucket/store.py``.

``python -m tests.support.bucket_writer DIR SEED`` opens (and so recovers) the bucket in
DIR with fsync on, small changelog segments and a small memtable (RocksDB
flushes often), prints ``open REPLAYED_FROM END`` (RocksDB held the records
below REPLAYED_FROM; the rest was replayed from the changelog), then loops over the writes
``write_ops(SEED, 0)``, ``write_ops(SEED, 1)``, … and prints ``i base next``
flushed once ``write`` returned. ``tests/tablet/bucket/test_bucket.py`` kills it with SIGKILL
and checks every printed write survived and the changelog and KV agree.

``python -m tests.support.bucket_writer bench [ROWS [ROUNDS [BATCH_ROWS]]]`` measures ``BucketStore.write``
(upsert batches of 1000 rows unless said, ``id BIGINT`` + a 100-character ``STRING``; new
keys, then updates of existing keys; fsync on and off) against a raw rocksdict
WriteBatch of the same encoded rows into a DB in the same state, and
``lookup`` against a raw multi-get, cases interleaved in one run; prints a table.
"""

from __future__ import annotations

import collections
import random
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.bucket.store import BucketStore
from kvlease.common.codec import RowCodec

TABLE = TableInfo(7, "crash", "rows", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
KEY_SPACE = 3000
SEGMENT_BYTES = 256 << 10
MEMTABLE_BYTES = 512 << 10


def write_ops(seed: int, i: int) -> tuple[list[int], list[str | None], list[int]]:
    """Write ``i`` of writer ``seed``: (upsert ids, their values, delete ids). Ids may repeat."""
    rng = random.Random(seed * 1_000_003 + i)
    count = rng.choice((1, rng.randint(1, 40), rng.randint(100, 600), rng.randint(100, 600), 3000))
    if rng.random() < 0.3:  # with duplicates
        ids = [rng.randrange(KEY_SPACE) for _ in range(count)]
    else:
        ids = rng.sample(range(KEY_SPACE), min(count, KEY_SPACE))
    values = [None if rng.random() < 0.05 else f"s{seed}w{i}:{k}:" + "x" * rng.randrange(120) for k in ids]
    deletes = [rng.randrange(KEY_SPACE) for _ in range(rng.choice((0, 0, 1, rng.randint(1, 80))))]
    if ids and rng.random() < 0.2:  # delete some of the keys this write upserts
        deletes += rng.sample(ids, min(3, len(ids)))
    return ids, values, deletes


def batches(ids: list[int], values: list[str | None], deletes: list[int]) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    upserts = pa.RecordBatch.from_arrays([pa.array(ids, pa.int64()), pa.array(values, pa.string())],
                                         names=["id", "v"])
    return upserts, pa.RecordBatch.from_arrays([pa.array(deletes, pa.int64())], names=["id"])


def main(argv: list[str]) -> None:
    directory, seed = argv[0], int(argv[1])
    store = BucketStore.open(directory, TABLE, segment_bytes=SEGMENT_BYTES, fsync=True,
                             memtable_bytes=MEMTABLE_BYTES)
    print(f"open {store.replayed[0]} {store.log_end_offset}", flush=True)
    i = 0
    while True:
        base, nxt = store.write(*batches(*write_ops(seed, i)))
        print(f"{i} {base} {nxt}", flush=True)
        i += 1


# --- benchmark ----------------------------------------------------------------------------------

BENCH_TABLE = TableInfo(1, "bench", "rows", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
BATCH_ROWS = 1000


class _BenchData:
    """The rows every case writes (or looks up), and the cases' runs: each takes a fresh directory and
    returns rows/s."""

    def __init__(self, total_rows: int, batch_rows: int = BATCH_ROWS) -> None:
        rng = np.random.default_rng(0)
        ids = rng.permutation(total_rows).astype(np.int64) * 7919  # spread, unordered keys
        text = pa.array(["v" * 90 + f"{i:010d}" for i in range(batch_rows)])  # 100 characters
        self.total_rows = total_rows
        self.upserts = [pa.RecordBatch.from_arrays([pa.array(part), text.slice(0, len(part))], names=["id", "v"])
                        for part in (ids[s:s + batch_rows] for s in range(0, total_rows, batch_rows))]
        self.key_batches = [b.select(["id"]) for b in self.upserts]
        self.encoded = [RowCodec(BENCH_TABLE).encode(b) for b in self.upserts]

    def timed(self, step) -> float:
        start = time.perf_counter()
        for i in range(len(self.upserts)):
            step(i)
        return self.total_rows / (time.perf_counter() - start)

    def raw(self, wal: bool = True, prefill: bool = False, multi_get: bool = False):
        encoded = self.encoded

        def run(directory: str) -> float:
            db = Rdict(directory + "/kv", Options(raw_mode=True))
            if not wal:
                options = WriteOptions()
                options.disable_wal = True
                db.set_write_options(options)

            def step(i: int) -> None:
                keys, values = encoded[i]
                if multi_get:
                    db.get(keys)
                batch = WriteBatch(raw_mode=True)
                collections.deque(map(batch.put, keys, values), maxlen=0)
                db.write(batch)
            try:
                if prefill:
                    for i in range(len(encoded)):
                        step(i)
                return self.timed(step)
            finally:
                db.close()
        return run

    def store_write(self, fsync: bool, updates: bool):
        def run(directory: str) -> float:
            with BucketStore.open(directory + "/b", BENCH_TABLE, segment_bytes=64 << 20, fsync=fsync) as store:
                if updates:  # the rows exist: every write reads and logs a before-image
                    for batch in self.upserts:
                        store.write(batch)
                return self.timed(lambda i: store.write(self.upserts[i]))
        return run

    def lookup(self, raw_get: bool):
        def run(directory: str) -> float:
            with BucketStore.open(directory + "/b", BENCH_TABLE, segment_bytes=64 << 20, fsync=False) as store:
                for batch in self.upserts:
                    store.write(batch)
                if raw_get:
                    return self.timed(lambda i: store._kv.get(self.encoded[i][0]))
                return self.timed(lambda i: store.lookup(self.key_batches[i]))
        return run

    def cases(self) -> list:
        """``[(name, run, the raw case it is compared with)]``."""
        new_keys, updates, lookups = "raw WriteBatch, new keys", "raw WriteBatch, updates", "raw multi-get (bytes)"
        return [
            (new_keys + " (WAL on, defaults)", self.raw(), None),
            ("raw WriteBatch, new keys (WAL off)", self.raw(wal=False), None),
            (updates + " (WAL on)", self.raw(prefill=True), None),
            ("raw multi-get + WriteBatch, updates", self.raw(prefill=True, multi_get=True), None),
            ("BucketStore.write, new keys, fsync off", self.store_write(False, False),
             new_keys + " (WAL on, defaults)"),
            ("BucketStore.write, new keys, fsync on", self.store_write(True, False), new_keys + " (WAL on, defaults)"),
            ("BucketStore.write, updates, fsync off", self.store_write(False, True), updates + " (WAL on)"),
            ("BucketStore.write, updates, fsync on", self.store_write(True, True), updates + " (WAL on)"),
            (lookups, self.lookup(True), None),
            ("BucketStore.lookup (decoded RecordBatch)", self.lookup(False), lookups),
        ]


def bench(total_rows: int = 200_000, rounds: int = 3, batch_rows: int = BATCH_ROWS) -> None:
    """Each case writes (or looks up) the same ``total_rows`` rows in ``batch_rows``-row batches."""
    cases = _BenchData(total_rows, batch_rows).cases()
    best = {name: 0.0 for name, _, _ in cases}
    for _ in range(rounds):  # cases interleaved, so a burst of load elsewhere hits all of them
        for name, run, _ in cases:
            directory = tempfile.mkdtemp(prefix="bucket-bench-")
            try:
                best[name] = max(best[name], run(directory))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
    print(f"{total_rows:,} rows of {batch_rows:,}-row batches, best of {rounds}")
    print(f"{'case':48} {'rows/s':>12}  ratio")
    for name, _, against in cases:
        ratio = f"{best[name] / best[against]:.2f} of '{against}'" if against else ""
        print(f"{name:48} {best[name]:12,.0f}  {ratio}")

if __name__ == "__main__":
    if sys.argv[1:2] == ["bench"]:
        bench(*map(int, sys.argv[2:5]))
    else:
        main(sys.argv[1:])
