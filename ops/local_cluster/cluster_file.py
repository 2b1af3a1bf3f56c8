"""A local cluster's ``cluster.json``: what runs where (pids, addresses, the remote dir, security).

Its name is :data:`kvlease.client.cluster_dir.CLUSTER_FILE` (clients read the same file
for its coordinators and TLS settings). :func:`load` checks its shape, so every
command can read its lists of processes.

Every change goes under the directory's lock (``flock`` of ``cluster.json.lock``):
:func:`updating` loads, lets the caller change and saves inside it, so that
concurrent commands (three ``cluster restart`` at once) each keep the others'
changes; each writer writes a temporary file of its own and renames it over
``cluster.json``, so readers never see half a file.

A start records what it launched in ``cluster.starting.json`` (:func:`record_start`,
naming the starting process too) and writes ``cluster.json`` only once the cluster
serves (:func:`finish_start`): a start that fails leaves ``cluster.json`` as it was,
and ``cluster stop`` still finds the processes of one that was killed half-way
(:func:`load_starting`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from kvlease.client.cluster_dir import CLUSTER_FILE, read_cluster_file, recorded_procs, running_pids, security_settings
from kvlease.common.errors import InvalidRequestError
from kvlease.common import config as cfg
from kvlease.ops.local_cluster.processes import ClusterError, pid_alive, proc_start

__all__ = ["CLUSTER_FILE", "STARTING_FILE", "ZK_ROOT", "abandon_start", "begin_start", "bootstrap",
           "client_config", "cluster_file", "finish_start", "load", "load_starting", "locked", "record_start",
           "recorded_procs", "running_pids", "save", "starting_file", "updating"]

STARTING_FILE = "cluster.starting.json"
LOCK_FILE = "cluster.json.lock"
ZK_ROOT = "/kvlease"


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


# -- a start under way ---------------------------------------------------------------------


def starting_file(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / STARTING_FILE


def load_starting(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a start under way (or one killed half-way) launched so far: a cluster.json document, its
    ``starter`` the starting process (None: no such start)."""
    path = starting_file(directory)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from None
    problem = _shape_problem(doc)
    if problem is not None:
        raise ClusterError(f"{path} is not a kvlease cluster file: {problem}")
    return doc


def begin_start(directory: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Claim ``directory`` for a start (its record, :func:`record_start`, written first); ClusterError if
    another start is under way there, or left processes running."""
    with locked(directory):
        other = load_starting(directory)
        if other is not None:
            starter = other.get("starter") or {}
            if pid_alive(starter.get("pid"), starter.get("proc_start")):
                raise ClusterError(f"another start is under way in {directory} (pid {starter['pid']})")
            left = running_pids(other)
            if left:
                raise ClusterError(f"a start in {directory} was interrupted and left processes running (pids "
                                   f"{', '.join(map(str, left))}); stop them first: kvlease cluster stop --dir "
                                   f"{directory}")
        record_start(directory, doc)


def record_start(directory: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """What this start launched so far (``doc``), naming this process as its starter."""
    pid = os.getpid()
    _write(starting_file(directory), {**doc, "starter": {"pid": pid, "proc_start": proc_start(pid)}})


def finish_start(directory: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """The start serves: ``doc`` becomes cluster.json, and the start's record goes."""
    with locked(directory):
        _write(cluster_file(directory), doc)
        starting_file(directory).unlink(missing_ok=True)


def abandon_start(directory: str | os.PathLike[str]) -> None:
    """The start failed and stopped what it launched: its record goes (cluster.json stays as it was)."""
    with locked(directory):
        starting_file(directory).unlink(missing_ok=True)


def bootstrap(directory: str | os.PathLike[str]) -> list[str]:
    """The coordinator addresses of the cluster in ``directory``."""
    addresses = [c["address"] for c in load(directory).get("coordinators", [])]
    if not addresses:
        raise ClusterError(f"the cluster in {directory} has no coordinators")
    return addresses


def client_config(doc: Mapping[str, Any]) -> cfg.Config:
    """The config a client of this cluster needs: its TLS settings, if it has any (the environment ignored)."""
    return cfg.Config(security_settings(doc), env={})
