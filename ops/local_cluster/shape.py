"""What a ``cluster start`` runs: the shape it is given, else the one a stopped cluster's cluster.json records.

A cluster's shape is its number of ZooKeeper nodes, coordinators and tablet
servers, its remote storage and whether security is on. Started again in its
directory, a stopped cluster keeps it: what the start leaves out comes from
``cluster.json``, and what it gives must be what is recorded, or the start is
refused before anything runs (a coordinator fewer, or a tablet server fewer,
would leave the buckets of the missing one unserved: the start would wait them
out and fail).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from kvlease.ops.local_cluster.processes import ClusterError

#: the option of ``kvlease cluster start`` that sets each part of the shape
OPTIONS = {"zk_nodes": "--zk-nodes", "coordinators": "--coordinators", "tablets": "--tablets",
           "remote": "--remote", "secure": "--secure"}


@dataclass(frozen=True)
class Shape:
    zk_nodes: int = 1
    coordinators: int = 1
    tablets: int = 1
    remote: str = ""  # remote.data.dir
    secure: bool = False

    def describe(self, *, remote: bool = False) -> str:
        """``1 ZooKeeper node, 2 coordinators and 2 tablet servers`` (and security, and with ``remote`` its
        remote storage)."""
        text = (f"{_count(self.zk_nodes, 'ZooKeeper node')}, {_count(self.coordinators, 'coordinator')} and "
                f"{_count(self.tablets, 'tablet server')}")
        if self.secure:
            text += ", security on"
        return text + (f", remote storage {self.remote}" if remote else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def recorded(previous: Mapping[str, Any]) -> Shape | None:
    """The shape ``previous`` (a stopped cluster's cluster.json) records; None if there is none, or it records
    no ZooKeeper node or coordinator (a start that failed before them, by an older kvlease)."""
    if not previous.get("zookeeper") or not previous.get("coordinators"):
        return None
    return Shape(len(previous["zookeeper"]), len(previous["coordinators"]), len(previous.get("tablets") or []),
                 str(previous.get("remote") or ""), bool(previous.get("security")))


def resolve(directory: Path, previous: Mapping[str, Any], default_remote: str, **given: Any) -> Shape:
    """The shape to start in ``directory``: each part ``given`` (None: not given) or, left out, what
    ``previous`` records (a fresh directory: the defaults, ``default_remote``). ClusterError naming what
    differs when ``given`` contradicts the recorded shape."""
    unknown = set(given) - set(OPTIONS)
    if unknown:
        raise TypeError(f"not a part of a cluster's shape: {', '.join(sorted(unknown))}")
    known = recorded(previous)
    base = known or Shape(remote=default_remote)
    differs = [name for name, value in given.items() if value is not None and known is not None
               and value != getattr(known, name)]
    if differs:
        shown = ", ".join(_given(name, given[name]) for name in differs)
        raise ClusterError(f"{directory} holds a cluster of {known.describe(remote='remote' in differs)}; "
                           f"{shown} differ{'s' if len(differs) == 1 else ''}: start it without shape options, "
                           "or use a new --dir")
    return Shape(**{f.name: given.get(f.name) if given.get(f.name) is not None else getattr(base, f.name)
                    for f in fields(Shape)})


def _given(name: str, value: Any) -> str:
    if name == "secure":
        return OPTIONS[name] if value else f"no {OPTIONS[name]}"
    return f"{OPTIONS[name]} {value}"
