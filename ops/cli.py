"""The ``kvlease`` command line.

One click group, :func:`kvlease`, keeps the global options in a :class:`State`
that builds the admin client (lazily: only commands that talk to a coordinator
pay for it) and the :class:`ops.output.Output` (text or ``--json``) once.
:func:`catch_errors` turns every kvlease error into one line on stderr and exit
code 1; usage errors (bad option syntax) are click's and exit 2.

Finding the cluster, first match wins: ``--bootstrap``, then ``--cluster``
given on the command line (before or after the command name), then
``KVLEASE_BOOTSTRAP``, then ``KVLEASE_CLUSTER``.

Plug-ins: ``kvlease bench NAME`` imports ``ops.bench_<NAME>`` and calls its
``main(json_output: bool)``; ``kvlease drill NAME`` imports
``ops.drill_<NAME>`` and calls ``main(cluster_dir: str, json_output: bool)``.
An int returned is the exit code (anything else, None or e.g. a dict of
figures, means 0); a module prints its own result (one JSON document when
``json_output``) and raises :class:`common.errors.KvLeaseError` for failures
the CLI should report.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib
import json
import os
import pkgutil
import re
import sys
import time
import traceback
from datetime import datetime
from typing import Any, Callable, Iterable, TextIO

import click
from click.core import ParameterSource

from common import config as cfg
from common import errors
from common.tables import TableInfo, parse_schema, parse_table_path
from common.model import TableBucket
from ops import cluster as local_cluster
from ops import output as out

DEFAULT_RETRY_TIMEOUT = "10s"
PUT_BATCH_ROWS = 10_000
PLUGIN_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


# -- parameter types (client-side syntax checks: usage errors, exit 2) -------------------------


class Duration(click.ParamType):
    """``10m``, ``30s``, ``500ms`` -> milliseconds."""

    name = "duration"

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, int):
            return value
        try:
            return cfg.parse_duration_ms(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class BucketSnapshot(click.ParamType):
    """``B=ID`` (bucket number = snapshot id) -> ``(B, ID)``."""

    name = "B=ID"

    def convert(self, value: Any, param, ctx) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        m = re.fullmatch(r"\s*(\d+)\s*=\s*(\d+)\s*", str(value))
        if not m:
            self.fail(f"{value!r} is not BUCKET=SNAPSHOT_ID (e.g. 0=12)", param, ctx)
        return int(m.group(1)), int(m.group(2))


class BucketList(click.ParamType):
    """``3`` or ``0,1,2`` -> a list of bucket numbers."""

    name = "B[,B…]"

    def convert(self, value: Any, param, ctx) -> list[int]:
        if isinstance(value, list):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        if not parts or not all(p.isdigit() for p in parts):
            self.fail(f"{value!r} is not a bucket number or a comma-separated list of them", param, ctx)
        return [int(p) for p in parts]


DURATION = Duration()


# -- column values from text and JSON (put, get, delete) -------------------------------------------

_INT_RANGE = {"INT": (-(1 << 31), (1 << 31) - 1), "BIGINT": (-(1 << 63), (1 << 63) - 1)}
_INTEGER = re.compile(r"^\s*[+-]?\d+\s*$")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
#: Column types whose JSON form is not what the codec takes (text -> datetime / bytes).
_JSON_CONVERTED = ("TIMESTAMP", "BYTES")


def convert_value(value: Any, type_: str) -> Any:
    """A column value from a JSON value or command-line text -> what ``RowCodec.to_batch`` takes.

    BOOLEAN: true/false (or 1/0, yes/no as text); INT/BIGINT: an integer;
    DOUBLE: a number (text also NaN, inf); STRING: text; BYTES: base64 text;
    TIMESTAMP: ISO-8601 text (no zone = UTC) or integer microseconds since the epoch.
    Raises ValueError saying what was expected.
    """
    if value is None:
        return None
    text = isinstance(value, str)
    if type_ == "BOOLEAN":
        if isinstance(value, bool):
            return value
        if text and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
    elif type_ in _INT_RANGE:
        number = int(value) if text and _INTEGER.match(value) else value
        if isinstance(number, int) and not isinstance(number, bool):
            lo, hi = _INT_RANGE[type_]
            if not lo <= number <= hi:
                raise ValueError(f"{number} is out of range for {type_}")
            return number
    elif type_ == "DOUBLE":
        if text:
            try:
                return float(value)
            except ValueError:
                pass
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif type_ == "STRING":
        if text:
            return value
    elif type_ == "BYTES":
        if text:
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"expected base64 text for BYTES, got {value!r}") from None
    elif type_ == "TIMESTAMP":
        if text and _INTEGER.match(value):
            return int(value)
        if text:
            try:
                return datetime.fromisoformat(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"expected ISO-8601 text or integer microseconds for TIMESTAMP, got {value!r}")
    raise ValueError(f"expected {type_}, got {value!r}")


def parse_key(text: str, table: TableInfo) -> dict[str, Any]:
    """A ``KEY`` argument -> ``{primary-key column: value}``, typed by the columns.

    A one-column key is the text itself. A composite key is comma-separated
    values in primary-key order (``7,abc``) or a JSON array (``'[7, "a,b"]'``,
    for values that hold commas). Raises ValueError naming the column.
    """
    types = {c.name: c.type for c in table.columns}
    pk = table.primary_key
    if len(pk) == 1:
        parts: list[Any] = [text]
    elif text.lstrip().startswith("["):
        try:
            parts = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not a JSON array: {exc}") from None
        if not isinstance(parts, list):
            raise ValueError("not a JSON array")
    else:
        parts = text.split(",")
    if len(parts) != len(pk):
        raise ValueError(f"the primary key has {len(pk)} column(s) ({', '.join(pk)}), got {len(parts)} value(s) "
                         "(give them comma-separated or as a JSON array)")
    key = {}
    for name, part in zip(pk, parts):
        if part is None:
            raise ValueError(f"column {name!r}: a primary key value cannot be null")
        try:
            key[name] = convert_value(part, types[name])
        except ValueError as exc:
            raise ValueError(f"column {name!r}: {exc}") from None
    return key


def parse_keys(texts: Iterable[str], table: TableInfo) -> list[dict[str, Any]]:
    """Every KEY argument; a bad one is a usage error naming the key and the column."""
    keys = []
    for text in texts:
        try:
            keys.append(parse_key(text, table))
        except ValueError as exc:
            raise click.BadParameter(f"{text!r}: {exc}", param_hint="'KEY'") from None
    return keys


def parse_json_row(line: str, number: int, table: TableInfo) -> dict[str, Any]:
    """One JSON line of ``put`` -> a row for ``RowCodec.to_batch``; InvalidRowError names the line."""
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise errors.InvalidRowError(f"line {number}: not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise errors.InvalidRowError(f"line {number}: expected a JSON object (column -> value), "
                                     f"got {type(row).__name__}")
    for column in table.columns:
        if column.type in _JSON_CONVERTED and row.get(column.name) is not None:
            try:
                row[column.name] = convert_value(row[column.name], column.type)
            except ValueError as exc:
                raise errors.InvalidRowError(f"line {number}, column {column.name!r}: {exc}") from None
    return row


def _at_lines(message: str, lines: list[int]) -> str:
    """A codec message about ``row i`` of a batch, told as the input line of that row."""
    m = re.match(r"^row (\d+)(.*)$", message, re.S)
    if m and int(m.group(1)) < len(lines):
        return f"line {lines[int(m.group(1))]}{m.group(2)}"
    return f"lines {lines[0]}-{lines[-1]}: {message}"


# -- state shared by the commands ------------------------------------------------------------------


class State:
    """The global options; builds the admin client and the output once, on first use."""

    def __init__(self, cluster: str | None = None, bootstrap: str | None = None, json_mode: bool = False,
                 retry_timeout_ms: int | None = None, debug: bool = False) -> None:
        self.cluster = cluster
        self.bootstrap = bootstrap
        self.cluster_cmdline = False  # given on the command line (not through the environment)
        self.bootstrap_cmdline = False
        self.json_mode = json_mode
        self.retry_timeout_ms = retry_timeout_ms
        self.debug = debug
        self._client = None
        self._table_clients: list = []
        self._output: out.Output | None = None

    @property
    def output(self) -> out.Output:
        if self._output is None:
            self._output = out.make_output(self.json_mode)
        return self._output

    def addresses(self) -> list[str]:
        from client.admin import parse_bootstrap

        if self.bootstrap and (self.bootstrap_cmdline or not self.cluster_cmdline):
            return parse_bootstrap(self.bootstrap)
        if self.cluster:
            return local_cluster.bootstrap(self.cluster)
        raise errors.InvalidRequestError(
            "no cluster given: use --cluster DIR or --bootstrap HOST:PORT[,…] "
            "(or set KVLEASE_CLUSTER / KVLEASE_BOOTSTRAP)")

    def retry_ms(self, config: cfg.Config) -> int:
        if self.retry_timeout_ms is not None:
            return self.retry_timeout_ms
        if cfg.CLIENT_RETRY_TOTAL.env_var in os.environ:
            return config[cfg.CLIENT_RETRY_TOTAL]
        return cfg.parse_duration_ms(DEFAULT_RETRY_TIMEOUT)

    @property
    def client(self):
        if self._client is None:
            from client.admin import AdminClient

            config = cfg.Config(env=os.environ)
            self._client = AdminClient(self.addresses(), config, retry_total_s=self.retry_ms(config) / 1000.0)
        return self._client

    def table_client(self, path: str):
        """A :class:`client.table.TableClient` on ``path``, retrying as long as the admin client."""
        from client.table import TableClient

        config = cfg.Config(env=os.environ)
        client = TableClient(self.client, path, config, retry_total_s=self.retry_ms(config) / 1000.0)
        self._table_clients.append(client)
        return client

    def close(self) -> None:
        for table_client in self._table_clients:
            table_client.close()
        if self._client is not None:
            self._client.close()

    def table_names(self) -> dict[int, str]:
        return {info.table_id: info.path for info in self.client.list_tables()}


def _message(exc: BaseException, state: State | None) -> str:
    if isinstance(exc, errors.NetworkError):
        retry = state.retry_timeout_ms if state and state.retry_timeout_ms is not None else None
        waited = f"{retry / 1000:g}s" if retry is not None else DEFAULT_RETRY_TIMEOUT
        return f"{exc.message} (gave up after retrying for {waited}; is the cluster running?)"
    if isinstance(exc, errors.KvLeaseError):
        return exc.message
    return f"internal error: {type(exc).__name__}: {exc} (set KVLEASE_DEBUG=1 for a traceback)"


def catch_errors(func: Callable) -> Callable:
    """kvlease errors -> ``error: <message>`` on stderr and exit 1; never a traceback for them."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        state = ctx.find_object(State)
        try:
            return func(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:
            if state is not None and state.debug:
                traceback.print_exc()
            click.echo(f"error: {_message(exc, state)}", err=True)
            ctx.exit(1)

    return wrapper


def common_options(func: Callable) -> Callable:
    """``--json``, ``--cluster`` and ``--bootstrap`` on a command too, e.g. ``kvlease lease list --json``."""

    def setter(attr: str, flag: str | None = None):
        def callback(ctx: click.Context, param, value) -> None:
            if value:
                state = ctx.ensure_object(State)
                setattr(state, attr, value)
                if flag:
                    setattr(state, flag, True)
        return callback

    func = click.option("--json", "json_flag", is_flag=True, expose_value=False, callback=setter("json_mode"),
                        help="Print exactly one JSON document on stdout.")(func)
    func = click.option("--bootstrap", "bootstrap_opt", expose_value=False, metavar="HOST:PORT[,…]",
                        callback=setter("bootstrap", "bootstrap_cmdline"), help="Coordinator addresses.")(func)
    func = click.option("--cluster", "cluster_opt", expose_value=False, metavar="DIR",
                        callback=setter("cluster", "cluster_cmdline"), help="A local cluster directory.")(func)
    return func


def table_path(ctx, param, value: str | None) -> str | None:
    """``DB.NAME`` syntax check (usage error, exit 2)."""
    if value is None:
        return None
    try:
        parse_table_path(value)
    except errors.KvLeaseError as exc:
        raise click.BadParameter(exc.message, ctx, param) from None
    return value


# -- the group -----------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--cluster", "cluster_dir", envvar="KVLEASE_CLUSTER", metavar="DIR",
              help="A local cluster directory (made by `kvlease cluster start`). Env: KVLEASE_CLUSTER.")
@click.option("--bootstrap", envvar="KVLEASE_BOOTSTRAP", metavar="HOST:PORT[,…]",
              help="Coordinator addresses. Env: KVLEASE_BOOTSTRAP.")
@click.option("--json", "json_mode", is_flag=True, help="Print exactly one JSON document on stdout.")
@click.option("--retry-timeout", type=DURATION, envvar="KVLEASE_RETRY_TIMEOUT", metavar="DURATION",
              help=f"How long to retry an unreachable cluster (default {DEFAULT_RETRY_TIMEOUT}). "
                   "Env: KVLEASE_RETRY_TIMEOUT.")
@click.option("--debug", is_flag=True, envvar="KVLEASE_DEBUG", help="Show tracebacks of unexpected errors.")
@click.pass_context
def kvlease(ctx: click.Context, cluster_dir: str | None, bootstrap: str | None, json_mode: bool,
            retry_timeout: int | None, debug: bool) -> None:
    """kvlease: tables, KV snapshots and snapshot leases on a kvlease cluster."""
    state = State(cluster_dir, bootstrap, json_mode, retry_timeout, debug)
    state.cluster_cmdline = ctx.get_parameter_source("cluster_dir") == ParameterSource.COMMANDLINE
    state.bootstrap_cmdline = ctx.get_parameter_source("bootstrap") == ParameterSource.COMMANDLINE
    ctx.obj = state
    ctx.call_on_close(state.close)


pass_state = click.make_pass_decorator(State)


# -- cluster -------------------------------------------------------------------------------------


@kvlease.group("cluster")
def cluster_group() -> None:
    """Start, stop and inspect a local cluster in a directory."""


def _cluster_dir(state: State, directory: str | None) -> str:
    directory = directory or state.cluster
    if not directory:
        raise errors.InvalidRequestError("no cluster directory given: use --dir DIR (or --cluster DIR / KVLEASE_CLUSTER)")
    return directory


@cluster_group.command("start")
@click.option("--dir", "directory", metavar="D", help="Cluster directory (created if missing).")
@click.option("--zk-nodes", type=click.Choice(["1", "3"]), default="1", show_default=True,
              help="ZooKeeper ensemble size.")
@click.option("--coordinators", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--tablets", type=click.IntRange(min=0), default=0, show_default=True,
              help="Tablet servers (ids 1..N).")
@click.option("--remote", metavar="URI", help="remote.data.dir (default: file://D/remote).")
@click.option("--timeout", "timeout_ms", type=DURATION, default="60s", show_default=True,
              help="How long to wait for an active coordinator.")
@common_options
@pass_state
@catch_errors
def cluster_start(state: State, directory: str | None, zk_nodes: str, coordinators: int, tablets: int,
                  remote: str | None, timeout_ms: int) -> None:
    """Start ZooKeeper, coordinators and tablet servers in the background; returns once a
    coordinator is active and every tablet server is registered."""
    directory = _cluster_dir(state, directory)
    if remote and not remote.startswith(("file:///", "s3://")):
        raise click.BadParameter(f"{remote!r} is not file:///PATH or s3://BUCKET/PREFIX", param_hint="'--remote'")
    local_cluster.start(directory, zk_nodes=int(zk_nodes), coordinators=coordinators, tablets=tablets,
                        remote=remote, ready_timeout_s=timeout_ms / 1000.0,
                        progress=lambda text: click.echo(f"{text} …", err=True))
    state.output.cluster_status(local_cluster.status(directory))
    if not state.json_mode:
        click.echo(f"cluster running; use it with: kvlease --cluster {directory} …", err=True)


@cluster_group.command("stop")
@click.option("--dir", "directory", metavar="D", help="Cluster directory.")
@common_options
@pass_state
@catch_errors
def cluster_stop(state: State, directory: str | None) -> None:
    """Stop every process of the cluster (tablet servers, coordinators, then ZooKeeper)."""
    directory = _cluster_dir(state, directory)
    result = local_cluster.stop(directory)
    text = (f"stopped {len(result['stopped'])} process(es) in {directory}" if result["stopped"]
            else f"the cluster in {directory} was already stopped")
    state.output.message(text, result)


@cluster_group.command("status")
@click.option("--dir", "directory", metavar="D", help="Cluster directory.")
@common_options
@pass_state
@catch_errors
def cluster_status(state: State, directory: str | None) -> None:
    """Which processes run, which coordinator is active, how many buckets each tablet server leads."""
    state.output.cluster_status(local_cluster.status(_cluster_dir(state, directory)))


# -- tables ----------------------------------------------------------------------------------------


@kvlease.group("table")
def table_group() -> None:
    """Create, list, describe and drop tables."""


@table_group.command("create")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--schema", required=True, help='Columns, e.g. "id BIGINT, name STRING".')
@click.option("--primary-key", required=True, metavar="COL[,COL…]", help="Primary key column(s).")
@click.option("--buckets", type=click.IntRange(min=1), required=True, help="Number of buckets.")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the table exists already.")
@common_options
@pass_state
@catch_errors
def table_create(state: State, path: str, schema: str, primary_key: str, buckets: int, if_not_exists: bool) -> None:
    """Create a primary-key table."""
    try:
        columns = parse_schema(schema)
    except errors.KvLeaseError as exc:
        raise click.BadParameter(exc.message, param_hint="'--schema'") from None
    keys = [k.strip() for k in primary_key.split(",") if k.strip()]
    info = state.client.create_table(path, columns, keys, buckets, ignore_if_exists=if_not_exists)
    state.output.message(f"created table {info.path} (id {info.table_id}, {info.buckets} buckets)", out.table_doc(info))


@table_group.command("list")
@click.option("--database", default="", metavar="DB", help="Only this database.")
@common_options
@pass_state
@catch_errors
def table_list(state: State, database: str) -> None:
    """List tables."""
    state.output.tables(out.tables_doc(state.client.list_tables(database)))


@table_group.command("describe")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@common_options
@pass_state
@catch_errors
def table_describe(state: State, path: str) -> None:
    """Show a table's schema, primary key and buckets."""
    state.output.table(out.table_doc(state.client.get_table(path)))


@table_group.command("drop")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--if-exists", is_flag=True, help="Succeed if there is no such table.")
@common_options
@pass_state
@catch_errors
def table_drop(state: State, path: str, if_exists: bool) -> None:
    """Drop a table, its snapshots, and its buckets in every lease."""
    state.client.drop_table(path, ignore_if_not_exists=if_exists)
    state.output.message(f"dropped table {path}", {"table": path, "dropped": True})


# -- rows ------------------------------------------------------------------------------------------------


@kvlease.command("put")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("source", metavar="[FILE|-]", type=click.File("r", encoding="utf-8"), default="-")
@click.option("--batch-size", type=click.IntRange(min=1), default=PUT_BATCH_ROWS, show_default=True,
              help="Rows per write (each write is one request per bucket).")
@common_options
@pass_state
@catch_errors
def put(state: State, path: str, source: TextIO, batch_size: int) -> None:
    """Upsert rows from JSON lines (one object per line: column -> value) in FILE or stdin.

    BYTES values are base64 text, TIMESTAMP values ISO-8601 text (UTC) or
    integer microseconds. A bad line stops the command: nothing of its batch
    is written (earlier batches are).
    """
    client = state.table_client(path)
    table = client.table
    written, rows, lines = 0, [], []
    show_progress = not state.json_mode and sys.stderr.isatty()

    def flush() -> int:
        try:
            batch = client.codec.to_batch(rows)
        except errors.InvalidRowError as exc:
            raise errors.InvalidRowError(f"{_at_lines(exc.message, lines)} (nothing of lines {lines[0]}-{lines[-1]} "
                                         f"was written; {written} row(s) before them were)") from None
        try:
            client.upsert(batch)
        except errors.KvLeaseError as exc:
            exc.message = f"{exc.message} (writing lines {lines[0]}-{lines[-1]}; {written} row(s) before them " \
                          "were written)"
            raise
        return len(rows)

    for number, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            rows.append(parse_json_row(line, number, table))
        except errors.InvalidRowError as exc:
            exc.message += f" ({written} row(s) before line {lines[0] if lines else number} were written)"
            raise
        lines.append(number)
        if len(rows) >= batch_size:
            written += flush()
            rows, lines = [], []
            if show_progress:
                click.echo(f"{written} rows written …", err=True)
    if rows:
        written += flush()
    state.output.message(f"wrote {written} row(s) to {table.path}", {"table": table.path, "rows": written})


def _key_command(ctx_settings: dict | None = None):
    """``DB.NAME KEY…`` commands; keys may start with '-' (negative numbers)."""
    return kvlease.command(context_settings={"ignore_unknown_options": True, **(ctx_settings or {})})


@_key_command()
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("keys", metavar="KEY…", nargs=-1, required=True)
@common_options
@pass_state
@catch_errors
def get(state: State, path: str, keys: tuple[str, ...]) -> None:
    """Look up rows by primary key.

    KEY is the primary-key value; for a composite key, the values in
    primary-key order comma-separated (7,abc) or as a JSON array ('[7,"a,b"]').
    """
    client = state.table_client(path)
    rows = client.lookup(parse_keys(keys, client.table))
    state.output.rows(out.rows_doc(client.table.path, keys, rows))


@_key_command()
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.argument("keys", metavar="KEY…", nargs=-1, required=True)
@common_options
@pass_state
@catch_errors
def delete(state: State, path: str, keys: tuple[str, ...]) -> None:
    """Delete rows by primary key (KEY as for `get`); missing keys are ignored."""
    client = state.table_client(path)
    offsets = client.delete(parse_keys(keys, client.table))
    deleted = sum(end - base for base, end in offsets.values())  # one -D record per deleted row
    text = f"deleted {deleted} row(s) from {client.table.path}"
    if deleted < len(keys):
        text += f" ({len(keys) - deleted} key(s) had no row)"
    state.output.message(text, {"table": client.table.path, "keys": len(keys), "deleted": deleted})


@kvlease.command("log")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--bucket", type=click.IntRange(min=0), required=True, help="The bucket whose changelog to read.")
@click.option("--from", "from_offset", type=click.IntRange(min=0), metavar="N",
              help="First offset (default: the earliest kept).")
@click.option("--follow", is_flag=True, help="Keep polling for new records until Ctrl-C.")
@click.option("--poll-interval", type=DURATION, default="500ms", show_default=True, metavar="DURATION",
              help="How often --follow asks for new records.")
@common_options
@pass_state
@catch_errors
def log_command(state: State, path: str, bucket: int, from_offset: int | None, follow: bool,
                poll_interval: int) -> None:
    """Print a bucket's change records as JSON lines {offset, change_type, row}.

    change_type is +I (insert), -U / +U (update: before / after image) or -D
    (delete: the deleted row). Without --follow it stops at the end of the log;
    with --json it prints one document instead (not with --follow).
    """
    if follow and state.json_mode:
        raise click.UsageError("--json prints one document; it cannot be combined with --follow")
    client = state.table_client(path)
    if bucket >= client.table.buckets:
        raise errors.BucketOutOfRangeError(f"table {client.table.path} has buckets 0..{client.table.buckets - 1}, "
                                           f"not {bucket}")
    offset = from_offset if from_offset is not None else client.list_offsets([bucket])[bucket][0]
    start, stop_at, collected = offset, None, []
    try:
        while True:
            records, end = client.fetch_log(bucket, offset)
            if stop_at is None:
                stop_at = end
            for record in records:
                doc = out.log_record_doc(record)
                if state.json_mode:
                    collected.append(doc)
                else:
                    click.echo(json.dumps(doc))
            if records:
                offset = records[-1]["offset"] + 1
                sys.stdout.flush()
            if not follow and (offset >= stop_at or not records):
                break
            if follow and not records:
                time.sleep(poll_interval / 1000.0)
    except KeyboardInterrupt:  # the way to end --follow
        return
    except BrokenPipeError:  # e.g. piped into head
        sys.stderr.close()
        return
    if state.json_mode:
        state.output.document({"table": client.table.path, "bucket": bucket, "from_offset": start,
                               "log_end_offset": stop_at, "records": collected})


@kvlease.command("scan")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--bucket", type=click.IntRange(min=0), metavar="B", help="Scan only this bucket.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="At most N rows in all.")
@common_options
@pass_state
@catch_errors
def scan_command(state: State, path: str, bucket: int | None, limit: int | None) -> None:
    """Read the live rows of a table (every bucket, or --bucket B) from its leaders.

    Each bucket is read from one consistent snapshot, taken when its scan
    opens; the output names per bucket the first changelog offset that is not
    in the rows (`kvlease log --from N` continues from there). Buckets are
    read in parallel; with --limit one after another until N rows.
    """
    client = state.table_client(path)
    table = client.table
    if bucket is not None and bucket >= table.buckets:
        raise errors.BucketOutOfRangeError(f"table {table.path} has buckets 0..{table.buckets - 1}, not {bucket}")
    buckets = None if bucket is None else [bucket]
    progress = out.ScanProgress(1 if bucket is not None else table.buckets) if sys.stderr.isatty() else None
    try:
        result = client.scan(limit=limit, buckets=buckets, on_batch=progress)
    finally:
        if progress is not None:
            progress.close()
    state.output.scan(out.scan_doc(table.path, result.rows, result.log_offsets))


# -- snapshots ---------------------------------------------------------------------------------------


@kvlease.group("snapshot")
def snapshot_group() -> None:
    """Completed KV snapshots."""


@snapshot_group.command("list")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@common_options
@pass_state
@catch_errors
def snapshot_list(state: State, path: str) -> None:
    """Every kept snapshot of every bucket, with the leases that hold it."""
    info = state.client.get_table(path)
    state.output.snapshots(out.snapshots_doc(info.path, state.client.list_kv_snapshots(info.table_id)))


@snapshot_group.command("trigger")
@click.argument("path", metavar="DB.NAME", callback=table_path)
@click.option("--wait", is_flag=True, help="Wait until the snapshots are committed, and list them.")
@common_options
@pass_state
@catch_errors
def snapshot_trigger(state: State, path: str, wait: bool) -> None:
    """Snapshot every bucket that changed since its last snapshot, now."""
    client = state.table_client(path)
    committed = client.trigger_snapshot(wait=wait)
    state.output.committed(out.committed_doc(client.table.path, committed, wait))


# -- leases --------------------------------------------------------------------------------------------


@kvlease.group("lease")
def lease_group() -> None:
    """KV snapshot leases: keep snapshots from being deleted while they are read."""


@lease_group.command("acquire")
@click.argument("lease_id")
@click.option("--table", "path", required=True, metavar="DB.NAME", callback=table_path)
@click.option("--snapshot", "snapshots", type=BucketSnapshot(), multiple=True,
              help="Bucket and snapshot to hold, B=ID; repeat for more buckets.")
@click.option("--latest", is_flag=True, help="Hold the latest snapshot of every bucket.")
@click.option("--duration", type=DURATION, required=True, help="Lease duration from now, e.g. 10m.")
@common_options
@pass_state
@catch_errors
def lease_acquire(state: State, lease_id: str, path: str, snapshots: tuple[tuple[int, int], ...], latest: bool,
                  duration: int) -> None:
    """Create or update a lease on snapshots of a table."""
    if bool(snapshots) == latest:
        raise click.UsageError("give either --snapshot B=ID (one or more) or --latest")
    buckets_seen = [b for b, _ in snapshots]
    if len(set(buckets_seen)) != len(buckets_seen):
        raise click.BadParameter("a bucket is named twice", param_hint="'--snapshot'")
    info = state.client.get_table(path)
    no_snapshot: list[TableBucket] = []
    if latest:
        latest_snapshots = state.client.get_latest_kv_snapshots(info.table_id)
        wanted = {tb: s.snapshot_id for tb, s in latest_snapshots.items()}
        no_snapshot = [TableBucket(info.table_id, b) for b in range(info.buckets)
                       if TableBucket(info.table_id, b) not in wanted]
        if not wanted:
            raise errors.SnapshotNotFoundError(f"table {info.path} has no snapshot in any bucket yet; nothing to lease")
    else:
        wanted = {TableBucket(info.table_id, b): sid for b, sid in snapshots}
    result = state.client.acquire_lease(lease_id, wanted, duration)
    names = {info.table_id: info.path}
    state.output.acquired(out.acquire_doc(result.lease_id, result.expiration_time, result.acquired,
                                          result.unavailable, names, no_snapshot))


@lease_group.command("renew")
@click.argument("lease_id")
@click.option("--duration", type=DURATION, required=True, help="New duration from now, e.g. 10m.")
@common_options
@pass_state
@catch_errors
def lease_renew(state: State, lease_id: str, duration: int) -> None:
    """Move a lease's expiration to now + duration (never creates a lease)."""
    expiration = state.client.renew_lease(lease_id, duration)
    state.output.message(f"lease {lease_id} expires {out.format_time_ms(expiration)}",
                         {"lease_id": lease_id, "expiration_time": expiration})


@lease_group.command("release")
@click.argument("lease_id")
@click.option("--table", "path", required=True, metavar="DB.NAME", callback=table_path)
@click.option("--bucket", "buckets", type=BucketList(), multiple=True, required=True,
              help="Bucket(s) to free: repeat, or B,B,….")
@common_options
@pass_state
@catch_errors
def lease_release(state: State, lease_id: str, path: str, buckets: tuple[list[int], ...]) -> None:
    """Free some buckets of a lease; a lease left empty disappears."""
    info = state.client.get_table(path)
    numbers = sorted({b for group in buckets for b in group})
    remains = state.client.release_lease(lease_id, [TableBucket(info.table_id, b) for b in numbers])
    text = f"released {info.path} bucket(s) {', '.join(map(str, numbers))} from lease {lease_id}"
    text += "" if remains else f"; lease {lease_id} holds nothing more and is gone"
    state.output.message(text, {"lease_id": lease_id, "table": info.path, "released": numbers,
                                "lease_remains": remains})


@lease_group.command("drop")
@click.argument("lease_id")
@common_options
@pass_state
@catch_errors
def lease_drop(state: State, lease_id: str) -> None:
    """Free every bucket of a lease (release all)."""
    dropped = state.client.drop_lease(lease_id)
    text = f"dropped lease {lease_id}" if dropped else f"no lease {lease_id} (nothing to drop)"
    state.output.message(text, {"lease_id": lease_id, "dropped": dropped})


@lease_group.command("list")
@common_options
@pass_state
@catch_errors
def lease_list(state: State) -> None:
    """Every lease, with its deadline and buckets."""
    leases = state.client.list_leases()
    names = state.table_names() if leases else {}
    state.output.leases(out.leases_doc(leases, names))


@lease_group.command("describe")
@click.argument("lease_id")
@common_options
@pass_state
@catch_errors
def lease_describe(state: State, lease_id: str) -> None:
    """One lease: its deadline and the snapshot it holds per bucket."""
    lease = state.client.describe_lease(lease_id)
    state.output.lease(out.lease_doc(lease, state.table_names()))


# -- demo, benchmarks and drills ------------------------------------------------------------------------


@kvlease.command("demo")
@catch_errors
def demo() -> None:
    """Run the end-to-end demo."""
    click.echo("kvlease demo: not yet implemented (comes with the operations issue)")


def _plugins(prefix: str) -> list[str]:
    import ops

    return sorted(m.name[len(prefix):] for m in pkgutil.iter_modules(ops.__path__) if m.name.startswith(prefix))


def _load_plugin(kind: str, prefix: str, name: str):
    if not PLUGIN_NAME.match(name):
        raise click.BadParameter(f"{name!r} is not a {kind} name (lower-case letters, digits, _)",
                                 param_hint="'NAME'")
    module_name = f"ops.{prefix}{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        known = ", ".join(_plugins(prefix)) or "none yet"
        raise errors.InvalidRequestError(f"unknown {kind} {name!r} (available: {known})") from None


@kvlease.command("bench")
@click.argument("name")
@common_options
@pass_state
@catch_errors
def bench(state: State, name: str) -> None:
    """Run the benchmark ops/bench_NAME.py."""
    code = _load_plugin("benchmark", "bench_", name).main(json_output=state.json_mode)
    if isinstance(code, int) and code:
        click.get_current_context().exit(code)


@kvlease.command("drill")
@click.argument("name")
@click.option("--dir", "directory", metavar="D", help="Cluster directory (default: --cluster).")
@common_options
@pass_state
@catch_errors
def drill(state: State, name: str, directory: str | None) -> None:
    """Run the failure drill ops/drill_NAME.py against a local cluster."""
    module = _load_plugin("drill", "drill_", name)
    code = module.main(_cluster_dir(state, directory), json_output=state.json_mode)
    if isinstance(code, int) and code:
        click.get_current_context().exit(code)


def main(argv: Iterable[str] | None = None) -> None:
    """Console-script entry point."""
    kvlease.main(args=list(argv) if argv is not None else None, prog_name="kvlease")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
