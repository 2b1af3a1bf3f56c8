"""A local cluster's ``cluster.json``: what runs where (pids, addresses, the remote dir, security).

Its name is :data:`client.cluster_dir.CLUSTER_FILE` (clients read the same file
for its coordinators and TLS settings). :func:`load` checks its shape, so every
command can read its lists of processes.

Every change goes under the directory's lock (``flock`` of ``cluster.json.lock``):
:func:`updating` loads, lets the caller change and saves inside it, so that
concurrent commands (three ``cluster restart`` at once) each keep the others'
changes; each writer writes a temporary file of its own and renames it over
``cluster.json``, so readers never see half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from client.cluster_dir import CLUSTER_FILE, read_cluster_file, security_settings
from common.errors import InvalidRequestError
from common import config as cfg
from ops.local_cluster.processes import ClusterError, pid_alive

__all__ = ["CLUSTER_FILE", "ZK_ROOT", "all_procs", "bootstrap", "client_config", "cluster_file", "load", "locked",
           "running_pids", "save", "updating"]

ZK_ROOT = "/kvlease"
LOCK_FILE = "cluster.json.lock"


# -- cluster.json --------------------------------------------------------------------------


def cluster_file(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CLUSTER_FILE


def load(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The cluster.json document of ``directory``; ClusterError if there is none or it is not one."""
    path = cluster_file(directory)
    try:
        doc = read_cluster_file(directory)
    except InvalidRequestError as exc:
        raise ClusterError(exc.message) from None
    problem = _shape_problem(doc)
    if problem is not None:
        raise ClusterError(f"{path} is not a kvlease cluster file: {problem}")
    return doc


def _shape_problem(doc: Any) -> str | None:
    """What keeps ``doc`` from being a cluster.json (None: nothing): the commands read its lists of
    processes, each with an address and a pid (null once stopped); ``coordinators`` is always there."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if "coordinators" not in doc:
        return "no 'coordinators'"
    for role in ("zookeeper", "coordinators", "tablets"):
        entries = doc.get(role, [])
        if not isinstance(entries, list):
            return f"{role!r} is not a list"
        for entry in entries:
            if not (isinstance(entry, dict) and isinstance(entry.get("address"), str)
                    and (entry.get("pid") is None or type(entry.get("pid")) is int)):
                return f"an entry of {role!r} is not an object with an address and a pid"
    return None


@contextlib.contextmanager
def locked(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the cluster directory's lock (an exclusive ``flock`` of ``cluster.json.lock``) for the block."""
    fd = os.open(Path(directory) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def updating(directory: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """cluster.json to change in the block: loaded under the lock, saved (still under it) when the block ends
    without an error."""
    with locked(directory):
        doc = load(directory)
        yield doc
        _write(cluster_file(directory), doc)


def save(directory: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Write ``doc`` as the whole cluster.json (under the lock); :func:`updating` to change a part of it."""
    with locked(directory):
        _write(cluster_file(directory), doc)


def _write(path: Path, doc: Mapping[str, Any]) -> None:
    """``doc`` into ``path`` through a temporary file of this writer's own, renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def bootstrap(directory: str | os.PathLike[str]) -> list[str]:
    """The coordinator addresses of the cluster in ``directory``."""
    addresses = [c["address"] for c in load(directory).get("coordinators", [])]
    if not addresses:
        raise ClusterError(f"the cluster in {directory} has no coordinators")
    return addresses


def client_config(doc: Mapping[str, Any]) -> cfg.Config:
    """The config a client of this cluster needs: its TLS settings, if it has any (the environment ignored)."""
    return cfg.Config(security_settings(doc), env={})


def all_procs(doc: dict[str, Any], *roles: str) -> list[tuple[int, int | None]]:
    return [(p["pid"], p.get("proc_start")) for role in roles for p in doc.get(role, []) if p.get("pid")]


def running_pids(doc: dict[str, Any]) -> list[int]:
    return [pid for pid, start in all_procs(doc, "coordinators", "tablets", "zookeeper") if pid_alive(pid, start)]
