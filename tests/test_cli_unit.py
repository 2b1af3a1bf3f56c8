"""The kvlease CLI without a cluster: usage errors, error messages, JSON documents.

Commands that need a coordinator run against a fake AdminClient (same method
names and return types as coordinator.admin.AdminClient).
"""

from __future__ import annotations

import io
import json
import socket
import types

import pytest
from click.testing import CliRunner
from rich.console import Console

import coordinator.admin as admin
from common import errors
from common.tables import Column, TableInfo
from leases.model import Lease, SnapshotHandle, TableBucket
from ops import output as out
from ops.cli import State, kvlease

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


def test_cluster_start_rejects_tablets_it_cannot_start(tmp_path):
    message = assert_one_line_error(run("cluster", "start", "--dir", str(tmp_path), "--tablets", "2"))
    assert "tablet" in message


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
