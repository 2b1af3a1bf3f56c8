"""Stray copies: bucket directories a tablet server keeps for buckets that are no longer its own.

A completed move tells the replicas it took off a bucket to delete their copy (``removed`` in the
push). A server that was down then, or cut off from ZooKeeper (its session lost: the coordinator tells
servers that are not live nothing), never hears it: when it comes back the push simply does not name
the bucket, and its directory ``{data-dir}/{physical_id}/{bucket}`` would stay on disk for ever. After
the first push a (re)started server takes from a confirmed coordinator, and again after the first one
once it registered in a new ZooKeeper session, every bucket directory of a
table ZooKeeper still has that the push does not hold (nor refuse for capacity) is such a stray copy
and is deleted (:meth:`kvlease.tablet.replicas.manager.ReplicaManager.remove_stray_copies`). Tables ZooKeeper no
longer has are ``remove_dropped_tables``' business; a table whose existence cannot be checked
(a ZooKeeper error) keeps its directories. A partition's directories are named by the partition's id
and ZooKeeper keeps its node at ``/tables/{partition id}``, so a partition is such a "table" here.

This module is the choice alone: no ZooKeeper, no deletion.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable

from kvlease.common import errors

Key = tuple[int, int]  # (physical id: a table's or a partition's, bucket)


@dataclass(frozen=True)
class StrayChoice:
    strays: tuple[Key, ...]  # bucket directories to delete, by table and bucket
    unchecked: tuple[int, ...]  # tables whose existence could not be learnt: their directories are kept


def bucket_dirs(data_dir: str) -> list[Key]:
    """The ``{physical_id}/{bucket}`` directories under ``data_dir`` (numeric names only: ``held/``,
    ``server.json`` and the like are not buckets), by table and bucket."""
    found = []
    try:
        tables = os.listdir(data_dir)
    except FileNotFoundError:
        return []
    for table in tables:
        if not table.isdigit():
            continue
        try:
            buckets = os.listdir(os.path.join(data_dir, table))
        except (FileNotFoundError, NotADirectoryError):
            continue
        found.extend((int(table), int(b)) for b in buckets
                     if b.isdigit() and os.path.isdir(os.path.join(data_dir, table, b)))
    return sorted(found)


def choose_strays(on_disk: Iterable[Key], held: set[Key], table_exists: Callable[[int], bool]) -> StrayChoice:
    """The directories of ``on_disk`` that are stray copies: not in ``held`` (the buckets the last push
    holds, and those it named beyond this server's capacity), of a table ``table_exists`` says ZooKeeper
    still has. ``table_exists`` is asked once per table with an unheld directory; one that raises a
    KvLeaseError (ZooKeeper unreachable) leaves that table's directories alone."""
    candidates = sorted(set(on_disk) - held)
    exists: dict[int, bool] = {}
    unchecked: list[int] = []
    for table_id in sorted({t for t, _b in candidates}):
        try:
            exists[table_id] = table_exists(table_id)
        except errors.KvLeaseError:
            unchecked.append(table_id)
    strays = tuple(key for key in candidates if exists.get(key[0], False))
    return StrayChoice(strays, tuple(unchecked))
