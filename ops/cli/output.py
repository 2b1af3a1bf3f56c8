"""What the CLI prints: text tables (rich) or exactly one JSON document.

The CLI turns every answer into the JSON document docs/architecture.md's "CLI JSON shapes"
specifies (the ``*_doc`` functions of :mod:`kvlease.ops.cli.documents`, pure and unit-tested,
re-exported here); an
:class:`Output` then renders that document. :class:`JsonOutput` prints it as
one JSON document on stdout and refuses a second one; :class:`TextOutput`
renders the same document as rich tables, so both modes always show the same
facts. Errors never go through an Output: the CLI writes them to stderr.
"""

from __future__ import annotations

import json
import sys
import threading
from abc import ABC, abstractmethod
from typing import Any, Mapping, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from kvlease.ops.cli.documents import (acquire_doc, bucket_docs, bucket_text, cell_text, committed_doc, format_span,
                                       format_time_ms, iso_time_ms, json_value, lease_doc, leases_doc,
                                       log_record_doc, log_record_line, partition_doc, partitions_doc,
                                       prefix_rows_doc, row_doc, rows_doc, scan_doc, snapshots_doc, table_doc,
                                       table_name, tables_doc, assignment_docs, where)
from kvlease.ops.cli.table_text import describe_table, list_partitions, partitioning_text

__all__ = [  # the documents are re-exported: the commands use this one module
    "JsonOutput", "Output", "ScanProgress", "TextOutput", "acquire_doc", "bucket_docs", "committed_doc",
    "format_span", "format_time_ms", "iso_time_ms", "json_value", "lease_doc", "leases_doc", "log_record_doc",
    "log_record_line", "make_output", "partition_doc", "partitions_doc", "prefix_rows_doc", "row_doc", "rows_doc",
    "scan_doc",
    "snapshots_doc", "table_doc", "assignment_docs", "table_name", "tables_doc", "where",
]

# -- outputs ---------------------------------------------------------------------------------


def bucket_health_lines(doc: Mapping[str, Any]) -> list[str]:
    """``cluster status``'s lines after the processes: the offline and under-replicated buckets (counted, the
    first 20 named), why an offline one's data is lost, the moves in progress; a partition's bucket is named
    with its partition (:func:`bucket_text`)."""
    lines = []
    for key, what in (("offline", "offline buckets (no live leader)"),
                      ("under_replicated", "under-replicated buckets (ISR smaller than replicas)")):
        if doc.get(key):
            more = f" and {len(doc[key]) - 20} more" if len(doc[key]) > 20 else ""
            lines.append(f"{what}: {len(doc[key])}: {', '.join(map(bucket_text, doc[key][:20]))}{more}")
    lines += [f"  {bucket_text(b)}: {b['offline_reason']}" for b in doc.get("offline", []) if b.get("offline_reason")]
    if doc.get("reassignments"):
        moves = doc["reassignments"]
        shown = "; ".join(f"{bucket_text(m)} to {m['target']}"
                          + (f" (waiting for {m['waiting']})" if m["waiting"] else "") for m in moves[:20])
        more = f" and {len(moves) - 20} more" if len(moves) > 20 else ""
        lines.append(f"buckets being moved: {len(moves)}: {shown}{more}")
    return lines


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
    def partitions(self, doc: Mapping[str, Any]) -> None: ...

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
    users = acls = partitions = document


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
            grid.add_row(key, cell_text(value))
        self._print(grid)

    def message(self, text: str, doc: Mapping[str, Any] | None = None) -> None:
        self._print(text)

    def tables(self, doc: Mapping[str, Any]) -> None:
        if not doc["tables"]:
            self._print("no tables")
            return
        grid = self._grid("table", "id", "buckets", "primary key", "partitioned by", "schema")
        for t in doc["tables"]:
            grid.add_row(t["table"], str(t["table_id"]), str(t["buckets"]), ", ".join(t["primary_key"]),
                         partitioning_text(t, short=True), ", ".join(f"{c['name']} {c['type']}" for c in t["schema"]))
        self._print(grid)

    def table(self, doc: Mapping[str, Any]) -> None:
        describe_table(self._grid, self._print, doc)

    def partitions(self, doc: Mapping[str, Any]) -> None:
        list_partitions(self._grid, self._print, doc)

    def snapshots(self, doc: Mapping[str, Any]) -> None:
        if not doc["snapshots"]:
            self._print(f"{where(doc)}: no snapshots")
            return
        partitioned = any("partition" in s for s in doc["snapshots"])
        grid = self._grid(*(["partition"] if partitioned else []), "bucket", "snapshot", "log offset", "retained",
                          "leased by", title=where(doc))
        for s in doc["snapshots"]:
            grid.add_row(*([escape(s["partition"])] if partitioned else []), str(s["bucket"]), str(s["snapshot_id"]),
                         str(s["log_offset"]), cell_text(s["retained"]), cell_text(s["leased_by"]))
        self._print(grid)

    def _buckets(self, rows: list[dict], title: str) -> RichTable:
        partitioned = any("partition" in row for row in rows)
        grid = self._grid("table", *(["partition"] if partitioned else []), "bucket", "snapshot", title=title)
        for row in rows:
            partition = [escape(row.get("partition", "-"))] if partitioned else []
            grid.add_row(row["table"], *partition, str(row["bucket"]), cell_text(row.get("snapshot_id")))
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
            held = ", ".join(f"{b['table']}/{b['partition'] + '/' if 'partition' in b else ''}{b['bucket']}="
                             f"{b['snapshot_id']}" for b in lease["buckets"])
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
            grid.add_row("zookeeper", str(zk["id"]), cell_text(zk.get("pid")), zk["address"], cell_text(zk.get("alive")), "")
        for c in doc.get("coordinators", []):
            if c.get("active"):
                state = f"active (epoch {c['epoch']})"
            elif c.get("error"):
                state = f"error: {c['error']}"
            else:
                state = "standby" if c.get("alive") else ""
            grid.add_row("coordinator", str(c["id"]), cell_text(c.get("pid")), c["address"], cell_text(c.get("alive")),
                          state)
        for t in doc.get("tablets", []):
            if t.get("error"):
                state = f"error: {t['error']}"
            elif "registered" in t and t["registered"] is None:
                state = ""  # not asked: nothing runs to ask (a stopped cluster), like a stopped coordinator's
            elif t.get("registered", True):
                state = f"{t.get('buckets', 0)} buckets"
                if t.get("replicas", t.get("buckets", 0)) != t.get("buckets", 0):
                    state += f" led, {t['replicas']} replicas"
                if t.get("rebuilding") or t.get("offsets_behind"):
                    state += (f"; rebuilding {t.get('rebuilding', 0)} bucket(s), "
                              f"{t.get('rebuild_bytes', 0) / 1e6:.1f} MB downloaded, "
                              f"{t.get('offsets_behind', 0)} offsets behind")
                if t.get("healthy") is False:
                    serving = f", serves {t['serving']}" if "serving" in t else ""
                    state += f"{serving}; unhealthy: {'; '.join(t.get('problems') or [])}"
            else:
                state = "not registered"
            if t.get("decommissioned"):
                state += ("; " if state else "") + "decommissioned (takes no new replicas)"
            if t.get("disk_bytes"):
                free = t.get("disk_free_bytes")
                state += (("; " if state else "") + f"tmpfs disk {t['disk_bytes'] / (1 << 20):.0f} MiB"
                          + (f", {free / (1 << 20):.1f} MiB free" if free is not None else ", unmounted"))
            grid.add_row("tablet", str(t["id"]), cell_text(t.get("pid")), t["address"], cell_text(t.get("alive")), state)
        self._print(grid)
        if doc.get("settings"):
            shown = ", ".join(f"{key}={value}" for key, value in doc["settings"].items())
            self._print(f"settings of every server (cluster start --set): {escape(shown)}")
        for line in bucket_health_lines(doc):
            self._print(escape(line))

    def rows(self, doc: Mapping[str, Any]) -> None:
        from kvlease.ops.cli.text_table import cell_text as value_text  # as scan shows values: nested as JSON

        found = [row for row in doc["rows"] if row is not None]
        if found:
            grid = self._grid(*found[0].keys())
            for row in found:
                grid.add_row(*(escape(value_text(v)) for v in row.values()))
            self._print(grid)
        missing = [key for key, row in zip(doc["keys"], doc["rows"]) if row is None]
        if missing:
            self._print(escape(f"not found: {', '.join(missing)}"))
        if "prefix" in doc and not found:
            self._print(escape(f"no rows with {', '.join(f'{k}={v}' for k, v in doc['prefix'].items())}"))

    def committed(self, doc: Mapping[str, Any]) -> None:
        table, failed = where(doc), doc["not_committed"]
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
        """Plain aligned text (:mod:`kvlease.ops.cli.text_table`): a rich table of 200,000 rows took minutes."""
        if doc["rows"]:
            from kvlease.ops.cli.text_table import write_rows

            names = list(doc["rows"][0])
            write_rows(self.console.file, names, list(zip(*map(dict.values, doc["rows"]))))
        offsets = ", ".join(f"bucket {b}: {o}" for b, o in doc["log_offsets"].items()) or "-"
        count = f"{len(doc['rows'])} row(s)" if doc["rows"] else "no rows"
        self._print(f"{where(doc)}: {count}; log offsets {offsets}")


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
