"""The kvlease CLI without a cluster: usage errors, error messages, JSON documents.

Commands that need a coordinator run against a fake AdminClient (same method
names and return types as client.admin.AdminClient).
"""

from __future__ import annotations

import io
import json
import math
import socket
import types
from datetime import datetime

import pytest
from click.testing import CliRunner
from rich.console import Console

import client.admin as admin
from common import errors
from common.tables import Column, TableInfo
from common.model import Lease, SnapshotHandle, TableBucket
from ops.cli import data, kvlease, values
from ops import output as out
from ops.cli.app import State
from common.codec import RowCodec

pytestmark = pytest.mark.unit

NO_ENV = {"KVLEASE_CLUSTER": None, "KVLEASE_BOOTSTRAP": None, "KVLEASE_RETRY_TIMEOUT": None,
          "KVLEASE_DEBUG": None, "KVLEASE_CLIENT_RETRY_TOTAL_TIMEOUT": None}


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(kvlease, list(args), env={**NO_ENV, **(env or {})}, prog_name="kvlease")


def assert_one_line_error(result, code: int = 1) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- usage and connection errors -------------------------------------------------------------


def test_no_cluster_given_is_a_one_line_error():
    message = assert_one_line_error(run("lease", "list"))
    assert "--cluster" in message and "--bootstrap" in message


def test_cluster_dir_without_cluster_json(tmp_path):
    message = assert_one_line_error(run("--cluster", str(tmp_path), "table", "list"))
    assert "cluster.json" in message


@pytest.mark.parametrize("spec", ["x", "0", "0=", "=1", "a=1", "0=-1", "0:1"])
def test_bad_snapshot_syntax_is_a_usage_error(spec):
    result = run("--bootstrap", "127.0.0.1:1", "lease", "acquire", "L1", "--table", "db.t",
                 "--snapshot", spec, "--duration", "10m")
    assert result.exit_code == 2
    assert "--snapshot" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("args", [
    ("lease", "acquire", "L1", "--table", "db.t", "--snapshot", "0=1", "--duration", "ten minutes"),
    ("lease", "renew", "L1", "--duration", "10q"),
    ("lease", "renew", "L1", "--duration", "-5s"),
])
def test_bad_duration_is_a_usage_error(args):
    result = run("--bootstrap", "127.0.0.1:1", *args)
    assert result.exit_code == 2
    assert "--duration" in result.stderr and "not a duration" in result.stderr


@pytest.mark.parametrize("args", [
    ("lease", "acquire", "L1", "--table", "db.t", "--duration", "1m"),  # neither --snapshot nor --latest
    ("lease", "acquire", "L1", "--table", "db.t", "--latest", "--snapshot", "0=1", "--duration", "1m"),
    ("lease", "acquire", "L1", "--table", "db.t", "--snapshot", "0=1", "--snapshot", "0=2", "--duration", "1m"),
    ("lease", "acquire", "L1", "--table", "nodot", "--latest", "--duration", "1m"),
    ("lease", "release", "L1", "--table", "db.t", "--bucket", "x"),
    ("lease", "release", "L1", "--table", "db.t"),
    ("table", "create", "db.t", "--schema", "id", "--primary-key", "id", "--buckets", "1"),
    ("table", "create", "db.t", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "0"),
    ("table", "describe", "a.b.c"),
    ("bench", "Bad-Name"),
    ("cluster", "start", "--dir", "/nonexistent/kv", "--remote", "hdfs://x"),
    ("cluster", "start", "--dir", "/nonexistent/kv", "--zk-nodes", "2"),
])
def test_usage_errors_exit_2(args):
    result = run("--bootstrap", "127.0.0.1:1", *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_unreachable_bootstrap_names_the_address():
    address = f"127.0.0.1:{closed_port()}"
    message = assert_one_line_error(run("--bootstrap", address, "--retry-timeout", "500ms", "table", "list"))
    assert f"cannot reach coordinator {address}" in message


def test_retry_timeout_from_env_and_options_after_the_command():
    address = f"127.0.0.1:{closed_port()}"
    result = run("lease", "list", "--bootstrap", address, "--json", env={"KVLEASE_RETRY_TIMEOUT": "300ms"})
    assert f"cannot reach coordinator {address}" in assert_one_line_error(result)


def test_demo_and_unknown_bench():
    result = run("demo")
    assert result.exit_code == 0 and "not yet implemented" in result.stdout
    assert "unknown benchmark 'nosuch'" in assert_one_line_error(run("bench", "nosuch"))
    assert "unknown drill 'nosuch'" in assert_one_line_error(run("drill", "nosuch", "--cluster", "/tmp"))


def test_bench_dispatch(monkeypatch):
    calls = []
    module = types.ModuleType("ops.bench_fake")
    module.main = lambda json_output: calls.append(json_output) or 0
    monkeypatch.setitem(__import__("sys").modules, "ops.bench_fake", module)
    assert run("bench", "fake", "--json").exit_code == 0
    assert run("bench", "fake").exit_code == 0
    assert calls == [True, False]
    module.main = lambda json_output: {"rows_per_s": 5}  # figures, not an exit code
    assert run("bench", "fake").exit_code == 0
    module.main = lambda json_output: 3
    assert run("bench", "fake").exit_code == 3


def test_cluster_start_rejects_tablets_it_cannot_start(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tablet.__main__" else
                        real(name, *a))
    message = assert_one_line_error(run("cluster", "start", "--dir", str(tmp_path), "--tablets", "2"))
    assert "tablet" in message and "--tablets 0" in message
    assert not (tmp_path / "cluster.json").exists()


def test_cluster_commands_need_a_directory():
    assert "--dir" in assert_one_line_error(run("cluster", "status"))


def test_address_precedence(tmp_path):
    (tmp_path / "cluster.json").write_text(json.dumps({"coordinators": [{"address": "127.0.0.1:7001"}]}))
    state = State(cluster=str(tmp_path), bootstrap="127.0.0.1:9,127.0.0.1:10")
    assert state.addresses() == ["127.0.0.1:9", "127.0.0.1:10"]  # both from env: bootstrap wins
    state.cluster_cmdline = True
    assert state.addresses() == ["127.0.0.1:7001"]  # --cluster beats KVLEASE_BOOTSTRAP
    state.bootstrap_cmdline = True
    assert state.addresses() == ["127.0.0.1:9", "127.0.0.1:10"]


# -- output ---------------------------------------------------------------------------------------


def test_json_output_prints_exactly_one_document():
    stream = io.StringIO()
    output = out.JsonOutput(stream)
    output.leases({"leases": []})
    assert json.loads(stream.getvalue()) == {"leases": []}
    assert stream.getvalue().count("\n") == 1
    with pytest.raises(RuntimeError):
        output.message("again")


def test_documents_match_the_design():
    names = {7: "db.t"}
    tb0, tb1 = TableBucket(7, 0), TableBucket(7, 1)
    doc = out.acquire_doc("L1", 1_700_000_000_000, {tb0: 3}, {tb1: 4}, names)
    assert doc == {"lease_id": "L1", "expiration_time": 1_700_000_000_000,
                   "acquired": [{"table": "db.t", "bucket": 0, "snapshot_id": 3}],
                   "unavailable": [{"table": "db.t", "bucket": 1, "snapshot_id": 4}]}
    lease = Lease("L1", 5, {tb1: 4, tb0: 3, TableBucket(8, 0): 1})
    assert out.lease_doc(lease, names) == {"lease_id": "L1", "expiration_time": 5, "buckets": [
        {"table": "db.t", "bucket": 0, "snapshot_id": 3}, {"table": "db.t", "bucket": 1, "snapshot_id": 4},
        {"table": "#8", "bucket": 0, "snapshot_id": 1}]}
    assert out.leases_doc([lease], names)["leases"][0]["lease_id"] == "L1"
    snap = admin.SnapshotInfo(SnapshotHandle(tb0, 3, 10, "kv/7/0/snap-3/_METADATA"), ("L1",), True)
    assert out.snapshots_doc("db.t", [snap]) == {"table": "db.t", "snapshots": [
        {"bucket": 0, "snapshot_id": 3, "log_offset": 10, "leased_by": ["L1"], "retained": True}]}


def test_text_output_renders_every_document():
    buffer = io.StringIO()
    output = out.TextOutput(Console(file=buffer, width=120))
    info = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("name", "STRING")), ("id",), 2, 1)
    output.tables(out.tables_doc([info]))
    output.table(out.table_doc(info))
    output.acquired(out.acquire_doc("L1", 1, {TableBucket(7, 0): 3}, {TableBucket(7, 1): 4}, {7: "db.t"},
                                    [TableBucket(7, 2)]))
    output.leases(out.leases_doc([Lease("L1", 1, {TableBucket(7, 0): 3})], {7: "db.t"}))
    output.cluster_status({"zookeeper": [{"id": "1", "pid": 1, "address": "a", "alive": True}],
                           "coordinators": [{"id": "1", "pid": 2, "address": "b", "active": True, "epoch": 3,
                                             "alive": True}], "tablets": []})
    output.acquired(out.acquire_doc("L2", 0, {}, {TableBucket(7, 1): 4}, {7: "db.t"}))
    text = buffer.getvalue()
    for expected in ("db.t", "BIGINT", "L1", "unavailable", "no snapshot", "active (epoch 3)", "L2 holds nothing"):
        assert expected in text


# -- commands against a fake admin client ------------------------------------------------------------


class FakeAdmin:
    """Just enough of AdminClient: one table db.t (id 7, 3 buckets)."""

    info = TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 3)

    def __init__(self, bootstrap, config=None, **kwargs):
        self.bootstrap = admin.parse_bootstrap(bootstrap)
        self.leases: dict[str, Lease] = {}

    def close(self):
        pass

    def get_table(self, path):
        if path != "db.t":
            raise errors.TableNotExistError(f"table {path} does not exist")
        return self.info

    def list_tables(self, database=""):
        return [self.info]

    def get_latest_kv_snapshots(self, table_id):
        handle = SnapshotHandle(TableBucket(7, 0), 5, 10, "m")
        return {handle.bucket: admin.SnapshotInfo(handle)}

    def acquire_lease(self, lease_id, snapshots, duration_ms):
        acquired = {tb: sid for tb, sid in snapshots.items() if tb.bucket == 0}
        unavailable = {tb: sid for tb, sid in snapshots.items() if tb.bucket != 0}
        self.leases[lease_id] = Lease(lease_id, 1000 + duration_ms, acquired)
        return admin.AcquireResult(lease_id, 1000 + duration_ms, acquired, unavailable)

    def renew_lease(self, lease_id, duration_ms):
        raise errors.LeaseNotFoundError(f"lease {lease_id} not found")

    def release_lease(self, lease_id, buckets):
        self.released = list(buckets)
        return False


@pytest.fixture
def fake_admin(monkeypatch):
    monkeypatch.setattr(admin, "AdminClient", FakeAdmin)


def test_acquire_json(fake_admin):
    result = run("--bootstrap", "127.0.0.1:1", "lease", "acquire", "L1", "--table", "db.t",
                 "--snapshot", "0=5", "--snapshot", "1=9", "--duration", "10m", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc == {"lease_id": "L1", "expiration_time": 601_000,
                   "acquired": [{"table": "db.t", "bucket": 0, "snapshot_id": 5}],
                   "unavailable": [{"table": "db.t", "bucket": 1, "snapshot_id": 9}]}


def test_acquire_latest_reports_buckets_without_snapshot(fake_admin):
    result = run("--bootstrap", "127.0.0.1:1", "--json", "lease", "acquire", "L1", "--table", "db.t",
                 "--latest", "--duration", "1m")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["acquired"] == [{"table": "db.t", "bucket": 0, "snapshot_id": 5}]
    assert doc["no_snapshot"] == [{"table": "db.t", "bucket": 1}, {"table": "db.t", "bucket": 2}]


def test_server_errors_are_one_line(fake_admin):
    assert "lease L9 not found" in assert_one_line_error(
        run("--bootstrap", "127.0.0.1:1", "lease", "renew", "L9", "--duration", "1m"))
    assert "table db.nope does not exist" in assert_one_line_error(
        run("--bootstrap", "127.0.0.1:1", "lease", "release", "L9", "--table", "db.nope", "--bucket", "0"))


def test_release_accepts_repeated_and_comma_separated_buckets(fake_admin):
    result = run("--bootstrap", "127.0.0.1:1", "lease", "release", "L1", "--table", "db.t",
                 "--bucket", "2", "--bucket", "0,1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"lease_id": "L1", "table": "db.t", "released": [0, 1, 2],
                                         "lease_remains": False}


# -- data commands: keys, JSON lines, put/get/delete/log/snapshot trigger on a fake table client -------------

WIDE = TableInfo(9, "db", "w", (Column("id", "BIGINT"), Column("name", "STRING"), Column("ts", "TIMESTAMP"),
                                Column("b", "BYTES"), Column("ok", "BOOLEAN"), Column("d", "DOUBLE")), ("id",), 2)
PAIR = TableInfo(10, "db", "p", (Column("a", "INT"), Column("s", "STRING"), Column("v", "STRING")), ("a", "s"), 2)


@pytest.mark.parametrize("text, table, expected", [
    ("-5", WIDE, {"id": -5}),
    (" 12 ", WIDE, {"id": 12}),
    ("7,abc", PAIR, {"a": 7, "s": "abc"}),
    ('[7, "a,b"]', PAIR, {"a": 7, "s": "a,b"}),
    ('["7", "x"]', PAIR, {"a": 7, "s": "x"}),
    ("7,", PAIR, {"a": 7, "s": ""}),
])
def test_parse_key(text, table, expected):
    assert values.parse_key(text, table) == expected


@pytest.mark.parametrize("text, table, message", [
    ("abc", WIDE, "column 'id': expected BIGINT, got 'abc'"),
    ("1.5", WIDE, "column 'id': expected BIGINT"),
    ("9223372036854775808", WIDE, "out of range for BIGINT"),
    ("7", PAIR, "2 column(s) (a, s), got 1"),
    ("1,2,3", PAIR, "got 3 value(s)"),
    ("2147483648,x", PAIR, "column 'a': 2147483648 is out of range for INT"),
    ("[7, null]", PAIR, "column 's': a primary key value cannot be null"),
    ("[7, x", PAIR, "not a JSON array"),
])
def test_parse_key_errors_name_the_column(text, table, message):
    with pytest.raises(ValueError) as info:
        values.parse_key(text, table)
    assert message in str(info.value)


def test_convert_value_by_type():
    assert values.convert_value("true", "BOOLEAN") is True and values.convert_value(False, "BOOLEAN") is False
    assert values.convert_value("2024-01-02T03:04:05", "TIMESTAMP") == datetime(2024, 1, 2, 3, 4, 5)
    assert values.convert_value("1700000000000000", "TIMESTAMP") == 1_700_000_000_000_000
    assert values.convert_value("aGk=", "BYTES") == b"hi"
    assert values.convert_value(3, "DOUBLE") == 3.0 and math.isnan(values.convert_value("nan", "DOUBLE"))
    for value, type_ in (("maybe", "BOOLEAN"), (True, "BIGINT"), ("x", "DOUBLE"), (5, "STRING"),
                         ("not base64!", "BYTES"), ("yesterday", "TIMESTAMP")):
        with pytest.raises(ValueError):
            values.convert_value(value, type_)


def test_json_values_of_rows():
    doc = out.rows_doc("db.w", ["1", "2"], [
        {"id": 1, "ts": datetime(2024, 1, 2, 3, 4, 5), "b": b"hi", "d": float("nan"), "e": float("-inf")}, None])
    assert doc == {"table": "db.w", "keys": ["1", "2"], "found": 1, "rows": [
        {"id": 1, "ts": "2024-01-02T03:04:05", "b": "aGk=", "d": "NaN", "e": "-Infinity"}, None]}
    json.dumps(doc, allow_nan=False)


class FakeTableClient:
    """Records writes; lookups answer from what was written."""

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self.codec = RowCodec(table)
        self.upserts: list[list[dict]] = []
        self.rows: dict[tuple, dict] = {}
        self.records = [{"offset": i, "change_type": "+I", "row": {"id": i, "name": f"n{i}"}} for i in range(5)]
        self.fetches: list[int] = []

    def _key(self, row):
        return tuple(row[k] for k in self.table.primary_key)

    def upsert(self, rows):
        batch = rows if isinstance(rows, list) else rows.to_pylist()
        self.upserts.append(batch)
        for row in batch:
            self.rows[self._key(row)] = row
        return {0: (0, len(batch))}

    def lookup(self, keys):
        return [self.rows.get(self._key(k)) for k in keys]

    def delete(self, keys):
        gone = [self.rows.pop(self._key(k), None) for k in keys]
        return {0: (10, 10 + sum(g is not None for g in gone))}

    def list_offsets(self, buckets=None):
        return {b: (2, 5) for b in buckets}

    def fetch_log(self, bucket, from_offset, max_bytes=0):
        self.fetches.append(from_offset)
        return self.records[from_offset:from_offset + 2], 5

    def trigger_snapshot(self, wait=True):
        return [(1, 4, 5), (0, 3, 7)] if wait else []

    def close(self):
        pass


@pytest.fixture
def fake_table(monkeypatch):
    clients = {}

    def table_client(self, path):
        table = {"db.w": WIDE, "db.p": PAIR}.get(path)
        if table is None:
            raise errors.TableNotExistError(f"table {path} does not exist")
        return clients.setdefault(path, FakeTableClient(table))

    monkeypatch.setattr(State, "table_client", table_client)
    return clients


def run_in(*args: str, input: str | None = None):
    return CliRunner().invoke(kvlease, ["--bootstrap", "127.0.0.1:1", *args], input=input, env=NO_ENV,
                              prog_name="kvlease")


def test_put_reads_json_lines_in_batches(fake_table, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1, "name": "a", "ts": "2024-01-02T03:04:05", "b": "aGk="}\n\n{"id": 2}\n'
                    '{"id": 3, "ok": true, "d": 1}\n')
    result = run_in("put", "db.w", str(path), "--batch-size", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"table": "db.w", "rows": 3}
    client = fake_table["db.w"]
    assert [len(b) for b in client.upserts] == [2, 1]
    assert client.rows[(1,)]["ts"] == datetime(2024, 1, 2, 3, 4, 5) and client.rows[(1,)]["b"] == b"hi"
    result = run_in("put", "db.w", input='{"id": 4}\n')  # stdin
    assert result.exit_code == 0 and "wrote 1 row(s) to db.w" in result.stdout


@pytest.mark.parametrize("lines, message, written", [
    (['{"id": 1}', '{"id": 2}', '{"id": "x"}'], "line 3, column 'id': expected BIGINT, got 'x'", [1, 2]),
    (['{"id": 1}', '{"id": 2}', "", '{"id": 3', '{"id": 5}'], "line 4: not valid JSON", [1, 2]),
    (['{"id": 1}', '[1, 2]'], "line 2: expected a JSON object", []),
    (['{"id": 1}', '{"id": 2, "zzz": 1}'], "line 2, column 'zzz': unknown column", []),
    (['{"id": 1}', '{"name": "no key"}'], "line 2, column 'id': primary key is missing", []),
    (['{"id": 1}', '{"id": 2, "ts": "soon"}'], "line 2, column 'ts': expected ISO-8601", []),
    (['{"id": 1}', '{"id": 2}', '{"id": 3}', '{"id": 9999999999999999999}'], "line 4, column 'id'", [1, 2]),
])
def test_put_names_the_bad_line_and_writes_nothing_of_its_batch(fake_table, lines, message, written):
    result = run_in("put", "db.w", "--batch-size", "2", input="\n".join(lines) + "\n")
    error = assert_one_line_error(result)
    assert message in error
    assert f"{len(written)} row(s) before" in error
    client = fake_table["db.w"]
    assert [row["id"] for batch in client.upserts for row in batch] == written  # the bad line's batch: nothing


def test_get_and_delete(fake_table):
    fake_table.setdefault("db.p", FakeTableClient(PAIR)).rows[(7, "a,b")] = {"a": 7, "s": "a,b", "v": "x"}
    result = run_in("get", "db.p", '[7, "a,b"]', "8,z", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"table": "db.p", "keys": ['[7, "a,b"]', "8,z"], "found": 1,
                                         "rows": [{"a": 7, "s": "a,b", "v": "x"}, None]}
    text = run_in("get", "db.p", '[7, "a,b"]', "8,z").stdout
    assert "a,b" in text and "not found: 8,z" in text
    result = run_in("delete", "db.p", '[7, "a,b"]', "8,z", "--json")
    assert json.loads(result.stdout) == {"table": "db.p", "keys": 2, "deleted": 1}
    assert "-5" in run_in("get", "db.w", "-5").stdout  # negative keys are not options


@pytest.mark.parametrize("args, message", [
    (("get", "db.w", "abc"), "'abc': column 'id': expected BIGINT"),
    (("delete", "db.p", "1"), "the primary key has 2 column(s)"),
    (("get", "db.w"), "Missing argument"),
])
def test_bad_keys_are_usage_errors(fake_table, args, message):
    result = run_in(*args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_get_unknown_table_is_one_line(fake_table):
    assert "table db.nope does not exist" in assert_one_line_error(run_in("get", "db.nope", "1"))


def test_log_prints_json_lines_up_to_the_end(fake_table):
    result = run_in("log", "db.w", "--bucket", "1")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["offset"] for r in lines] == [2, 3, 4]  # from the earliest kept offset
    assert lines[0] == {"offset": 2, "change_type": "+I", "row": {"id": 2, "name": "n2"}}
    doc = json.loads(run_in("log", "db.w", "--bucket", "0", "--from", "3", "--json").stdout)
    assert doc["from_offset"] == 3 and doc["log_end_offset"] == 5 and [r["offset"] for r in doc["records"]] == [3, 4]
    assert run_in("log", "db.w", "--bucket", "0", "--follow", "--json").exit_code == 2
    assert "buckets 0..1, not 2" in assert_one_line_error(run_in("log", "db.w", "--bucket", "2"))


def test_log_follow_stops_quietly_on_ctrl_c(fake_table, monkeypatch):
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(data.time, "sleep", sleep)
    result = run_in("log", "db.w", "--bucket", "0", "--from", "0", "--follow", "--poll-interval", "50ms")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["offset"] for line in result.stdout.splitlines()] == [0, 1, 2, 3, 4]
    assert polls == [0.05] * 3


def test_snapshot_trigger(fake_table):
    doc = json.loads(run_in("snapshot", "trigger", "db.w", "--wait", "--json").stdout)
    assert doc == {"table": "db.w", "waited": True, "snapshots": [
        {"bucket": 0, "snapshot_id": 3, "log_offset": 7}, {"bucket": 1, "snapshot_id": 4, "log_offset": 5}]}
    assert "triggered" in run_in("snapshot", "trigger", "db.w").stdout
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=100)).committed(out.committed_doc("db.w", [], True))
    assert "nothing committed" in buffer.getvalue()


def test_cluster_status_text_shows_tablets():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=120)).cluster_status({"zookeeper": [], "coordinators": [], "tablets": [
        {"id": "1", "pid": 5, "address": "a:1", "buckets": 3, "alive": True, "registered": True},
        {"id": "2", "pid": 6, "address": "a:2", "buckets": 0, "alive": False, "registered": False}]})
    assert "3 buckets" in buffer.getvalue() and "not registered" in buffer.getvalue()
