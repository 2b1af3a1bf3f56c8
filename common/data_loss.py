"""A bucket's accepted losses of committed changes, and how a reader tells that offsets it read were reused.

An operator who brings an offline bucket back at the price of its lost
changes (``kvlease bucket restore --accept-data-loss``: the latest snapshot;
``kvlease bucket elect --unclean``: an out-of-sync replica) adds a
:class:`DataLoss` to the bucket's ``losses`` (``/tables/{id}/assignment``).
From its ``from_offset`` on the bucket's offsets are given to new changes:
a reader that had read past it would otherwise read other changes under
offsets it already consumed. :func:`unseen_loss` is that check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable
from typing import Mapping, Sequence

RESTORE = "restore"
UNCLEAN = "unclean"
UNKNOWN = -1  # from_offset not reported yet / last_known_end not known


@dataclass(frozen=True)
class DataLoss:
    kind: str  # RESTORE or UNCLEAN
    leader_epoch: int  # the leader epoch the bucket was given by the loss
    from_offset: int  # the first offset reused (UNKNOWN: an unclean leader has not reported its log end yet)
    last_known_end: int = UNKNOWN  # the highest committed log end known before the loss
    snapshot_id: int = 0  # restore: the snapshot restored (0: none, empty at offset 0)
    at_ms: int = 0
    leader: int = -1
    #: unclean: the newest snapshot id committed before the election (0: none); see :meth:`lost_history`
    newest_snapshot_id: int = 0
    #: restore: the replicas that have not confirmed yet that they carried it out (dropped their local
    #: state; the leader installed the snapshot); each still owes it, however many epochs pass. None: not
    #: known (a record from before this was kept; the coordinator's own, never on the wire)
    owed_by: tuple[int, ...] | None = None

    @property
    def resolved(self) -> bool:
        return self.from_offset >= 0

    def lost_offsets(self) -> int | None:
        """How many committed offsets were lost (None: not known)."""
        if not self.resolved or self.last_known_end < 0:
            return None
        return max(0, self.last_known_end - self.from_offset)

    def describe(self) -> str:
        """One line for logs, the CLI and errors."""
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.at_ms / 1000)) + " UTC"
        how = (f"restored from snapshot {self.snapshot_id}" if self.kind == RESTORE and self.snapshot_id
               else "restored empty (no snapshot kept)" if self.kind == RESTORE
               else f"led by out-of-sync tablet server {self.leader} (unclean election)")
        lost = self.lost_offsets()
        count = (f"{lost} offsets lost ({self.from_offset}..{self.last_known_end - 1})" if lost
                 else "no committed offset lost" if lost == 0
                 else "offsets lost: unknown (no log end was known)" if self.resolved
                 else "offsets lost: not known until the new leader reports its log end")
        return f"{how} at {at}, leader epoch {self.leader_epoch}: {count}"

    def to_json(self) -> dict:
        node = self._fields()
        if self.owed_by is not None:
            node["owed_by"] = list(self.owed_by)
        return node

    def _fields(self) -> dict:
        return {"kind": self.kind, "leader_epoch": self.leader_epoch, "from_offset": self.from_offset,
                "last_known_end": self.last_known_end, "snapshot_id": self.snapshot_id, "at_ms": self.at_ms,
                "leader": self.leader, "newest_snapshot_id": self.newest_snapshot_id}

    @classmethod
    def from_json(cls, node: Mapping) -> "DataLoss":
        owed = node.get("owed_by")
        return cls(str(node["kind"]), int(node["leader_epoch"]), int(node["from_offset"]),
                   int(node.get("last_known_end", UNKNOWN)), int(node.get("snapshot_id", 0)),
                   int(node.get("at_ms", 0)), int(node.get("leader", -1)), int(node.get("newest_snapshot_id", 0)),
                   None if owed is None else tuple(int(r) for r in owed))

    def to_pb(self, pb_cls):
        """The record on the wire (``DataLossPb``): ``owed_by`` stays with the coordinator (each replica is
        told whether it owes the restore: ``BucketLeadershipPb.restore_owed``)."""
        return pb_cls(**self._fields())

    def owes(self, server: int) -> bool | None:
        """Whether ``server`` still owes this restore (None: not known, see :attr:`owed_by`)."""
        if self.kind != RESTORE or self.owed_by is None:
            return None
        return server in self.owed_by

    def owed_only_by(self, keep: Callable[[int], bool]) -> "DataLoss":
        """This record with only the servers ``keep`` keeps still owing it (itself if nothing changes)."""
        if self.owed_by is None or all(keep(r) for r in self.owed_by):
            return self
        return replace(self, owed_by=tuple(r for r in self.owed_by if keep(r)))

    @classmethod
    def from_pb(cls, msg) -> "DataLoss":
        return cls(msg.kind, msg.leader_epoch, msg.from_offset, msg.last_known_end, msg.snapshot_id, msg.at_ms,
                   msg.leader, msg.newest_snapshot_id)

    def lost_history(self, snapshot_id: int, log_offset: int) -> bool:
        """Whether the snapshot ``snapshot_id`` at ``log_offset`` holds changes this loss took back: one
        committed before an unclean election (id up to :attr:`newest_snapshot_id`) whose ``log_offset`` is
        above the new leader's log end (``from_offset``). Never used again as the bucket's latest snapshot
        or to rebuild a replica."""
        return (self.resolved and snapshot_id <= self.newest_snapshot_id and log_offset > self.from_offset)

    @property
    def next_snapshot_id(self) -> int:
        """The lowest snapshot id the bucket's leaders may use after this loss (ids are never reused)."""
        return max(self.snapshot_id, self.newest_snapshot_id) + 1


def resolved_count(losses: Sequence[DataLoss]) -> int:
    """How many of ``losses`` (oldest first) a reader can have seen: those before the first unresolved one."""
    for i, loss in enumerate(losses):
        if not loss.resolved:
            return i
    return len(losses)


def unseen_loss(losses: Sequence[DataLoss], seen: int, position: int) -> DataLoss | None:
    """The first loss a reader at ``position`` (the next offset it reads) that has seen the first ``seen``
    losses cannot adopt: one whose ``from_offset`` is below its position (offsets it read were reused).
    A loss at or past its position is adopted (nothing it read was reused). None: it may go on; it has
    then seen :func:`resolved_count` losses."""
    for loss in losses[seen:resolved_count(losses)]:
        if loss.from_offset < position:
            return loss
    return None
