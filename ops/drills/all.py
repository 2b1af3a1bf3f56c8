"""Every drill the cluster's shape allows, one after another, in one combined report.

Checks: what each drill checks. A drill that needs more than the cluster has
is skipped and the report says what it needs; --skip NAME leaves one out;
spark-failover runs too. Options
(--rounds, --clients, --seed, --outage) go to the drills that take them.

A drill module may define ``check_shape(doc)`` (raising
:class:`~kvlease.ops.drills.cluster.ClusterShapeError`) and ``run(cluster_dir,
**options) -> Report``; without ``run``, its ``main(cluster_dir,
json_output=True, **options)`` is called and the JSON document it prints is
read back. A drill that fails to run is a failed check in its report; the
next drill runs anyway.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from kvlease.common import errors
from kvlease.ops import local_cluster
from kvlease.ops.drills.cluster import ClusterShapeError, require_whole
from kvlease.ops.drills.registry import check_skip, drill_module, drill_names
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish

OPTIONS = ("rounds", "clients", "seed", "outage", "seconds", "skip")
_module = drill_module


def _options_for(module, options: dict) -> dict:
    accepted = getattr(module, "OPTIONS", None)
    return {k: v for k, v in options.items() if k != "skip" and (accepted is None or k in accepted)}


def _run_captured(module, name: str, cluster_dir: str, options: dict) -> list[Report]:
    """A drill without ``run``: its ``main`` with --json, the document it printed read back."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = module.main(cluster_dir, json_output=True, **options)
    try:
        doc = json.loads(out.getvalue())
        reports = [Report.from_dict(d) for d in doc["drills"]] if "drills" in doc else [Report.from_dict(doc)]
    except (ValueError, KeyError, TypeError) as exc:
        return [Report(name, [Check.of("the drill printed its report", [
            f"no JSON report (exit code {code}, {exc}): {out.getvalue()[:300]!r}"])])]
    if isinstance(code, int) and code and all(r.ok for r in reports):
        reports[-1].checks.append(Check.of("the drill's exit code", [f"it exited {code}"]))
    return reports


def run_drill(name: str, cluster_dir: str, options: dict) -> list[Report]:
    """One drill's report(s); a shape it cannot run on is a skip, a failure to run a failed check."""
    module = _module(name)
    try:
        if callable(getattr(module, "run", None)):
            return [module.run(cluster_dir, **_options_for(module, options))]
        return _run_captured(module, name, cluster_dir, _options_for(module, options))
    except ClusterShapeError as exc:
        return [Report(name, skipped=exc.message)]
    except errors.KvLeaseError as exc:
        return [Report(name, [Check.of("the drill ran", [exc.message])])]
    except Exception as exc:  # one drill's bug must not hide the others' results
        return [Report(name, [Check.of("the drill ran", [f"internal error: {type(exc).__name__}: {exc}"])])]


def run(cluster_dir: str, **options) -> list[Report]:
    skip = set(options.get("skip", ()))
    check_skip(skip)
    doc = local_cluster.load(cluster_dir)
    skipped = {name: "--skip" if name in skip else _shape_skip(name, doc) for name in drill_names()}
    if any(reason is None for reason in skipped.values()):
        # a stopped cluster is one error, not a failed report per drill
        require_whole(doc, str(Path(cluster_dir).resolve()))
    reports: list[Report] = []
    for name, reason in skipped.items():
        if reason is not None:
            reports.append(Report(name, skipped=reason))
        else:
            reports += run_drill(name, cluster_dir, options)
    return reports


def _shape_skip(name: str, doc: dict) -> str | None:
    """Why drill ``name`` cannot run on a cluster of ``doc``'s shape (None: it can)."""
    module = _module(name)
    try:
        if hasattr(module, "check_shape"):
            module.check_shape(doc)
    except ClusterShapeError as exc:
        return exc.message
    return None


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
