"""Waiting until something holds: the one polling helper of ``ops`` and the tests, and the one wait for a
table's replicas to be in sync.

:func:`poll` calls a function until it returns something truthy or a
deadline passes and gives back the last value; :func:`wait_until` does the
same but raises :class:`NotReached` (naming what was awaited and the last
value seen) when the deadline passes; it may also count given exceptions
as "not yet" (``retry_on``). :func:`wait_in_sync` polls a table's
assignment (``AdminClient.get_table_assignment``) until no bucket lags: by
default, until every bucket has a live leader and every replica in its ISR
(:func:`out_of_sync`); a caller with a stricter or narrower rule passes its
own ``lagging``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, TypeVar

T = TypeVar("T")


class NotReached(AssertionError):
    """What was awaited did not happen in time (an AssertionError: a test that waits for it fails)."""


def poll(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.05) -> tuple[T, bool]:
    """Call ``predicate`` every ``interval_s`` until it returns something truthy, at most ``timeout_s``
    (it is called at least once, and once more after the deadline); returns its last value and whether that
    was truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = predicate()
        if last:
            return last, True
        if time.monotonic() > deadline:
            return last, False
        time.sleep(interval_s)


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05, *,
               retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """``predicate``'s first truthy value (polled as by :func:`poll`); :class:`NotReached` naming ``what``
    and the last value seen if there is none within ``timeout_s``.

    ``retry_on``: exception classes that, raised by ``predicate``, count as "not yet" (a call refused until
    a grant reaches a cache, a client still reconnecting); if the last call raised one, NotReached names it
    and is raised from it. Any other exception ends the wait at once."""
    raised: list[BaseException] = []

    def attempt():
        raised.clear()
        try:
            return predicate()
        except retry_on as exc:
            raised.append(exc)
            return None

    last, reached = poll(attempt, timeout_s, interval_s)
    if not reached:
        cause = raised[0] if raised else None
        raise NotReached(f"{what}: not reached within {timeout_s:g}s (last: {cause or last!r})") from cause
    return last


def out_of_sync(state: Mapping[int, Any]) -> list[str]:
    """One line per bucket of ``state`` (bucket -> its assignment) with a replica outside its ISR or no live
    leader."""
    return [f"bucket {b}: in-sync replicas {list(a.isr)} of {list(a.replicas)}"
            + ("" if a.leader_address else ", no live leader")
            for b, a in sorted(state.items()) if len(a.isr) < len(a.replicas) or not a.leader_address]


def wait_in_sync(admin, table_id: int, timeout_s: float, *,
                 lagging: Callable[[Mapping[int, Any]], list[str]] = out_of_sync,
                 interval_s: float = 0.1) -> tuple[dict[int, Any], list[str], float | None]:
    """Poll table ``table_id``'s assignment through ``admin`` until ``lagging(state)`` (what keeps it from
    being in sync, one line each) is empty, at most ``timeout_s``. Returns the last state (bucket -> its
    assignment), what still lagged then (empty: in sync) and the seconds it took (None: not in time)."""
    start = time.monotonic()
    seen: dict[str, Any] = {}

    def settled() -> bool:
        _table, seen["state"] = admin.get_table_assignment(table_id)
        seen["behind"] = lagging(seen["state"])
        return not seen["behind"]

    _last, reached = poll(settled, timeout_s, interval_s)
    return seen["state"], seen["behind"], round(time.monotonic() - start, 3) if reached else None
