"""``kvlease bucket …``: one bucket's replicas and leader (moves, restores, elections).

The group only; its commands are in :mod:`kvlease.ops.cli.bucket_moves` (``reassign``)
and :mod:`kvlease.ops.cli.bucket_loss` (``restore``, ``elect``), which add themselves
to it when :mod:`kvlease.ops.cli` imports them.
"""

from __future__ import annotations

from kvlease.ops.cli.app import kvlease


@kvlease.group("bucket")
def bucket_group() -> None:
    """One bucket's replicas and leader: move replicas, restore a lost bucket, elect a leader."""
