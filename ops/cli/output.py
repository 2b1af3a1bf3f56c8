"""What the CLI prints: text tables (rich) or exactly one JSON document.

The CLI turns every answer into the JSON document DESIGN.md's "CLI surface"
specifies (the ``*_doc`` functions below, pure and unit-tested); an
:class:`Output` then renders that document. :class:`JsonOutput` prints it as
one JSON document on stdout and refuses a second one; :class:`TextOutput`
renders the same document as rich tables, so both modes always show the same
facts. Errors never go through an Output: the CLI writes them to stderr.
"""

from __future__ import annotations

import base64
import json
import math
import sys
import threading
import time
from abc import ABC, abstractmethod
from datetime import date, datetime, timedelta, timezone
from typing import Any, Iterable, Mapping, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from common.tables import TableInfo
from common.model import Lease, TableBucket

# -- documents (the JSON contract) ---------------------------------------------------


def table_name(names: Mapping[int, str], table_id: int) -> str:
    """``DB.NAME`` of a table id; ``#<id>`` if the table is unknown (e.g. just dropped)."""
    return names.get(table_id, f"#{table_id}")


def bucket_docs(buckets: Mapping[TableBucket, int], names: Mapping[int, str]) -> list[dict]:
    return [{"table": table_name(names, tb.table_id), "bucket": tb.bucket, "snapshot_id": sid}
            for tb, sid in sorted(buckets.items(), key=lambda item: item[0].sort_key())]


def table_doc(info: TableInfo) -> dict:
    return {"table": info.path, **info.to_json()}


def tables_doc(infos: Iterable[TableInfo]) -> dict:
    return {"tables": [table_doc(info) for info in sorted(infos, key=lambda i: i.path)]}


def lease_doc(lease: Lease, names: Mapping[int, str]) -> dict:
    """``owner``: the token of the reader the lease belongs to, null when unowned."""
    return {"lease_id": lease.lease_id, "expiration_time": lease.expiration_time, "owner": lease.owner,
            "buckets": bucket_docs(lease.buckets, names)}


def leases_doc(leases: Iterable[Lease], names: Mapping[int, str]) -> dict:
    return {"leases": [lease_doc(lease, names) for lease in sorted(leases, key=lambda l: l.lease_id)]}


def acquire_doc(lease_id: str, expiration_time: int, acquired: Mapping[TableBucket, int],
                unavailable: Mapping[TableBucket, int], names: Mapping[int, str],
                no_snapshot: Iterable[TableBucket] = ()) -> dict:
    """``lease acquire``; ``no_snapshot`` (``--latest`` only) lists buckets that have no snapshot yet."""
    doc = {"lease_id": lease_id, "expiration_time": expiration_time,
           "acquired": bucket_docs(acquired, names), "unavailable": bucket_docs(unavailable, names)}
    missing = sorted(no_snapshot, key=TableBucket.sort_key)
    if missing:
        doc["no_snapshot"] = [{"table": table_name(names, tb.table_id), "bucket": tb.bucket} for tb in missing]
    return doc


def snapshots_doc(table: str, snapshots: Iterable[Any]) -> dict:
    """``snapshot list``; ``snapshots`` are :class:`client.admin.SnapshotInfo`."""
    rows = sorted(snapshots, key=lambda s: (s.bucket.sort_key(), s.snapshot_id))
    return {"table": table, "snapshots": [
        {"bucket": s.bucket.bucket, "snapshot_id": s.snapshot_id, "log_offset": s.log_offset,
         "leased_by": sorted(s.leased_by), "retained": bool(s.retained)} for s in rows]}


def json_value(value: Any) -> Any:
    """A column value as JSON: TIMESTAMP -> ISO-8601 text (UTC, no zone), BYTES -> base64 text,
    a NaN or infinite DOUBLE -> the text ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def row_doc(row: Mapping[str, Any] | None) -> dict | None:
    return None if row is None else {name: json_value(value) for name, value in row.items()}


def rows_doc(table: str, keys: Iterable[str], rows: Iterable[Mapping[str, Any] | None]) -> dict:
    """``get``: ``rows[i]`` is the row of ``keys[i]`` or null."""
    keys, rows = list(keys), [row_doc(r) for r in rows]
    return {"table": table, "keys": keys, "rows": rows, "found": sum(r is not None for r in rows)}


def log_record_doc(record: Mapping[str, Any]) -> dict:
    """One change record of ``log``: ``{"offset", "change_type", "timestamp", "row"}``; ``timestamp`` is
    the append time in ms since the epoch (null for a record written before changelog format v2)."""
    return {"offset": record["offset"], "change_type": record["change_type"], "timestamp": record["timestamp"],
            "row": row_doc(record["row"])}


def log_record_line(doc: Mapping[str, Any]) -> dict:
    """A :func:`log_record_doc` for people reading ``log`` lines: the timestamp as ISO-8601 UTC text."""
    return {**doc, "timestamp": iso_time_ms(doc["timestamp"])}


def scan_doc(table: str, rows: Iterable[Mapping[str, Any]], log_offsets: Mapping[int, int]) -> dict:
    """``scan``: the rows read and, per bucket read, the first changelog offset not in them."""
    return {"table": table, "rows": [row_doc(r) for r in rows],
            "log_offsets": {str(b): offset for b, offset in sorted(log_offsets.items())}}


def committed_doc(table: str, outcomes: Iterable[Any], waited: bool) -> dict:
    """``snapshot trigger``; ``outcomes`` are :class:`client.snapshot_trigger.BucketOutcome`. ``snapshots``:
    each bucket's snapshot as of the trigger, ``new`` if this trigger committed it (else nothing was
    written since); ``empty``: buckets never written; ``not_committed``: the buckets that failed."""
    outcomes = sorted(outcomes)
    return {"table": table, "waited": waited,
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


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


# -- outputs ---------------------------------------------------------------------------------


class Output(ABC):
    """Renders the CLI's documents; one instance per CLI invocation."""

    @abstractmethod
    def document(self, doc: Mapping[str, Any]) -> None:
        """A document with no dedicated text rendering (key/value lines in text mode)."""

    @abstractmethod
    def message(self, text: str, doc: Mapping[str, Any] | None = None) -> None:
        """The result of a write command: ``text`` for people, ``doc`` for ``--json``."""

    @abstractmethod
    def tables(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def table(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def snapshots(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def acquired(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def lease(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def leases(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def cluster_status(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def rows(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def committed(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def scan(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def users(self, doc: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def acls(self, doc: Mapping[str, Any]) -> None: ...


class JsonOutput(Output):
    """Prints exactly one JSON document on stdout; a second one is a bug."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self.printed = False

    def _out(self, doc: Mapping[str, Any]) -> None:
        if self.printed:
            raise RuntimeError("JsonOutput prints exactly one document per command")
        self.printed = True
        stream = self._stream or sys.stdout
        stream.write(json.dumps(doc, sort_keys=False) + "\n")
        stream.flush()

    def document(self, doc: Mapping[str, Any]) -> None:
        self._out(doc)

    def message(self, text: str, doc: Mapping[str, Any] | None = None) -> None:
        self._out(doc if doc is not None else {"message": text})

    tables = table = snapshots = acquired = lease = leases = cluster_status = rows = committed = scan = document
    users = acls = document


class TextOutput(Output):
    """Rich tables and plain lines on stdout."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False, soft_wrap=True)

    def _grid(self, *columns: str, title: str | None = None) -> RichTable:
        table = RichTable(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
        for column in columns:
            table.add_column(column)
        return table

    def _print(self, *renderables: Any) -> None:
        self.console.print(*renderables)

    def document(self, doc: Mapping[str, Any]) -> None:
        grid = self._grid("key", "value")
        for key, value in doc.items():
            grid.add_row(key, _cell(value))
        self._print(grid)

    def message(self, text: str, doc: Mapping[str, Any] | None = None) -> None:
        self._print(text)

    def tables(self, doc: Mapping[str, Any]) -> None:
        if not doc["tables"]:
            self._print("no tables")
            return
        grid = self._grid("table", "id", "buckets", "primary key", "schema")
        for t in doc["tables"]:
            grid.add_row(t["table"], str(t["table_id"]), str(t["buckets"]), ", ".join(t["primary_key"]),
                         ", ".join(f"{c['name']} {c['type']}" for c in t["schema"]))
        self._print(grid)

    def table(self, doc: Mapping[str, Any]) -> None:
        grid = self._grid("", "")
        grid.show_header = False
        grid.add_row("table", doc["table"])
        grid.add_row("id", str(doc["table_id"]))
        grid.add_row("buckets", str(doc["buckets"]))
        grid.add_row("primary key", ", ".join(doc["primary_key"]))
        if doc.get("created_ms"):
            grid.add_row("created", datetime.fromtimestamp(doc["created_ms"] / 1000).strftime("%Y-%m-%d %H:%M:%S"))
        columns = self._grid("column", "type", "key")
        for c in doc["schema"]:
            columns.add_row(c["name"], c["type"], "PK" if c["name"] in doc["primary_key"] else "")
        self._print(grid)
        self._print(columns)

    def snapshots(self, doc: Mapping[str, Any]) -> None:
        if not doc["snapshots"]:
            self._print(f"{doc['table']}: no snapshots")
            return
        grid = self._grid("bucket", "snapshot", "log offset", "retained", "leased by", title=doc["table"])
        for s in doc["snapshots"]:
            grid.add_row(str(s["bucket"]), str(s["snapshot_id"]), str(s["log_offset"]), _cell(s["retained"]),
                         _cell(s["leased_by"]))
        self._print(grid)

    def _buckets(self, rows: list[dict], title: str) -> RichTable:
        grid = self._grid("table", "bucket", "snapshot", title=title)
        for row in rows:
            grid.add_row(row["table"], str(row["bucket"]), _cell(row.get("snapshot_id")))
        return grid

    def acquired(self, doc: Mapping[str, Any]) -> None:
        if doc["expiration_time"]:
            self._print(f"lease {doc['lease_id']} expires {format_time_ms(doc['expiration_time'])}")
        else:
            self._print(f"lease {doc['lease_id']} holds nothing (no requested snapshot exists)")
        if doc["acquired"]:
            self._print(self._buckets(doc["acquired"], "acquired"))
        if doc["unavailable"]:
            self._print(self._buckets(doc["unavailable"], "unavailable (snapshot does not exist)"))
        if doc.get("no_snapshot"):
            self._print(self._buckets(doc["no_snapshot"], "not leased (bucket has no snapshot yet)"))

    def lease(self, doc: Mapping[str, Any]) -> None:
        owned = f" (owner {doc['owner']})" if doc.get("owner") else ""
        self._print(f"lease {doc['lease_id']}{owned} expires {format_time_ms(doc['expiration_time'])}")
        self._print(self._buckets(doc["buckets"], "buckets") if doc["buckets"] else "holds no buckets")

    def leases(self, doc: Mapping[str, Any]) -> None:
        if not doc["leases"]:
            self._print("no leases")
            return
        grid = self._grid("lease", "expires", "buckets")
        for lease in doc["leases"]:
            held = ", ".join(f"{b['table']}/{b['bucket']}={b['snapshot_id']}" for b in lease["buckets"])
            grid.add_row(lease["lease_id"], format_time_ms(lease["expiration_time"]), held or "-")
        self._print(grid)

    def users(self, doc: Mapping[str, Any]) -> None:
        self._print("\n".join(doc["users"]) if doc["users"] else "no users")

    def acls(self, doc: Mapping[str, Any]) -> None:
        if not doc["acls"]:
            self._print("no ACL entries (that you may see)")
            return
        grid = self._grid("resource", "principal", "operation")
        for acl in doc["acls"]:
            resource = "cluster" if acl["resource_type"] == "cluster" else f"{acl['resource_type']} {acl['resource']}"
            grid.add_row(resource, acl["principal"], acl["operation"])
        self._print(grid)

    def cluster_status(self, doc: Mapping[str, Any]) -> None:
        grid = self._grid("process", "id", "pid", "address", "alive", "state")
        for zk in doc.get("zookeeper", []):
            grid.add_row("zookeeper", str(zk["id"]), _cell(zk.get("pid")), zk["address"], _cell(zk.get("alive")), "")
        for c in doc.get("coordinators", []):
            if c.get("active"):
                state = f"active (epoch {c['epoch']})"
            elif c.get("error"):
                state = f"error: {c['error']}"
            else:
                state = "standby" if c.get("alive") else ""
            grid.add_row("coordinator", str(c["id"]), _cell(c.get("pid")), c["address"], _cell(c.get("alive")),
                          state)
        for t in doc.get("tablets", []):
            if t.get("error"):
                state = f"error: {t['error']}"
            elif "registered" in t and t["registered"] is None:
                state = ""  # not asked: nothing runs to ask (a stopped cluster), like a stopped coordinator's
            elif t.get("registered", True):
                state = f"{t.get('buckets', 0)} buckets"
                if t.get("healthy") is False:
                    serving = f", serves {t['serving']}" if "serving" in t else ""
                    state += f"{serving}; unhealthy: {'; '.join(t.get('problems') or [])}"
            else:
                state = "not registered"
            grid.add_row("tablet", str(t["id"]), _cell(t.get("pid")), t["address"], _cell(t.get("alive")), state)
        self._print(grid)

    def rows(self, doc: Mapping[str, Any]) -> None:
        found = [row for row in doc["rows"] if row is not None]
        if found:
            grid = self._grid(*found[0].keys())
            for row in found:
                grid.add_row(*(escape(_cell(v)) for v in row.values()))
            self._print(grid)
        missing = [key for key, row in zip(doc["keys"], doc["rows"]) if row is None]
        if missing:
            self._print(escape(f"not found: {', '.join(missing)}"))

    def committed(self, doc: Mapping[str, Any]) -> None:
        table, failed = doc["table"], doc["not_committed"]
        if doc["snapshots"]:
            grid = self._grid("bucket", "snapshot", "log offset", "state", title=f"{table}: snapshots")
            for snap in doc["snapshots"]:
                grid.add_row(str(snap["bucket"]), str(snap["snapshot_id"]), str(snap["log_offset"]),
                             "committed now" if snap["new"] else "no change since")
            self._print(grid)
        if doc["empty"]:
            self._print(f"{table}: bucket(s) {', '.join(map(str, doc['empty']))} empty: nothing to snapshot")
        if failed:
            grid = self._grid("bucket", "error", title=f"{table}: not committed")
            for f in failed:
                grid.add_row(str(f["bucket"]), escape(f["error"]))
            self._print(grid)
        elif not doc["waited"]:
            self._print(f"{table}: snapshot triggered on every bucket's leader")
        elif not any(snap["new"] for snap in doc["snapshots"]):
            self._print(f"{table}: no bucket changed since its last snapshot; nothing committed")

    def scan(self, doc: Mapping[str, Any]) -> None:
        """Plain aligned text (:mod:`ops.cli.text_table`): a rich table of 200,000 rows took minutes."""
        if doc["rows"]:
            from ops.cli.text_table import write_rows

            names = list(doc["rows"][0])
            write_rows(self.console.file, names, list(zip(*map(dict.values, doc["rows"]))))
        offsets = ", ".join(f"bucket {b}: {o}" for b, o in doc["log_offsets"].items()) or "-"
        count = f"{len(doc['rows'])} row(s)" if doc["rows"] else "no rows"
        self._print(f"{doc['table']}: {count}; log offsets {offsets}")


class ScanProgress:
    """``on_batch`` callback of a scan: a progress bar on stderr, shown from the second batch on
    (a scan of one batch stays silent). Thread-safe (buckets are read in parallel)."""

    def __init__(self, buckets: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.buckets = buckets
        self.rows = 0
        self.batches = 0
        self.progress = None
        self._task = None
        self._seen: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, bucket: int, batch: Any) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with self._lock:
            self.rows += batch.num_rows
            self.batches += 1
            self._seen.add(bucket)
            if self.progress is None and self.batches > 1:
                self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                         console=self.console, transient=True)
                self.progress.start()
                self._task = self.progress.add_task("")
            if self.progress is not None:
                self.progress.update(self._task, description=f"scanning: {self.rows:,} rows, "
                                     f"{len(self._seen)}/{self.buckets} bucket(s) started")

    def close(self) -> None:
        with self._lock:
            if self.progress is not None:
                self.progress.stop()


def make_output(json_mode: bool) -> Output:
    return JsonOutput() if json_mode else TextOutput()
