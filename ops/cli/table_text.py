"""The text form of ``table describe`` and ``partition list``: a table's definition, its schema and the schema's
history, its partitioning, and per bucket (per partition's bucket, for a partitioned table) its leader, replicas
and ISR.

:class:`kvlease.ops.cli.output.TextOutput` renders those two documents with these functions; each takes
its ``grid`` (columns -> an empty rich table) and ``show`` (print renderables), so the look is the output's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Mapping

from rich.markup import escape

from kvlease.common.row_ttl import RowTtl
from kvlease.common.merge_engine import MergeEngine
from kvlease.ops.cli.documents import cell_text

Grid = Callable[..., Any]
Show = Callable[..., None]


def local_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def partitioning_text(doc: Mapping[str, Any], short: bool = False) -> str:
    """``day`` or ``hour (auto HOUR: 2 ahead, 24 kept, time zone UTC)`` (``short``: ``hour (auto HOUR)``); ``-``
    for an unpartitioned table."""
    if not doc.get("partition_key"):
        return "-"
    text = ", ".join(doc["partition_key"])
    auto = doc.get("auto_partition")
    if auto and short:
        text += f" (auto {auto['unit']})"
    elif auto:
        kept = f"{auto['retention']} kept" if auto["retention"] >= 0 else "none dropped"
        text += f" (auto {auto['unit']}: {auto['precreate']} ahead, {kept}, time zone {auto['time_zone']})"
    return text


def describe_table(grid: Grid, show: Show, doc: Mapping[str, Any]) -> None:
    """``table describe``: the definition, the columns, then the buckets (a partitioned table's: per partition)."""
    rows = grid("", "")
    rows.show_header = False
    partitioned = bool(doc.get("partition_key"))
    rows.add_row("table", doc["table"])
    rows.add_row("id", str(doc["table_id"]))
    rows.add_row("buckets" + (" per partition" if partitioned else ""), str(doc["buckets"]))
    rows.add_row("replication factor", str(doc.get("replication_factor", 1)))
    rows.add_row("min in-sync replicas", str(doc.get("min_insync_replicas", 1)))
    rows.add_row("primary key", ", ".join(doc["primary_key"]))
    if doc.get("bucket_key"):
        rows.add_row("bucket key", ", ".join(doc["bucket_key"]))
    rows.add_row("schema id", str(doc.get("schema_id", 1)))
    if doc.get("comment"):
        rows.add_row("comment", escape(doc["comment"]))
    if doc.get("row_ttl"):
        rows.add_row("row TTL", escape(RowTtl.from_json(doc["row_ttl"]).describe()))
    rows.add_row("merge engine", escape(MergeEngine.from_json(doc["merge_engine"]).describe())
                 if doc.get("merge_engine") else "none (the last write wins)")
    if partitioned:
        rows.add_row("partitioned by", partitioning_text(doc))
        rows.add_row("max partitions", str(doc["max_partitions"]))
        rows.add_row("partitions", str(len(doc.get("partitions", []))))
    if doc.get("created_ms"):
        rows.add_row("created", local_time(doc["created_ms"]))
    columns = grid("column", "type", "key", "field id", "comment")
    for c in doc["schema"]:
        key = "PK" + (", partition" if c["name"] in doc.get("partition_key", ()) else "")
        columns.add_row(c["name"], escape(c["type"]), key if c["name"] in doc["primary_key"] else "",
                        str(c.get("id", "")), escape(c.get("comment", "")))
    show(rows)
    show(columns)
    if doc.get("history"):
        show(history_grid(grid, doc["history"]))
    if doc.get("partitions"):
        show(partitions_grid(grid, doc["partitions"], "partitions"))
    if partitioned:
        buckets = [(p["partition"], b) for p in doc.get("partitions", []) for b in p["assignment"]]
    else:
        buckets = [(None, b) for b in doc.get("assignment", [])]
    if buckets:
        show(bucket_grid(grid, buckets, partitioned))
        losses = [(partition, b["bucket"], loss) for partition, b in buckets for loss in b.get("losses", [])]
        if losses:
            lost = grid(*(["partition"] if partitioned else []), "bucket", "data loss accepted", title="data losses")
            for partition, bucket, loss in losses:
                lost.add_row(*([partition] if partitioned else []), str(bucket), loss["text"])
            show(lost)


def history_grid(grid: Grid, versions: list[Mapping[str, Any]]) -> Any:
    """``table describe``'s schema history: per version its id, when, what changed and its columns."""
    history = grid("schema id", "when", "change", "columns", title="schema history")
    for v in versions:
        history.add_row(str(v["schema_id"]), local_time(v["time_ms"]), escape(v["change"]),
                        escape(", ".join(f"{c['name']} {c['type']}" for c in v["schema"])))
    return history


def bucket_grid(grid: Grid, buckets: list[tuple[str | None, Mapping[str, Any]]], partitioned: bool) -> Any:
    """One row per bucket (``(partition or None, its assignment document)``): leader, replicas, ISR, leader
    epoch, and where a move takes it while one does."""
    moving = any(b.get("reassign_target") is not None for _p, b in buckets)
    table = grid(*(["partition"] if partitioned else []), "bucket", "leader", "replicas", "ISR", "leader epoch",
                 *(["moving to"] if moving else []))
    for partition, b in buckets:
        leader = str(b["leader"]) if b["leader"] >= 0 else "none (offline)"
        if b.get("offline_reason"):
            leader = f"none (offline: {b['offline_reason']})"
        if b["leader"] >= 0 and not b["leader_address"]:
            leader += " (not live)"
        target = b.get("reassign_target")
        move = [] if not moving else ["-" if target is None else ", ".join(map(str, target)) + (
            f" (waiting for {', '.join(str(r) for r in target if r not in b['isr'])})"
            if set(target) - set(b["isr"]) else "")]
        replicas = ", ".join(map(str, b["replicas"])) or "-"
        if b.get("lost"):
            replicas += f" (data lost: {', '.join(map(str, b['lost']))})"
        table.add_row(*([escape(partition)] if partitioned else []), str(b["bucket"]), leader, replicas,
                      ", ".join(map(str, b["isr"])) or "-", str(b["leader_epoch"]), *move)
    return table


def list_partitions(grid: Grid, show: Show, doc: Mapping[str, Any]) -> None:
    """``partition list``: each partition's name, id, when it was made, and the leases that keep it past
    retention."""
    if not doc["partitions"]:
        show(f"{doc['table']}: no partitions")
        return
    show(partitions_grid(grid, doc["partitions"], doc["table"]))


def partitions_grid(grid: Grid, partitions: list[Mapping[str, Any]], title: str) -> Any:
    table = grid("partition", "id", "created", "held by (past retention)", title=title)
    for p in partitions:
        table.add_row(escape(p["partition"]), str(p["partition_id"]), local_time(p["created_ms"]),
                      escape(cell_text(p["held_by"])))
    return table
