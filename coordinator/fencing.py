"""Epoch fencing: every ZooKeeper write of the active coordinator is a multi-op
that first checks the version of ``/coordinators/epoch``.

A deposed coordinator (a newer one bumped the epoch) fails that check, so it
cannot write, whatever it believes. Several multi-ops can be sent at once
(pipelined) and each succeeds or fails on its own.
"""

from __future__ import annotations

import logging
from typing import Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import (BadArgumentsError, BadVersionError, ConnectionLoss, InvalidACLError, KazooException,
                              NoChildrenForEphemeralsError, RolledBackError, SessionExpiredError)

from kvlease.common import errors, zkpaths
from kvlease.common.zk import ZkOp, dumps, loads

log = logging.getLogger(__name__)

#: Ops per multi-op the coordinator sends (lease writes, snapshot deletes).
MAX_OPS_PER_MULTI = 500

#: Bytes (data + paths) one fenced multi-op may carry. ZooKeeper drops the connection on a
#: request over its ``jute.maxbuffer`` (1 MiB by default): the write's outcome would be
#: unknown and the coordinator would step down, for a request that was merely too big.
ZK_MAX_WRITE_BYTES = 1_000_000


def chunks(ops: Sequence[ZkOp], max_bytes: int | None = None) -> list[list[ZkOp]]:
    """``ops`` in order, cut into multi-ops of at most MAX_OPS_PER_MULTI ops and about ``max_bytes``
    (default: a quarter of :data:`ZK_MAX_WRITE_BYTES`)."""
    limit = ZK_MAX_WRITE_BYTES // 4 if max_bytes is None else max_bytes
    out: list[list[ZkOp]] = []
    size = 0
    for op in ops:
        cost = len(op.path) + len(op.data) + 64
        if not out or len(out[-1]) >= MAX_OPS_PER_MULTI or size + cost > limit:
            out.append([])
            size = 0
        out[-1].append(op)
        size += cost
    return out


def write_size(ops: Sequence[ZkOp]) -> int:
    """About what the ops weigh in a multi-op request (a little over: headers counted generously)."""
    return sum(len(op.path.encode()) + len(op.data) + 64 for op in ops) + len(zkpaths.EPOCH) + 64


def check_write_size(what: str, size: int) -> None:
    """Raises InvalidRequestError naming ``what`` and the limit if ``size`` bytes cannot be written."""
    if size > ZK_MAX_WRITE_BYTES:
        raise errors.InvalidRequestError(
            f"{what} is {size:,} bytes, over the {ZK_MAX_WRITE_BYTES:,}-byte limit of a ZooKeeper write")


#: ZooKeeper errors that are the request's fault (e.g. a path with a control character): sending it again
#: fails the same way, so they are an invalid request, not a retriable StorageError.
REQUEST_FAULTS: tuple[type[KazooException], ...] = (BadArgumentsError, InvalidACLError, NoChildrenForEphemeralsError)


class Fenced(errors.CoordinatorFencedError):
    """Raised on the epoch check failing: this coordinator must step down."""


def bump_epoch(zk: KazooClient) -> tuple[int, int]:
    """Take a new epoch: returns ``(epoch, version)``; the version is the fencing token."""
    zk.ensure_path(zkpaths.EPOCH)
    data, stat = zk.get(zkpaths.EPOCH)
    epoch = int((loads(data) or {}).get("epoch", 0)) + 1
    stat = zk.set(zkpaths.EPOCH, dumps({"epoch": epoch}), version=stat.version)
    return epoch, stat.version


class FencedWriter:
    def __init__(self, zk: KazooClient, epoch_version: int) -> None:
        self.zk = zk
        self.epoch_version = epoch_version

    def _transaction(self, ops: Sequence[ZkOp]):
        txn = self.zk.transaction()
        txn.check(zkpaths.EPOCH, self.epoch_version)
        for op in ops:
            if op.kind == "create":
                txn.create(op.path, op.data)
            elif op.kind == "set":
                txn.set_data(op.path, op.data)
            elif op.kind == "delete":
                txn.delete(op.path)
            else:
                raise ValueError(f"unknown op {op.kind}")
        return txn

    def commit_many(self, batches: Sequence[Sequence[ZkOp]]) -> list[Exception | None]:
        """Send every batch as its own fenced multi-op, all at once; None per success.

        Raises :class:`Fenced` if the epoch check failed (nothing of ours can be
        written any more) and ``OutcomeUnknownError`` if the connection was lost
        (a multi-op may or may not have been applied). A batch over
        :data:`ZK_MAX_WRITE_BYTES` is not sent: its outcome is an InvalidRequestError.
        """
        pending = []
        for ops in batches:
            try:
                check_write_size(f"a ZooKeeper multi-op of {len(ops)} operations", write_size(ops))
                pending.append(self._transaction(ops).commit_async())
            except errors.InvalidRequestError as exc:
                log.error("write not sent: %s", exc)
                pending.append(exc)
        outcomes: list[Exception | None] = []
        fenced = lost = False
        for ops, result in zip(batches, pending):
            if isinstance(result, errors.InvalidRequestError):
                outcomes.append(result)
                continue
            try:
                results = result.get()
            except (ConnectionLoss, SessionExpiredError) as exc:
                lost = True
                outcomes.append(errors.OutcomeUnknownError(f"ZooKeeper connection lost: {type(exc).__name__}"))
                continue
            except REQUEST_FAULTS as exc:
                outcomes.append(errors.InvalidRequestError(f"ZooKeeper rejected the request: {type(exc).__name__}"))
                continue
            except KazooException as exc:
                outcomes.append(errors.StorageError(f"ZooKeeper write failed: {type(exc).__name__}"))
                continue
            failures = [r for r in results if isinstance(r, Exception)]
            if not failures:
                outcomes.append(None)
            elif isinstance(results[0], BadVersionError):
                fenced = True
                outcomes.append(Fenced("coordinator epoch changed: this coordinator was deposed"))
            else:
                real = [f for f in failures if not isinstance(f, RolledBackError)]
                what = ", ".join(f"{type(f).__name__} on {op.kind} {op.path}" for f, op in zip(results[1:], ops)
                                 if isinstance(f, Exception) and not isinstance(f, RolledBackError))
                log.error("multi-op rejected: %s", what or real)
                if real and all(isinstance(f, REQUEST_FAULTS) for f in real):
                    outcomes.append(errors.InvalidRequestError(f"ZooKeeper rejected the request: {what}"))
                else:
                    outcomes.append(errors.StorageError(f"ZooKeeper rejected the write: {what}"))
        if fenced:
            raise Fenced("coordinator epoch changed: this coordinator was deposed")
        if lost:
            raise errors.OutcomeUnknownError("ZooKeeper connection lost during a write")
        return outcomes

    def commit(self, ops: Sequence[ZkOp]) -> None:
        """One fenced multi-op; raises its error."""
        outcome = self.commit_many([ops])[0]
        if outcome is not None:
            raise outcome
