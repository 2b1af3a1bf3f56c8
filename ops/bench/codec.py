"""``python -m kvlease.ops.bench.codec [--rows N] [--json]``: rows/s of the row codec.

One run, one table ``(id BIGINT primary key, value STRING)`` with ~100-byte
values, N rows (default 1,000,000), each step timed on its own (best of
``--repeat`` runs):

- ``to_batch``: Python dicts -> Arrow batch (client side);
- ``encode``: batch -> (keys, values) as ``list[bytes]`` (validate included);
- ``decode_values`` / ``decode_keys``: ``list[bytes]`` -> Arrow batch;
- ``bucket_of_keys``: crc32 of every key;
- ``python_encode`` / ``python_decode``: the same layouts with a plain per-row
  ``struct`` loop, the baseline the vectorized codec is compared with.
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from typing import Callable

import pyarrow as pa

from kvlease.common.tables import Column, TableInfo
from kvlease.common.codec import RowCodec, bucket_of_keys

TABLE = TableInfo(1, "bench", "codec", (Column("id", "BIGINT"), Column("value", "STRING")), ("id",), 16)


def python_encode(ids: list[int], texts: list[str]) -> tuple[list[bytes], list[bytes]]:
    key, head = struct.Struct(">Q"), struct.Struct("<BIBqI")  # value format 2: version, schema id, bitmap
    keys, values = [], []
    for i, text in zip(ids, texts):
        keys.append(key.pack(i + (1 << 63)))  # sign bit flipped
        data = text.encode()
        values.append(head.pack(2, 1, 0, i, len(data)) + data)
    return keys, values


def python_decode(values: list[bytes]) -> tuple[list[int], list[str]]:
    head = struct.Struct("<BIBqI")
    ids, texts = [], []
    for value in values:
        _, _, _, i, length = head.unpack_from(value)
        ids.append(i)
        texts.append(value[head.size:head.size + length].decode())
    return ids, texts


def best(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(rows: int, repeat: int) -> dict[str, float]:
    codec = RowCodec(TABLE)
    ids = list(range(-rows // 2, rows - rows // 2))
    texts = [f"{i:012d}-" + "x" * 87 for i in ids]  # 100 characters
    dicts = [{"id": i, "value": t} for i, t in zip(ids, texts)]
    batch = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()), "value": pa.array(texts)},
                                       schema=codec.schema)
    keys, values = codec.encode(batch)
    assert (keys, values) == python_encode(ids, texts), "codec and baseline disagree"
    seconds = {
        "to_batch": best(repeat, lambda: codec.to_batch(dicts)),
        "encode": best(repeat, lambda: codec.encode(batch)),
        "decode_values": best(repeat, lambda: codec.decode_values(values)),
        "decode_keys": best(repeat, lambda: codec.decode_keys(keys)),
        "bucket_of_keys": best(repeat, lambda: bucket_of_keys(keys, 16)),
        "python_encode": best(repeat, lambda: python_encode(ids, texts)),
        "python_decode": best(repeat, lambda: python_decode(values)),
    }
    return {name: rows / s for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rates = run(args.rows, args.repeat)
    if args.json:
        print(json.dumps({"rows": args.rows, "rows_per_s": {k: round(v) for k, v in rates.items()}}))
        return
    print(f"{args.rows:,} rows (id BIGINT, value STRING ~100 B), best of {args.repeat}")
    for name, rate in rates.items():
        print(f"  {name:<15} {rate / 1e6:7.2f} M rows/s")
    print(f"  encode  vectorized/python: {rates['encode'] / rates['python_encode']:.1f}x")
    print(f"  decode  vectorized/python: {rates['decode_values'] / rates['python_decode']:.1f}x")


if __name__ == "__main__":
    main()
