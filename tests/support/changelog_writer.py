"""Crash-test helper and throughput benchmark for ``tablet/log/changelog.py``.

``python -m tests.support.changelog_writer DIR SEGMENT_BYTES SEED`` opens (and so
recovers) the changelog in DIR with fsync on, then loops: append a batch of
random size whose records are :func:`expected_records` of their offsets, and
print ``base next`` flushed once ``append`` returned. ``tests/tablet/log/test_changelog.py``
kills it with SIGKILL and checks every printed range survived.

``python -m tests.support.changelog_writer bench [SECONDS]`` measures append and read
throughput with 1000-record batches of 16-byte keys and 100-byte values in a
temp directory (best of 3 runs per case) and prints a table.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time

import numpy as np

from kvlease.common.logentry import record_batch
from kvlease.tablet.log.changelog import Changelog


def expected_records(base: int, count: int) -> tuple[list[int], list[bytes], list[bytes | None]]:
    """The records at offsets ``base`` … ``base + count - 1``: a pure function of the offset."""
    offsets = range(base, base + count)
    change_types = [o % 4 for o in offsets]
    keys = [b"key-%012d" % o for o in offsets]
    values = [None if o % 11 == 5 else (b"%d:" % o) * (1 + o % 37) for o in offsets]
    return change_types, keys, values


def main(argv: list[str]) -> None:
    directory, segment_bytes, seed = argv[0], int(argv[1]), int(argv[2])
    rng = random.Random(seed)
    log = Changelog(directory, segment_bytes=segment_bytes, fsync=True)
    print(f"open {log.start_offset} {log.end_offset}", flush=True)
    while True:
        base = log.end_offset
        count = rng.choice((1, rng.randint(1, 200), rng.randint(1000, 6000)))
        got = log.append(*expected_records(base, count))
        if got != (base, base + count):
            raise SystemExit(f"append({base}, {count}) returned {got}")
        print(f"{got[0]} {got[1]}", flush=True)


GROUP = 8  # batches per append_batches call in the group-commit case


def bench(seconds: float = 3.0, batch_size: int = 1000, batches: int = 48) -> None:
    rng = np.random.default_rng(0)

    def blobs(width: int) -> list[bytes]:
        raw = rng.bytes(width * batch_size)
        return [raw[i:i + width] for i in range(0, len(raw), width)]

    data = [(rng.integers(0, 4, batch_size, dtype=np.int8), blobs(16), blobs(100)) for _ in range(batches)]
    arrow = [record_batch(*d) for d in data]

    def run(fsync: bool, source: str) -> tuple[float, str]:
        best, directory = 0.0, ""
        for _ in range(3):
            shutil.rmtree(directory, ignore_errors=True)
            directory = tempfile.mkdtemp(prefix="changelog-bench-")
            with Changelog(directory, segment_bytes=64 << 20, fsync=fsync) as log:
                n, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds / 3:
                    i = n % batches
                    if source == "lists":
                        log.append(*data[i])
                    elif source == "batch":
                        log.append_batch(arrow[i])
                    else:
                        log.append_batches(arrow[i:i + GROUP])
                    n += 1 if source != "group" else len(arrow[i:i + GROUP])
                best = max(best, n * batch_size / (time.perf_counter() - start))
        return best, directory

    print(f"{'case':52} {'records/s':>12}")
    names = {"batch": "append_batch(RecordBatch)", "lists": "append(python lists)",
             "group": f"append_batches({GROUP} RecordBatches)"}
    kept = ""
    for fsync in (True, False):
        for source in ("batch", "lists", "group"):
            rate, directory = run(fsync, source)
            print(f"{names[source] + ', fsync ' + ('on' if fsync else 'off'):52} {rate:12,.0f}")
            if not fsync and source == "batch":
                kept = directory
            else:
                shutil.rmtree(directory, ignore_errors=True)
    with Changelog(kept, segment_bytes=64 << 20, fsync=False) as log:
        total = log.end_offset - log.start_offset
        size = sum(s.size for s in log.segments())
        for name in ("read", "read_raw"):
            best = 0.0
            for _ in range(3):
                offset, start = log.start_offset, time.perf_counter()
                while offset < log.end_offset:
                    if name == "read":
                        offset = log.read(offset, 1 << 20)[-1].next_offset
                    else:
                        offset += sum(int.from_bytes(r[12:16], "little") for r in log.read_raw(offset, 1 << 20))
                best = max(best, total / (time.perf_counter() - start))
            print(f"{name + f', 1 MiB per call ({total:,} records, {size >> 20} MiB)':52} {best:12,.0f}")
    shutil.rmtree(kept, ignore_errors=True)

if __name__ == "__main__":
    if sys.argv[1:2] == ["bench"]:
        bench(*map(float, sys.argv[2:3]))
    else:
        main(sys.argv[1:])
