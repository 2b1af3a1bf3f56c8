"""A local cluster directory (made by ``kvlease cluster start``) as a client sees it: its coordinators, its
security settings, and whether any of its processes runs (:func:`check_running`: a stopped cluster is told at
once, not after the client's retries)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from kvlease.common.errors import ClusterNotRunningError, InvalidRequestError

CLUSTER_FILE = "cluster.json"


def security_settings(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The client's security config keys (dotted) for a cluster.json document; empty if it has no TLS.

    ``kvlease cluster start --secure`` records ``"security": {"ca_file", "cert_file", "key_file",
    "client_auth", "username", "password_file"}`` (the client certificate, not the nodes'; the
    super user's credentials, its password in a file readable by the owner only). An unreadable
    password file is InvalidRequestError naming it.
    """
    sec = doc.get("security") or {}
    if not sec:
        return {}
    settings = {"security.enabled": True, "security.tls.ca-file": sec["ca_file"],
                "security.tls.client-auth": bool(sec.get("client_auth", False))}
    if sec.get("cert_file"):
        settings.update({"security.tls.cert-file": sec["cert_file"], "security.tls.key-file": sec["key_file"]})
    if sec.get("username") and sec.get("password_file"):
        settings.update({"security.username": sec["username"],
                         "security.password": read_password_file(sec["password_file"])})
    return settings


def read_password_file(path: str | os.PathLike[str]) -> str:
    """The password in ``path`` (its first line, without the line end); InvalidRequestError naming the file if
    it cannot be read or is empty (the message never holds the password)."""
    try:
        text = Path(path).read_text()
    except (OSError, ValueError) as exc:  # ValueError: a path the OS cannot take (a NUL byte)
        why = getattr(exc, "strerror", None) or exc
        raise InvalidRequestError(f"cannot read the password file {path}: {why}", path=str(path)) from None
    except UnicodeDecodeError:
        raise InvalidRequestError(f"the password file {path} is not UTF-8 text", path=str(path)) from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise InvalidRequestError(f"the password file {path} is empty", path=str(path))
    return password


def cluster_dir_security(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """:func:`security_settings` of the cluster in ``directory``."""
    return security_settings(read_cluster_file(directory))


def cluster_dir_bootstrap(directory: str | os.PathLike[str]) -> list[str]:
    """The coordinator addresses listed in ``directory/cluster.json``; InvalidRequestError if there are none."""
    doc = read_cluster_file(directory)
    addresses = [c.get("address") for c in doc.get("coordinators", []) if isinstance(c, dict)]
    addresses = [a for a in addresses if a]
    if not addresses:
        raise InvalidRequestError(f"the cluster in {directory} has no coordinators")
    return addresses


def read_cluster_file(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``directory/cluster.json``; InvalidRequestError (saying how to start one) if it is missing
    or unreadable."""
    path = Path(directory) / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidRequestError(f"no cluster in {directory}: {path} not found "
                                  f"(start one with: kvlease cluster start --dir {directory})") from None
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read {path}: {exc}") from None
    return doc


def recorded_procs(doc: Mapping[str, Any], *roles: str) -> list[tuple[int, int | None]]:
    """``(pid, start time)`` of every process of ``roles`` (default: all three) that ``doc`` (a cluster.json)
    records by pid; entries that are not objects with an int pid are passed over (a client reads the file
    unchecked)."""
    return [(entry["pid"], entry.get("proc_start"))
            for role in roles or ("zookeeper", "coordinators", "tablets") for entry in doc.get(role) or []
            if isinstance(entry, dict) and type(entry.get("pid")) is int and entry["pid"]]


def running_pids(doc: Mapping[str, Any]) -> list[int]:
    """The pids of the processes ``doc`` records that still run (each the process started then)."""
    return [pid for pid, start in recorded_procs(doc) if pid_alive(pid, start)]


def check_running(directory: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """ClusterNotRunningError when ``doc`` (``directory``'s cluster.json) records processes by pid and none of
    them runs: the cluster was stopped (or killed). A cluster of which some run passes, and so does a file that
    records no pid (coordinators run elsewhere: clients just try them)."""
    recorded = recorded_procs(doc)
    if recorded and not running_pids(doc):
        raise ClusterNotRunningError(
            f"the cluster in {directory} is not running (none of the {len(recorded)} processes its "
            f"{CLUSTER_FILE} records runs): start it with: kvlease cluster start --dir {directory}",
            directory=str(directory))


# -- is a recorded process still the one started? ---------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks)`` from /proc, or None where there is no /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ("X", -1)
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def proc_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, from /proc; None where there is no /proc): recorded with a
    pid, so that a pid the system handed to another process since is not taken for it."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def pid_alive(pid: int | None, start: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if ``start`` is given, is the process started then."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    if state in ("Z", "X"):
        return False
    return start is None or started == start
