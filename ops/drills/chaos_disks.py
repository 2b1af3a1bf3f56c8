"""A tablet server's disk made full and freed again: the chaos drill's ``disk-full`` fault.

Only on a local cluster whose tablet servers keep their data on small disks
of their own (``kvlease cluster start --tablet-disk SIZE``: a tmpfs on each
data dir, :mod:`kvlease.ops.local_cluster.tablet_disks`), never on the host's disk.
One filler file (:data:`FILLER`, in the data dir: the server reads only
numeric names and its own files there) is written until the disk has no
byte left, and kept at that while the fault holds (space the server frees,
e.g. a RocksDB compaction's inputs, is taken too); deleting it frees the
disk at once. A drill killed mid-fault leaves the filler behind: the next
chaos drill deletes it first (:func:`restore_interrupted`), and ``cluster
stop`` unmounts the disk anyway.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Mapping

from kvlease.ops import local_cluster

FILLER = "kvlease-drill-disk-full.filler"
_CHUNK = b"\0" * (1 << 20)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


class DiskFill:
    """The disk of ``data_dir`` full while active: :meth:`begin`, :meth:`top_up` now and then, :meth:`end`."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILLER
        self._fd: int | None = None
        self.written = 0

    def begin(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.top_up()
        except BaseException:
            self.end()
            raise

    def top_up(self) -> int:
        """Write until the disk is full (a short write takes the last bytes, the next one fails with ENOSPC);
        returns the bytes written now."""
        assert self._fd is not None, "begin() first"
        before = self.written
        try:
            while True:
                self.written += os.write(self._fd, _CHUNK)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        return self.written - before

    def end(self) -> None:
        """Delete the filler (the disk has its room again); fine if it is gone already."""
        try:
            self.path.unlink(missing_ok=True)
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def restore_interrupted(directory: str, doc: Mapping[str, Any]) -> list[str]:
    """Delete the fillers a killed drill left on the cluster's tablet disks; the ids of the tablet servers whose
    disk it freed."""
    disks = local_cluster.tablet_disks.of(doc) or {}
    freed = []
    for tablet_id in disks.get("tablets", []):
        filler = local_cluster.tablet_disks.data_dir(directory, tablet_id) / FILLER
        if filler.exists():
            filler.unlink()
            freed.append(str(tablet_id))
    return freed
