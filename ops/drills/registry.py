"""The drills ``kvlease drill NAME`` runs: an explicit list of names and their modules.

A drill module has ``main(cluster_dir, json_output=False, **options)``; it may
have ``OPTIONS`` (the command-line options it takes), ``check_shape(doc)`` and
``run(cluster_dir, **options) -> Report`` (what ``all`` calls). A new drill is
a module in ``ops/drills/`` and one line here. Modules are imported only when
a drill runs; ``kvlease drill --help`` reads their docstrings.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from types import ModuleType

from kvlease.common import errors

#: drill name -> its module, in the order ``all`` runs them (``all`` last).
DRILLS: dict[str, str] = {
    "coordinator-failover": "kvlease.ops.drills.coordinator_failover",
    "zk-leader-loss": "kvlease.ops.drills.zk_leader_loss",
    "tablet-restart": "kvlease.ops.drills.tablet_restart",
    "tablet-failover": "kvlease.ops.drills.tablet_failover",
    "rolling-restart": "kvlease.ops.drills.rolling_restart",
    "disk-loss": "kvlease.ops.drills.disk_loss",
    "decommission": "kvlease.ops.drills.decommission",
    "remote-outage": "kvlease.ops.drills.remote_outage",
    "partitions": "kvlease.ops.drills.partitions",
    "spark-failover": "kvlease.ops.drills.spark_failover",
    "chaos": "kvlease.ops.drills.chaos",
    "all": "kvlease.ops.drills.all",
}
ALL = "all"


class SkipError(errors.InvalidRequestError):
    """``--skip`` names no drill: bad input, which the CLI shows as a usage error (exit 2)."""


def drill_names() -> list[str]:
    """Every drill but ``all``, in the order ``all`` runs them."""
    return [name for name in DRILLS if name != ALL]


def drill_module(name: str) -> ModuleType | None:
    """The module of drill ``name`` (``coordinator-failover`` or ``coordinator_failover``); None if there is none."""
    module = DRILLS.get(name.replace("_", "-"))
    return importlib.import_module(module) if module else None


def drill_summary(name: str) -> list[str]:
    """The first two paragraphs of drill ``name``'s docstring (what it does, what it checks), each on one
    line; read from its source, not imported."""
    spec = importlib.util.find_spec(DRILLS[name])
    try:
        with open(spec.origin) as fh:
            doc = ast.get_docstring(ast.parse(fh.read())) or ""
    except (OSError, SyntaxError, TypeError, AttributeError):
        return []
    return [" ".join(p.split()) for p in doc.split("\n\n")[:2] if p.strip()]


def check_skip(skip) -> None:
    """SkipError unless every name in ``skip`` is a drill."""
    unknown = set(skip) - set(drill_names())
    if unknown:
        raise SkipError(f"--skip {', '.join(sorted(unknown))}: no such drill (drills: {', '.join(drill_names())})")
