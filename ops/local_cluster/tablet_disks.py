"""Small disks of their own for a local cluster's tablet servers (``kvlease cluster start --tablet-disk SIZE``).

A tmpfs of SIZE is mounted on each tablet server's data dir
(``D/tablet-N/data``) before the server starts, so a drill can fill one
server's disk (the chaos drill's ``disk-full``) without touching the host's
disk, where the rest of the cluster directory lives. Mounting needs root.

``cluster.json`` records them under :data:`KEY`: ``{"size_bytes": N,
"tablets": ["1", …]}``; a mount's path is always derived from the cluster
directory and the tablet id (:func:`data_dir`), never read from the file, so
nothing else is ever unmounted. ``cluster stop`` and a start that failed
unmount them whatever happened (:func:`unmount_all`); a restart of one tablet
server keeps its mount (it is a directory the new process opens again). A
tmpfs is memory: its rows are gone once it is unmounted, so a cluster whose
tablet disks were unmounted cannot be started again (:func:`kept`).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, Mapping

from kvlease.ops.local_cluster.processes import ClusterError

KEY = "tablet_disk"
MIN_BYTES = 16 << 20  # a tablet server's RocksDB files and changelogs of a few buckets, and room to write
_SIZE = re.compile(r"\s*(\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*", re.IGNORECASE)
_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(value: Any) -> int:
    """``'64m'`` (also ``64mb``, ``64MiB``, ``1g``, ``65536k``, bytes) -> bytes, at least :data:`MIN_BYTES`;
    ClusterError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = _SIZE.fullmatch(str(value))
        if not m:
            raise ClusterError(f"{value!r} is not a size (use e.g. 64m, 1g)")
        size = int(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]
    if size < MIN_BYTES:
        raise ClusterError(f"{value!r} is too small for the disk of a tablet server: it needs at least "
                           f"{MIN_BYTES >> 20}m")
    return size


def show_size(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 20):.0f} MiB" if size_bytes >= 1 << 20 else f"{size_bytes} bytes"


def data_dir(directory: str | os.PathLike[str], tablet_id: str | int) -> Path:
    """Where tablet server ``tablet_id`` of the cluster in ``directory`` keeps its data (its tmpfs, if it has one)."""
    return Path(directory).resolve() / f"tablet-{tablet_id}" / "data"


def of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The cluster's tablet disks (``{"size_bytes", "tablets"}``), or None: its tablet servers use the host disk."""
    disks = doc.get(KEY)
    return disks if isinstance(disks, dict) and disks.get("tablets") else None


def every_tablet_has_one(doc: Mapping[str, Any]) -> bool:
    """Whether every tablet server of ``doc`` keeps its data on a small disk of its own."""
    disks = of(doc)
    tablets = [str(t.get("id")) for t in doc.get("tablets", [])]
    return bool(disks and tablets) and set(tablets) <= set(map(str, disks["tablets"]))


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError(f"--tablet-disk mounts a tmpfs on each tablet server's data dir, which only root may do "
                           f"(this is uid {os.geteuid()}); start the cluster without it, or as root")


def kept(directory: Path, previous: Mapping[str, Any], size_bytes: int | None) -> dict[str, Any] | None:
    """The tablet disks a cluster started again in ``directory`` keeps: those of ``previous`` (its stopped
    cluster.json), if every one is still mounted (its processes were killed, not stopped: the rows are there).
    ClusterError if they were unmounted (the rows are gone), if ``size_bytes`` asks for other ones, or if
    ``size_bytes`` would hide the data its tablet servers kept on the host disk."""
    disks = of(previous)
    if disks is None:
        if size_bytes is not None and previous.get("tablets"):
            raise ClusterError(f"the cluster in {directory} keeps its tablet servers' data on the host disk: "
                               "--tablet-disk would hide it; start it again without --tablet-disk, or start a new "
                               "cluster in another directory")
        return None
    gone = [str(t) for t in disks["tablets"] if not os.path.ismount(data_dir(directory, t))]
    if gone:
        raise ClusterError(f"the tablet servers of the cluster in {directory} kept their data on tmpfs disks "
                           f"(--tablet-disk), and those of tablet server(s) {', '.join(gone)} were unmounted by "
                           "`cluster stop`: their rows are gone; start a new cluster in another directory")
    if size_bytes is not None and size_bytes != disks["size_bytes"]:
        raise ClusterError(f"the tablet disks of the cluster in {directory} are {show_size(disks['size_bytes'])}; "
                           f"start it again without --tablet-disk (or with that size)")
    return {"size_bytes": int(disks["size_bytes"]), "tablets": [str(t) for t in disks["tablets"]]}


def mount(path: Path, size_bytes: int) -> None:
    """A tmpfs of ``size_bytes`` on ``path`` (created; owner only, as the cluster directory)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(path):
        return  # kept from before (kept())
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(f"cannot mount a {show_size(size_bytes)} tmpfs on {path}: "
                           f"{done.stderr.strip() or f'mount exited {done.returncode}'}")


def unmount(path: Path) -> str | None:
    """Unmount ``path`` if it is a mount point (lazily if it is busy: a process that survived its stop);
    returns what failed, or None."""
    if not os.path.ismount(path):
        return None
    done = subprocess.run(["umount", str(path)], capture_output=True, text=True)
    if done.returncode:
        done = subprocess.run(["umount", "-l", str(path)], capture_output=True, text=True)
    return f"cannot unmount {path}: {done.stderr.strip()}" if done.returncode else None


def unmount_all(directory: str | os.PathLike[str], doc: Mapping[str, Any]) -> list[str]:
    """Unmount every tablet disk ``doc`` records (each tried, whatever the others did); what failed."""
    disks = of(doc)
    problems = []
    for tablet_id in (disks or {}).get("tablets", []):
        problem = unmount(data_dir(directory, tablet_id))
        if problem:
            problems.append(problem)
    return problems


def usage(directory: str | os.PathLike[str], doc: Mapping[str, Any], tablet_id: str | int) -> dict[str, Any] | None:
    """``{"disk_bytes", "disk_free_bytes"}`` of tablet server ``tablet_id``'s small disk (free: None when it is
    not mounted), or None if it has none: what ``cluster status`` shows."""
    disks = of(doc)
    if disks is None or str(tablet_id) not in map(str, disks["tablets"]):
        return None
    path = data_dir(directory, tablet_id)
    free = None
    if os.path.ismount(path):
        stat = os.statvfs(path)
        free = stat.f_bavail * stat.f_frsize
    return {"disk_bytes": int(disks["size_bytes"]), "disk_free_bytes": free}
