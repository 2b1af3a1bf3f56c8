"""The JSON documents the CLI prints (docs/architecture.md, "CLI JSON shapes"), pure functions of the answers, and the
time and cell formats the text output shares with them.

:mod:`kvlease.ops.cli.output` renders these documents (text tables or JSON) and
re-exports them, so the commands use one module, ``out``.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping


from kvlease.common.tables import TableInfo
from kvlease.ops.cli.column_values import json_value  # noqa: F401 (re-exported)
from kvlease.common.model import Lease, TableBucket

# -- documents (the JSON contract) ---------------------------------------------------


def table_name(names: Mapping[int, str], table_id: int) -> str:
    """``DB.NAME`` of a table id; ``#<id>`` if the table is unknown (e.g. just dropped)."""
    return names.get(table_id, f"#{table_id}")


def partition_fields(tb: TableBucket, partitions: Mapping[int, str] | None) -> dict:
    """``{"partition", "partition_id"}`` of a partition's bucket (its name from ``partitions``, partition id ->
    name; ``#<id>`` if unknown, e.g. just dropped); nothing for an unpartitioned table's bucket."""
    if tb.partition_id is None:
        return {}
    name = (partitions or {}).get(tb.partition_id, f"#{tb.partition_id}")
    return {"partition": name, "partition_id": tb.partition_id}


def where(doc: Mapping[str, Any]) -> str:
    """The table a document is of, and its partition if it names one: ``db.t`` or ``db.t partition 20261127``."""
    return f"{doc['table']} partition {doc['partition']}" if doc.get("partition") else doc["table"]


def bucket_text(doc: Mapping[str, Any]) -> str:
    """A bucket a document names: ``db.t/2``, or a partition's ``db.t partition 20261127 bucket 2``."""
    return f"{where(doc)} bucket {doc['bucket']}" if doc.get("partition") else f"{doc['table']}/{doc['bucket']}"


def bucket_docs(buckets: Mapping[TableBucket, int], names: Mapping[int, str],
                partitions: Mapping[int, str] | None = None) -> list[dict]:
    """Buckets and the snapshot each holds; a partition's bucket also names its partition (:func:`partition_fields`)."""
    return [{"table": table_name(names, tb.table_id), **partition_fields(tb, partitions), "bucket": tb.bucket,
             "snapshot_id": sid} for tb, sid in sorted(buckets.items(), key=lambda item: item[0].sort_key())]


def table_doc(info: TableInfo) -> dict:
    return {"table": info.path, **info.to_json()}


def assignment_docs(leaders: Mapping[int, Any]) -> list[dict]:
    """Per bucket (``client.admin.BucketLeader``): its leader (-1: none), the leader's address ("" if not
    live), replicas, ISR and epochs; ``reassign_target`` only while a move takes it elsewhere: its new replicas;
    ``lost`` only when some: the replicas that reported their data lost since they were last in sync."""
    return [{"bucket": b, "leader": x.leader_id, "leader_address": x.leader_address, "replicas": list(x.replicas),
             "isr": list(x.isr), "leader_epoch": x.leader_epoch, "bucket_epoch": x.bucket_epoch,
             **({} if getattr(x, "reassign_target", None) is None else {"reassign_target": list(x.reassign_target)}),
             **({"offline_reason": x.offline_reason} if getattr(x, "offline_reason", "") else {}),
             **({"lost": list(x.lost)} if getattr(x, "lost", ()) else {}),
             **({"losses": [loss_doc(loss) for loss in x.losses]} if getattr(x, "losses", ()) else {})}
            for b, x in sorted(leaders.items())]


def loss_doc(loss) -> dict:
    """A ``common.data_loss.DataLoss`` and its one-line description (``text``)."""
    return {**loss.to_json(), "lost_offsets": loss.lost_offsets(), "text": loss.describe()}


def tables_doc(infos: Iterable[TableInfo]) -> dict:
    return {"tables": [table_doc(info) for info in sorted(infos, key=lambda i: i.path)]}


def lease_doc(lease: Lease, names: Mapping[int, str], partitions: Mapping[int, str] | None = None) -> dict:
    """``owner``: the token of the reader the lease belongs to, null when unowned."""
    return {"lease_id": lease.lease_id, "expiration_time": lease.expiration_time, "owner": lease.owner,
            "buckets": bucket_docs(lease.buckets, names, partitions)}


def leases_doc(leases: Iterable[Lease], names: Mapping[int, str], partitions: Mapping[int, str] | None = None) -> dict:
    return {"leases": [lease_doc(lease, names, partitions) for lease in sorted(leases, key=lambda l: l.lease_id)]}


def acquire_doc(lease_id: str, expiration_time: int, acquired: Mapping[TableBucket, int],
                unavailable: Mapping[TableBucket, int], names: Mapping[int, str],
                no_snapshot: Iterable[TableBucket] = (), partitions: Mapping[int, str] | None = None) -> dict:
    """``lease acquire``; ``no_snapshot`` (``--latest`` only) lists buckets that have no snapshot yet."""
    doc = {"lease_id": lease_id, "expiration_time": expiration_time,
           "acquired": bucket_docs(acquired, names, partitions),
           "unavailable": bucket_docs(unavailable, names, partitions)}
    missing = sorted(no_snapshot, key=TableBucket.sort_key)
    if missing:
        doc["no_snapshot"] = [{"table": table_name(names, tb.table_id), **partition_fields(tb, partitions),
                               "bucket": tb.bucket} for tb in missing]
    return doc


def snapshots_doc(table: str, snapshots: Iterable[Any], partitions: Mapping[int, str] | None = None,
                  partition: str | None = None) -> dict:
    """``snapshot list``; ``snapshots`` are :class:`kvlease.client.admin.SnapshotInfo`; a partition's also name it
    (``partitions``: partition id -> name); ``partition``: the one partition listed, if one was asked for."""
    rows = sorted(snapshots, key=lambda s: (s.bucket.sort_key(), s.snapshot_id))
    return {"table": table, **({"partition": partition} if partition else {}), "snapshots": [
        {**partition_fields(s.bucket, partitions), "bucket": s.bucket.bucket, "snapshot_id": s.snapshot_id,
         "log_offset": s.log_offset, "leased_by": sorted(s.leased_by), "retained": bool(s.retained)} for s in rows]}


def partition_doc(partition: Any) -> dict:
    """A :class:`kvlease.client.partitions_admin.PartitionInfo`: ``held_by``, the leases that keep it past its
    table's retention (empty: none does)."""
    return {"partition": partition.name, "partition_id": partition.partition_id, "created_ms": partition.created_ms,
            "held_by": list(partition.held_by)}


def partitions_doc(table: str, partitions: Iterable[Any]) -> dict:
    """``partition list``: a table's partitions, by name."""
    return {"table": table, "partitions": [partition_doc(p) for p in sorted(partitions, key=lambda p: p.name)]}


def row_doc(row: Mapping[str, Any] | None) -> dict | None:
    return None if row is None else {name: json_value(value) for name, value in row.items()}


def rows_doc(table: str, keys: Iterable[str], rows: Iterable[Mapping[str, Any] | None]) -> dict:
    """``get``: ``rows[i]`` is the row of ``keys[i]`` or null."""
    keys, rows = list(keys), [row_doc(r) for r in rows]
    return {"table": table, "keys": keys, "rows": rows, "found": sum(r is not None for r in rows)}


def prefix_rows_doc(table: str, prefix: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]) -> dict:
    """``get --prefix``: every row of the prefix (``{bucket-key column: value}``), in key order."""
    rows = [row_doc(r) for r in rows]
    return {"table": table, "prefix": {k: json_value(v) for k, v in prefix.items()}, "keys": [], "rows": rows,
            "found": len(rows)}


def log_record_doc(record: Mapping[str, Any]) -> dict:
    """One change record of ``log``: ``{"offset", "change_type", "timestamp", "row"}``; ``timestamp`` is
    the append time in ms since the epoch (null for a record written before changelog format v2)."""
    return {"offset": record["offset"], "change_type": record["change_type"], "timestamp": record["timestamp"],
            "row": row_doc(record["row"])}


def log_record_line(doc: Mapping[str, Any]) -> dict:
    """A :func:`log_record_doc` for people reading ``log`` lines: the timestamp as ISO-8601 UTC text."""
    return {**doc, "timestamp": iso_time_ms(doc["timestamp"])}


def scan_doc(table: str, rows: Iterable[Mapping[str, Any]], log_offsets: Mapping[int, int],
             partition: str | None = None) -> dict:
    """``scan``: the rows read and, per bucket read, the first changelog offset not in them; ``partition``: the
    partition read (a partitioned table's)."""
    return {"table": table, **({"partition": partition} if partition else {}), "rows": [row_doc(r) for r in rows],
            "log_offsets": {str(b): offset for b, offset in sorted(log_offsets.items())}}


def committed_doc(table: str, outcomes: Iterable[Any], waited: bool, partition: str | None = None) -> dict:
    """``snapshot trigger``; ``outcomes`` are :class:`kvlease.client.snapshot_trigger.BucketOutcome`. ``snapshots``:
    each bucket's snapshot as of the trigger, ``new`` if this trigger committed it (else nothing was
    written since); ``empty``: buckets never written; ``not_committed``: the buckets that failed;
    ``partition``: the partition whose buckets these are (a partitioned table's)."""
    outcomes = sorted(outcomes)
    return {"table": table, **({"partition": partition} if partition else {}), "waited": waited,
            "snapshots": [{"bucket": o.bucket, "snapshot_id": o.snapshot.snapshot_id,
                           "log_offset": o.snapshot.log_offset, "new": o.state == "committed"}
                          for o in outcomes if o.snapshot is not None],
            "empty": [o.bucket for o in outcomes if o.state == "empty"],
            "not_committed": [{"bucket": o.bucket, "error": o.error.message} for o in outcomes if o.state == "failed"]}


# -- rendering helpers ---------------------------------------------------------------------


def iso_time_ms(ms: int | None) -> str | None:
    """``2024-05-01T12:00:00.123Z`` for ms since the epoch (exact: integer arithmetic); None stays None."""
    if ms is None:
        return None
    stamp = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_time_ms(ms: int | None, now_ms: int | None = None) -> str:
    """``2024-05-01 12:00:00 (in 9m59s)`` for a deadline in ms since the epoch."""
    if not ms:
        return "-"
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    stamp = datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
    delta_s = (ms - now_ms) // 1000
    return f"{stamp} ({'in ' + format_span(delta_s) if delta_s >= 0 else format_span(-delta_s) + ' ago'})"


def format_span(seconds: int) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (minutes, "m")) if v]
    if secs or not parts:
        parts.append(f"{secs}s")
    return "".join(parts[:2])


def cell_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)
