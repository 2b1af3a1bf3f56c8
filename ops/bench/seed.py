"""Many leases written straight into their persisted layout, for benchmarks that need 100,000 of them.

Acquiring a lease goes through the coordinator's loop (~1-2 ms of its CPU
each): 100,000 take minutes. A benchmark that only needs them *held* (idle
cost, failover) writes them here instead, in exactly the form the coordinator
writes: the table files through :meth:`LeaseStore.prepare` (one per thousand
leases, as one batch of the loop would write them; new names, then pointed
to), then the ZooKeeper nodes, a thousand creates per multi-op, pipelined.
Coordinators must not be running while this writes: an active one would not
know the leases (it learns them at its next reinitialization).

``python -m kvlease.ops.bench.seed --config FILE --table-id T --buckets B --count N
--prefix P --expiration-time MS`` (the benchmark runs it as a process of its
own); prints how many it wrote. It is the one module of ``ops`` that imports the
lease domain (``tests/project/test_layers.py`` allows it by name): it writes what the
coordinator's own :class:`~kvlease.leases.store.LeaseStore` writes.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from typing import Callable

from kvlease.common import config as cfg
from kvlease.common import zkpaths
from kvlease.common.model import Lease, TableBucket
from kvlease.common.storage import open_storage
from kvlease.common.zk import make_client
from kvlease.leases.events import PersistLease
from kvlease.leases.store import LeaseStore

CHUNK = 1_000  # leases per multi-op (~250 bytes each: well under ZooKeeper's 1 MiB request limit)
WINDOW = 8  # multi-ops in flight


def seed_leases(config: cfg.Config, table_id: int, buckets: int, lease_ids: list[str], expiration_time: int,
                snapshot_id: int = 1, progress: Callable[[int], None] = lambda done: None) -> int:
    """Persist a lease per id, holding snapshot ``snapshot_id`` of bucket ``i % buckets``; how many.

    Files are written without fsync (a benchmark's setup; the coordinator reads them back
    the same either way). Raises what a failed multi-op raises (ids must be new).
    """
    storage = open_storage(config[cfg.REMOTE_DATA_DIR], config.with_overrides({cfg.REMOTE_FSYNC.name: False}))
    store = LeaseStore(storage, io_threads=8)
    zk = make_client(config)
    pending: deque = deque()
    done = 0
    try:
        zk.ensure_path(zkpaths.LEASES)
        for start in range(0, len(lease_ids), CHUNK):
            writes = [PersistLease((0, i), "acquire", None,
                                   Lease(lease_id, expiration_time, {TableBucket(table_id, i % buckets): snapshot_id}),
                                   frozenset({table_id}))
                      for i, lease_id in enumerate(lease_ids[start:start + CHUNK], start)]
            txn = zk.transaction()
            for prepared in store.prepare(writes):
                if isinstance(prepared, Exception):
                    raise prepared
                txn.create(prepared.op.path, prepared.op.data)
            pending.append((len(writes), txn.commit_async()))
            while len(pending) >= WINDOW:
                done += _finish(*pending.popleft())
                progress(done)
        while pending:
            done += _finish(*pending.popleft())
            progress(done)
        return done
    finally:
        zk.stop()
        zk.close()
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlease.ops.bench.seed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the coordinators' TOML config file")
    parser.add_argument("--table-id", type=int, required=True)
    parser.add_argument("--buckets", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", required=True, help="lease ids are PREFIX-0 … PREFIX-(N-1)")
    parser.add_argument("--expiration-time", type=int, required=True, help="ms since the epoch")
    args = parser.parse_args(argv)
    done = seed_leases(cfg.Config.load(args.config), args.table_id, args.buckets,
                       [f"{args.prefix}-{i}" for i in range(args.count)], args.expiration_time,
                       progress=lambda n: n % 20_000 == 0 and print(f"seeded {n}", file=sys.stderr, flush=True))
    print(done)
    return 0


def _finish(count: int, result) -> int:
    outcomes = result.get()
    failed = [r for r in outcomes if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"seeding leases failed: {failed[0]!r}")
    return count


if __name__ == "__main__":
    sys.exit(main())
