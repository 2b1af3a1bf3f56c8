"""The leases' deadlines as a heap, so that an expiry tick costs what expires, not what is held.

Entries are ``(expiration_time, lease_id)``. They are never removed in place
(lazy deletion): a renew pushes the new deadline and leaves the old entry,
a dropped lease leaves its entry. An entry is *live* while the lease it names
still has that deadline (``deadline_of(lease_id) == expiration_time``); a
stale one is thrown away when it comes to the top. When stale entries
dominate (more than :data:`SLACK` times the live ones, plus a floor) the heap
is rebuilt from the leases, so its size stays within a constant factor of the
lease count and every push costs O(log n) amortized.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable, Iterator

SLACK = 2  # rebuild when the heap holds more than SLACK x live entries ...
FLOOR = 1_024  # ... plus this many (a small heap is never worth rebuilding)

DeadlineOf = Callable[[str], "int | None"]  # a lease's current deadline (None: no such lease)


class Deadlines:
    def __init__(self, entries: Iterable[tuple[int, str]] = ()) -> None:
        self._heap: list[tuple[int, str]] = list(entries)
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self._heap)

    def push(self, expiration_time: int, lease_id: str) -> None:
        heapq.heappush(self._heap, (expiration_time, lease_id))

    def pop_due(self, now_ms: int, deadline_of: DeadlineOf) -> list[str]:
        """Take out every live entry with ``expiration_time <= now_ms``, earliest first (each lease once).

        Stale entries on the way are dropped. Costs O((due + stale) log n):
        nothing but a peek when nothing is due.
        """
        heap = self._heap
        due: list[str] = []
        seen: set[str] = set()
        while heap and heap[0][0] <= now_ms:
            expiration_time, lease_id = heapq.heappop(heap)
            if deadline_of(lease_id) == expiration_time and lease_id not in seen:
                seen.add(lease_id)
                due.append(lease_id)
        return due

    def maybe_compact(self, live: int, current: Callable[[], Iterable[tuple[int, str]]]) -> bool:
        """Rebuild from ``current()`` (every lease's ``(deadline, id)``) if stale entries dominate."""
        if len(self._heap) <= SLACK * live + FLOOR:
            return False
        self._heap = list(current())
        heapq.heapify(self._heap)
        return True

    def live_ids(self, deadline_of: DeadlineOf) -> set[str]:
        """The leases that have a live entry (for ``validate``: O(n))."""
        return {lease_id for expiration_time, lease_id in self._heap if deadline_of(lease_id) == expiration_time}
