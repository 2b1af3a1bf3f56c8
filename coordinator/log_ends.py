"""The bucket leaders' last reported committed log ends: kept in memory, persisted at a low rate.

A restore (:mod:`kvlease.coordinator.data_loss`) says from them how many
committed offsets it loses. Tablet servers report them (``ReportLogEnds``)
every ``kv.snapshot.interval`` for the buckets whose end moved, and all of
them again to a new active coordinator; a server whose disk is gone reports
nothing again, so what it reported last is kept in ZooKeeper
(``/log-ends/{table_id}``: ``{"buckets": {"0": [leader_epoch, log_end]}}``,
written fenced on the loop's expiry tick, at most every :data:`FLUSH_MS` for
the tables whose ends moved) and loaded by a coordinator taking over. A
dropped table's node goes at the next flush.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import zkpaths
from kvlease.common.zk import ZkOp, dumps, loads
from kvlease.coordinator.fencing import FencedWriter, chunks
from kvlease.coordinator.zk_reads import DATA, read_many

log = logging.getLogger(__name__)

FLUSH_MS = 10_000

End = tuple[int, int]  # (leader epoch, committed log end)


class LogEnds:
    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self.clock_ms = clock_ms
        self.by_table: dict[int, dict[int, End]] = {}  # table id -> bucket -> its end as last reported
        self.writer: FencedWriter | None = None
        self._stored: set[int] = set()  # tables whose node exists
        self._dirty: set[int] = set()  # tables whose ends moved since the last flush
        self._dropped: set[int] = set()  # dropped tables whose node is still there
        self._flushed_ms = clock_ms()

    def get(self, table_id: int, bucket: int) -> End | None:
        return self.by_table.get(table_id, {}).get(bucket)

    def note(self, table_id: int, bucket: int, leader_epoch: int, log_end: int) -> None:
        ends = self.by_table.setdefault(table_id, {})
        if ends.get(bucket) != (leader_epoch, log_end):
            ends[bucket] = (leader_epoch, log_end)
            self._dirty.add(table_id)

    def table_dropped(self, table_id: int) -> None:
        self.by_table.pop(table_id, None)
        self._dirty.discard(table_id)
        if table_id in self._stored:
            self._dropped.add(table_id)

    def load(self, zk: KazooClient, table_ids: Iterable[int]) -> None:
        """A coordinator taking over: the ends stored for ``table_ids`` (the catalog's tables); the nodes of
        other tables (dropped) go at the next flush."""
        zk.ensure_path(zkpaths.LOG_ENDS)
        self.by_table, self._dirty, self._flushed_ms = {}, set(), self.clock_ms()
        names = {int(n) for n in zk.get_children(zkpaths.LOG_ENDS) if n.isdigit()}
        live = set(table_ids)
        self._stored, self._dropped = names & live, names - live
        stored = sorted(self._stored)
        for table_id, answer in zip(stored, read_many(zk, [(DATA, zkpaths.log_ends(t)) for t in stored])):
            if isinstance(answer, NoNodeError):
                self._stored.discard(table_id)
                continue
            if isinstance(answer, Exception):
                raise answer
            node = loads(answer[0]) or {}
            self.by_table[table_id] = {int(bucket): (int(epoch), int(end))
                                       for bucket, (epoch, end) in node.get("buckets", {}).items()}

    def flush(self, force: bool = False) -> int:
        """Write the tables whose ends moved (and delete dropped tables' nodes), at most every
        :data:`FLUSH_MS` unless ``force``; returns how many nodes were written. A failed write is tried
        again at the next flush (CoordinatorFencedError and OutcomeUnknownError are raised)."""
        if not (self._dirty or self._dropped) or self.writer is None:
            return 0
        if not force and self.clock_ms() - self._flushed_ms < FLUSH_MS:
            return 0
        ops = [ZkOp("delete", zkpaths.log_ends(t)) for t in sorted(self._dropped)]
        for table_id in sorted(self._dirty):  # the moved tables' buckets only (not every table's: 1,000 partitions)
            ends = {str(b): list(end) for b, end in sorted(self.by_table.get(table_id, {}).items())}
            ops.append(ZkOp("set" if table_id in self._stored else "create", zkpaths.log_ends(table_id),
                            dumps({"buckets": ends})))
        written = 0
        batches = chunks(ops)
        for batch, outcome in zip(batches, self.writer.commit_many(batches)):
            if outcome is not None:  # most likely a node there or not against what we knew: the next try flips it
                log.warning("could not store the leaders' log ends (tried again in %ds): %s", FLUSH_MS // 1000,
                            outcome)
            for op in batch:
                table_id = int(op.path.rsplit("/", 1)[1])
                if op.kind == "delete":
                    self._dropped.discard(table_id)
                    self._stored.discard(table_id)
                elif outcome is None:
                    self._dirty.discard(table_id)
                    self._stored.add(table_id)
                else:
                    self._stored.symmetric_difference_update({table_id})
            written += len(batch) if outcome is None else 0
        self._flushed_ms = self.clock_ms()
        return written
