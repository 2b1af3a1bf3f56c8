"""What every failure drill shares: the report of its checks, and how it is printed.

A drill (a module of ``ops/drills/`` named in :data:`kvlease.ops.drills.registry.DRILLS`,
run by ``kvlease drill <name>``) drives
traffic through the public clients, injects one fault, and then checks its
invariants. Each invariant is a :class:`~kvlease.ops.check.Check` built by a pure checker
function from what the drill observed (e.g. the leases it was acknowledged
vs the leases the cluster reads back), so a checker can be fed a planted
violation in a test. The drill's :class:`Report` collects the checks and the
figures (recovery times, counts); :func:`finish` prints it (text, or one
JSON document) and gives the exit code: 0 when every check held, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from kvlease.ops.check import MAX_SHOWN, Check

EXIT_OK = 0
EXIT_VIOLATED = 1


@dataclass
class Report:
    """A drill's outcome: its checks and its figures (JSON-able values)."""

    drill: str
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""  # why the drill did not run (e.g. "needs --zk-nodes 3"); it then counts as ok

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def as_dict(self) -> dict[str, Any]:
        doc = {"drill": self.drill, "ok": self.ok, "checks": [c.as_dict() for c in self.checks],
               "figures": self.figures}
        if self.skipped:
            doc["skipped"] = self.skipped
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Report":
        """The report :meth:`as_dict` made (e.g. read back from a drill's ``--json`` output)."""
        checks = [Check(c["name"], tuple(c.get("violations", ())), int(c.get("checked", 0)))
                  for c in doc.get("checks", [])]
        if not doc.get("ok", True) and all(c.ok for c in checks):  # a failure the checks do not carry
            checks.append(Check.of("the drill's own verdict", ["it reported a failure"]))
        return cls(str(doc["drill"]), checks, dict(doc.get("figures", {})), str(doc.get("skipped", "")))


def render(report: Report) -> str:
    """The text report: one line per check (and its first violations), then the figures."""
    if report.skipped:
        return f"drill {report.drill}: SKIPPED ({report.skipped})"
    lines = [f"drill {report.drill}: {'PASS' if report.ok else 'FAIL'}"]
    for check in report.checks:
        counted = f" ({check.checked} checked)" if check.checked else ""
        lines.append(f"  [{'ok' if check.ok else 'VIOLATED'}] {check.name}{counted}")
        for violation in check.violations[:MAX_SHOWN]:
            lines.append(f"      - {violation}")
        if len(check.violations) > MAX_SHOWN:
            lines.append(f"      - … and {len(check.violations) - MAX_SHOWN} more")
    for name, value in report.figures.items():
        lines.append(f"  {name}: {_figure(value)}")
    return "\n".join(lines)


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_figure(v) for v in value)
    return str(value)


def finish(reports: Report | list[Report], json_output: bool, stream: TextIO | None = None) -> int:
    """Print the report(s) and return the exit code (0: every check of every report held)."""
    many = isinstance(reports, list)
    items = reports if many else [reports]
    stream = stream or sys.stdout
    if json_output:
        doc = {"ok": all(r.ok for r in items), "drills": [r.as_dict() for r in items]} if many else items[0].as_dict()
        stream.write(json.dumps(doc) + "\n")
    else:
        stream.write("\n\n".join(render(r) for r in items) + "\n")
    stream.flush()
    return EXIT_OK if all(r.ok for r in items) else EXIT_VIOLATED
