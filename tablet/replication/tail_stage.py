"""A rebuild's changelog tail made ready while the snapshot downloads: its changelog and its SST file.

A rebuilt replica must hold its leader's log from the snapshot's offset on and
RocksDB must apply it (``tablet/replication/rebuild.py``). Done after the
install, the tail's append (written, fsynced) and its apply are on the
rebuild's critical path. :func:`stage` does both while the download still
runs, as soon as the tail prefetch has caught up
(``tablet/replication/tail_prefetch.py``), in the rebuild's own directory:

- the **changelog**: a new changelog starting at the snapshot's offset holding
  the entries byte for byte, durable, with their leader epochs
  (``snapshot_install.stage_log``): the install moves it in instead of an
  empty one;
- the **SST file** of their records (``tablet/store/tail_sst.py``), built on a
  second thread meanwhile: ingested once the replica's files are open instead
  of applying the records one by one.

Entries fetched after that are appended and applied as the fetcher does.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvlease.common.logentry import read_header
from kvlease.tablet.store import snapshot_install, tail_sst
from kvlease.tablet.store.snapshot_install import StagedLog
from kvlease.tablet.store.tail_sst import TailSst


@dataclass(frozen=True)
class StagedTail:
    """The first ``count`` entries of a prefetched tail (records ``from_offset`` … ``next_offset - 1``),
    staged: ``log`` to install, ``sst`` (None: nothing to ingest, they are applied from the log) to ingest."""

    count: int
    from_offset: int
    next_offset: int
    log: StagedLog
    sst: TailSst | None


def stage(entries: list[bytes], from_offset: int, directory: str, *, segment_bytes: int,
          fsync: bool = True) -> StagedTail:
    """Stage ``entries`` (framed, from ``from_offset`` on) in ``directory`` (created; the bucket's, for the
    install's renames): see the module docstring. Raises what ``stage_log`` or ``tail_sst.build`` raise
    (a damaged entry, a gap, an I/O error); the caller removes ``directory`` then."""
    os.makedirs(directory, exist_ok=True)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rebuild-tail-sst") as pool:
        building = pool.submit(tail_sst.build, entries, from_offset, os.path.join(directory, "tail.sst"), fsync=fsync)
        log = snapshot_install.stage_log(os.path.join(directory, "log"), from_offset, entries,
                                         segment_bytes=segment_bytes, fsync=fsync)
        sst = building.result()
    last = read_header(memoryview(entries[-1]), 0, len(entries[-1]))  # stage_log checked them all
    return StagedTail(len(entries), from_offset, last.base_offset + last.count, log, sst)
