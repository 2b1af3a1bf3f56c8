"""A check: one invariant and what broke it, as the drills, ``kvlease demo`` and the streaming checkers
(:mod:`kvlease.ops.streaming`) report it.

A checker is a pure function from what was observed (e.g. the writes
acknowledged vs the rows read back) to a :class:`Check`, so a test can feed
it a planted violation. A drill's report collects its checks
(:mod:`kvlease.ops.drills.report`); the demo's summary lists them too. Both show at
most :data:`MAX_SHOWN` violations per check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

MAX_SHOWN = 10  # violations listed per check in a text report or the demo's summary


@dataclass(frozen=True)
class Check:
    """One invariant and what broke it (no violations: it held)."""

    name: str
    violations: tuple[str, ...] = ()
    checked: int = 0  # how many things were looked at (leases, rows, files, ...)

    @property
    def ok(self) -> bool:
        return not self.violations

    @classmethod
    def of(cls, name: str, violations: Iterable[str], checked: int = 0) -> "Check":
        return cls(name, tuple(violations), checked)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "checked": self.checked, "violations": list(self.violations)}
