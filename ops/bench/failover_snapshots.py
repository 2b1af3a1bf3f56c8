"""``kvlease bench replication``'s snapshot figures of a failover: the new leader's first snapshot, and what keeping
it incremental costs the followers (their re-bases on each snapshot, ``tablet/replication/rebase.py``).

On the big failover table, once loaded and snapshotted (``S1``, full):

1. the two followers re-base on ``S1`` (they download all of it: the one-time
   cost, what a rebuild downloads);
2. ``changed`` rows are updated and the leader takes ``S2`` (it uploads about
   them); the followers re-base on ``S2``: they download what the leader
   uploaded and hard-link the rest (the steady cost, each snapshot); then,
   once every tablet server's compactions have ended, the leader takes
   ``S2'``: a compaction since ``S2`` (the first L0 -> L1 one of a freshly
   loaded table rewrites every row) is uploaded there by the old leader, as
   any leader's next snapshot would, and the followers re-base on it
   (``compaction_snapshot_upload_bytes``: the compaction's output and one
   row written so that there is something new to snapshot);
3. ``changed`` rows are updated again, then the leader is killed
   (``replication.failover_once``); before it restarts, the new leader's first
   snapshot ``S3`` is taken: its new files (not in ``S2'``) are what it uploaded.

Data changed since the last snapshot: the rows written after ``S2'`` (the
changed rows and the failover's one row), :data:`ROW_BYTES` each (the 8-byte
id and the 100-byte value: ``writes.make_batch``). The re-bases are read from
the tablet servers' metrics (``kvlease_tablet_rebase*``).
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from kvlease.ops import local_cluster
from kvlease.ops.bench.machine import wait_idle
from kvlease.ops.bench.writes import make_batch

ROW_BYTES = 8 + 100
REBASE_INTERVAL = "1s"  # replica.rebase.interval of the bench's cluster
REBASE_WAIT_S = 300.0
_COUNTERS = {"rebases": "kvlease_tablet_rebases_total",
             "downloaded_bytes": "kvlease_tablet_rebase_download_bytes_total",
             "linked_bytes": "kvlease_tablet_rebase_linked_bytes_total",
             "seconds": "kvlease_tablet_rebase_seconds_total"}


def rebase_totals(directory: str) -> dict[str, float]:
    """The re-base counters summed over the running tablet servers of the local cluster."""
    totals = dict.fromkeys(_COUNTERS, 0.0)
    names = {metric: key for key, metric in _COUNTERS.items()}
    for tablet in local_cluster.load(directory)["tablets"]:
        address = tablet.get("metrics_address")
        if not address:
            continue
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:  # not running (killed): its counters are not counted
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names:
                    totals[names[sample.name]] += sample.value
    return totals


def wait_rebases(directory: str, since: dict[str, float], count: int) -> dict[str, float]:
    """Until ``count`` more re-bases than ``since`` are counted; the counters' increase. RuntimeError after
    :data:`REBASE_WAIT_S`."""
    deadline = time.monotonic() + REBASE_WAIT_S
    while True:
        now = rebase_totals(directory)
        if now["rebases"] - since["rebases"] >= count:
            return {key: now[key] - since[key] for key in now}
        if time.monotonic() > deadline:
            raise RuntimeError(f"the followers did not re-base on the latest snapshot within {REBASE_WAIT_S:g}s "
                               f"({now['rebases'] - since['rebases']:g} of {count})")
        time.sleep(0.2)


def change(client, rows: int, count: int, salt: int) -> None:
    """Update ``count`` of the ``rows`` rows, spread over the key range (new random values)."""
    ids = np.linspace(0, rows - 1, num=count, dtype=np.int64)
    for start in range(0, count, 10_000):
        client.upsert(make_batch(ids[start:start + 10_000], salt=salt))


def new_files(previous: dict[str, int], files: dict[str, int]) -> int:
    """Bytes of the files of a snapshot that the previous one does not have: what its upload sent."""
    return sum(size for path, size in files.items() if path not in previous)


def prepare(directory: str, client, snapshot_files, rows: int, changed: int, first: dict[str, int],
            start: dict[str, float], progress) -> dict[str, Any]:
    """Steps 1 and 2 of the module docstring, then the changes of step 3; ``first``: the files of ``S1``
    (``snapshot_files()`` takes a snapshot and returns its files), ``start``: :func:`rebase_totals` before
    ``S1`` was taken. Returns the figures so far and ``S2``'s files."""
    progress("waiting for the followers to re-base on the first snapshot")
    initial = wait_rebases(directory, start, 2)
    progress(f"updating {changed:,} rows, snapshot, the followers re-base on it")
    change(client, rows, changed, salt=7)
    second = snapshot_files()
    steady = wait_rebases(directory, _plus(start, initial), 2)
    settled, compaction = settle(directory, lambda: change(client, rows, 1, salt=9), snapshot_files, second,
                                 _plus(_plus(start, initial), steady), progress)
    progress(f"updating {changed:,} rows more (the data changed since the last snapshot)")
    change(client, rows, changed, salt=8)
    return {"full_snapshot_bytes": sum(first.values()), "second_snapshot_upload_bytes": new_files(first, second),
            "compaction_snapshot_upload_bytes": compaction,
            "rebase_initial": _per_follower(initial), "rebase_steady": _per_follower(steady),
            "changed_rows": changed, "_second": settled}


def settle(directory: str, touch, snapshot_files, second: dict[str, int], since: dict[str, float],
           progress) -> tuple[dict[str, int], int]:
    """Let RocksDB's compactions after ``second`` end on every tablet server, then snapshot again: a compaction
    (the first L0 -> L1 one of a freshly loaded table rewrites every row) makes any leader's next snapshot upload
    what it rewrote, failover or not, so it is taken here by the old leader and the followers re-base on it
    before the changes the failover's snapshot is judged by (``touch()`` writes a row first: a snapshot of
    nothing new is not taken). The snapshot's files, and the bytes it uploaded."""
    progress("waiting for the tablet servers' compactions to end, snapshot again")
    for tablet in local_cluster.load(directory)["tablets"]:
        if tablet.get("pid"):
            wait_idle(int(tablet["pid"]), timeout_s=60.0)
    touch()
    settled = snapshot_files()
    wait_rebases(directory, since, 2)
    return settled, new_files(second, settled)


def after_failover(figures: dict[str, Any], snapshot_files, timeout_s: float = 60.0) -> None:
    """Step 3's snapshot, by the new leader (the killed one is still down): ``first_snapshot_bytes`` and
    ``changed_bytes`` (the changed rows and the failover's row) go into ``figures``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            files = snapshot_files()
            break
        except Exception:  # the new leader is not serving snapshots yet (its leader lease wait)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    figures["first_snapshot_bytes"] = new_files(figures.pop("_second"), files)
    figures["changed_bytes"] = (figures["changed_rows"] + 1) * ROW_BYTES


def _plus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {key: a[key] + b[key] for key in a}


def _per_follower(delta: dict[str, float]) -> dict[str, float]:
    n = max(delta["rebases"], 1.0)
    return {"rebases": delta["rebases"], "downloaded_bytes": delta["downloaded_bytes"] / n,
            "linked_bytes": delta["linked_bytes"] / n, "seconds": delta["seconds"] / n}
