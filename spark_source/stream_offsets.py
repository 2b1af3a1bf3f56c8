"""A streaming read's offsets as JSON: what Spark logs in the checkpoint, and what a restarted query reads back.

``{"table": table id, "lease": id, "owner": token, "buckets": {"<key>": {"snapshot": id or -1,
"offset": n, "losses": k, "epoch": e}}}``, and for a partitioned table also ``"partitions":
{"<partition id>": "<name>"}``: the partitions the query reads. A bucket's key is its number for an
unpartitioned table (``"0"``: as offsets always were, so older checkpoints load unchanged) and
``"p{partition_id}-{bucket}"`` for a partition's (``spark_source/partitions.py``). The meaning of each
field is ``spark_source/stream.py``'s docstring. ``"losses"`` is absent when 0 and ``"epoch"`` when not
known, as in offsets written before either existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kvlease.common import errors
from kvlease.spark_source.partitions import BucketKey, key_text, parse_key

NOT_STARTED = -1


@dataclass(frozen=True)
class LeaseRef:
    """A streaming query's lease: its id and the owner token its calls carry."""

    lease_id: str
    owner: str | None


def _offset(lease: LeaseRef | None, buckets: Mapping[BucketKey, tuple[int, int]], table_id: int,
            losses: Mapping[BucketKey, int] | None = None, epochs: Mapping[BucketKey, int | None] | None = None,
            partitions: Mapping[int, str] | None = None) -> dict:
    """``buckets``: key -> ``(snapshot, offset)``; ``losses``: key -> the loss records of the bucket the query
    has seen (``"losses"``; absent: 0); ``epochs``: key -> the leader epoch of the entry below its offset
    (``"epoch"``; absent when None); ``partitions``: a partitioned table's partitions read, id -> name."""
    doc: dict = {"table": table_id, "lease": None if lease is None else lease.lease_id}
    if lease is not None and lease.owner is not None:
        doc["owner"] = lease.owner
    doc["buckets"] = {key_text(k): {"snapshot": s, "offset": o} for k, (s, o) in sorted(buckets.items())}
    for k, seen in (losses or {}).items():
        if seen and key_text(k) in doc["buckets"]:
            doc["buckets"][key_text(k)]["losses"] = seen
    for k, epoch in (epochs or {}).items():
        if epoch is not None and key_text(k) in doc["buckets"]:
            doc["buckets"][key_text(k)]["epoch"] = epoch
    if partitions is not None:
        doc["partitions"] = {str(p): name for p, name in sorted(partitions.items())}
    return doc


def _parse(offset: dict) -> tuple[int | None, LeaseRef | None, dict[BucketKey, tuple[int, int]]]:
    """``(table id or None if the offset predates it, lease, buckets)``."""
    try:
        table_id = offset.get("table")
        lease_id, owner = offset.get("lease"), offset.get("owner")
        lease = None if lease_id is None else LeaseRef(str(lease_id), None if owner is None else str(owner))
        return (None if table_id is None else int(table_id), lease,
                {parse_key(k): (int(v["snapshot"]), int(v["offset"])) for k, v in offset["buckets"].items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise errors.InvalidRequestError(f"not a kvlease streaming offset: {offset!r} ({exc})") from None


def partition_names(offset: dict) -> dict[int, str]:
    """The partitions an offset of a partitioned table reads (id -> name); {} for another table's."""
    try:
        return {int(p): str(name) for p, name in (offset.get("partitions") or {}).items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise errors.InvalidRequestError(f"not a kvlease streaming offset: {offset!r} ({exc})") from None


def _with_epochs(buckets: Mapping[BucketKey, tuple[int, int]],
                 offset: dict) -> dict[BucketKey, tuple[tuple[int, int], int | None]]:
    """key -> ``((snapshot, offset), the epoch below it)`` of a parsed offset and its JSON (None: it does
    not say, as an offset written before epochs, or a key it does not have)."""
    docs = offset.get("buckets", {})
    out = {}
    for k, pair in buckets.items():
        doc = docs.get(key_text(k))
        epoch = doc.get("epoch") if isinstance(doc, dict) else None
        out[k] = (pair, None if epoch is None or pair[1] == NOT_STARTED else int(epoch))
    return out


def _losses_seen(offset: dict) -> dict[BucketKey, int]:
    """key -> the loss records an offset has seen (0 when it does not say)."""
    return {parse_key(k): int(v.get("losses", 0)) for k, v in offset.get("buckets", {}).items()
            if isinstance(v, dict)}


def _named(lease: LeaseRef | None) -> LeaseRef:
    """The lease of an offset that bootstraps buckets (InvalidRequestError if it names none)."""
    if lease is None:
        raise errors.InvalidRequestError("not a kvlease streaming offset: it bootstraps buckets but names no lease")
    return lease


def _limited(starts: Mapping[BucketKey, int], ends: Mapping[BucketKey, int], max_rows: int) -> dict[BucketKey, int]:
    """Ends that read at most ``max_rows`` records in all, shared fairly between the buckets."""
    out = dict(starts)
    pending = {b: ends[b] - starts[b] for b in sorted(starts) if ends[b] > starts[b]}
    budget = max_rows
    while budget > 0 and pending:
        share = max(1, budget // len(pending))
        for b in list(pending):
            take = min(share, pending[b], budget)
            out[b] += take
            pending[b] -= take
            budget -= take
            if not pending[b]:
                del pending[b]
            if not budget:
                break
    return out
