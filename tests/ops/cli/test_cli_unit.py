"""The kvlease CLI without a cluster: usage errors, error messages, JSON documents.

Commands against a fake AdminClient are in test_cli_lease_unit.py, the data
commands against a fake TableClient in test_cli_data_unit.py.
"""

from __future__ import annotations

import io
import json
import socket

import pytest
from rich.console import Console

import kvlease.client.admin as admin
from kvlease.common import errors
from kvlease.common.tables import MAX_BUCKETS, Column, TableInfo
from kvlease.common.model import Lease, SnapshotHandle, TableBucket
from kvlease.ops.cli import output as out
from kvlease.ops.cli.app import State
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.unit


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
    ("lease", "acquire", "L1", "--table", "db.t", "--snapshot", "0=1", "--duration", "5"),
    ("lease", "renew", "L1", "--duration", "5"),
    ("--retry-timeout", "5", "table", "list"),
    ("log", "db.t", "--bucket", "0", "--poll-interval", "5"),
])
def test_a_duration_without_a_unit_is_a_usage_error(args):
    result = run("--bootstrap", "127.0.0.1:1", *args)
    assert result.exit_code == 2, result.output
    assert "'5' has no unit: write 5ms, 5s, 5m, 5h or 5d" in result.stderr


def test_a_duration_without_a_unit_from_the_environment_is_a_usage_error():
    result = run("--bootstrap", "127.0.0.1:1", "table", "list", env={"KVLEASE_RETRY_TIMEOUT": "300"})
    assert result.exit_code == 2 and "'300' has no unit" in result.stderr


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


@pytest.mark.parametrize("args, says", [
    (("lease", "acquire", "L1", "--table", "db.t", "--snapshot", "0:1", "--duration", "10m"),
     "error: Invalid value for '--snapshot': '0:1' is not BUCKET=SNAPSHOT_ID (e.g. 0=12) "
     "(see: kvlease lease acquire --help)"),
    (("log", "db.t", "--from", "3"), "error: --from N is an offset of one bucket: give --bucket B too"),
    (("nosuch",), "error: No such command 'nosuch'. (see: kvlease --help)"),
    (("lease", "list", "extra\nline"), "error: Got unexpected extra argument (extra\\nline) "
                                        "(see: kvlease lease list --help)"),
    (("lease", "drop", "bad:id"), "error: Invalid value for 'LEASE_ID': bad lease id 'bad:id': 1-128 characters "
                                  "of letters, digits, '.', '_' or '-' (not '.' or '..') (see: kvlease lease drop --help)"),
    (("lease", "describe", ".."), "bad lease id '..'"),
    (("lease", "release", "x" * 129, "--table", "db.t", "--bucket", "0"), "bad lease id"),
    (("lease", "acquire", "L1", "--table", "db.t", "--latest", "--duration", "0s"),
     "error: Invalid value for '--duration': '0s': must be more than 0 (see: kvlease lease acquire --help)"),
    (("lease", "renew", "L1", "--duration", "0ms"), "'0ms': must be more than 0"),
    (("log", "db.t", "--bucket", "0", "--follow", "--poll-interval", "0s"), "'0s': must be more than 0"),
    (("cluster", "start", "--dir", "/nonexistent/kv", "--timeout", "0s"), "'0s': must be more than 0"),
    (("put", "db.t", "\x00"), "'\\x00': a file name cannot hold a NUL byte"),  # was a traceback (open's ValueError)
    (("put", "db.t", "a\x00b.csv"), "a file name cannot hold a NUL byte"),
])
def test_a_usage_error_is_one_line_naming_the_help_to_read(args, says):
    """Every command's usage errors are one ``error:`` line, like every other error (click's own are four)."""
    assert says in assert_one_line_error(run("--bootstrap", "127.0.0.1:1", *args), code=2)


@pytest.mark.parametrize("args, says", [
    (("--buckets", "100000"), f"bucket count must be between 1 and {MAX_BUCKETS}, got 100000"),
    (("--buckets", "2", "--primary-key", "nope"), "primary key column 'nope' is not a column of the table"),
    (("--buckets", "2", "--schema", "id BIGINT, id STRING"), "duplicate column 'id'"),
    (("--buckets", "2", "--schema", "id BIGINT, x FLOAT9"), "column 'x': bad column type 'FLOAT9': unknown type"),
    (("--buckets", "2", "--ttl", "7 days"), "bad --ttl '7 days': not a duration"),
    (("--buckets", "2", "--ttl", "7d", "--ttl-column", "name"), "TTL column 'name' is of type STRING"),
    (("--buckets", "2", "--ttl", "7d", "--ttl-column", "nope"), "TTL column 'nope' is not a column of the table"),
    (("--buckets", "2", "--ttl-changelog", "none"), "--ttl-column and --ttl-changelog need --ttl DURATION"),
])
def test_a_table_definition_the_cluster_would_refuse_is_a_usage_error_before_anything_is_sent(args, says):
    """Checked in the CLI with the coordinator's own rules (common.tables.validate_spec): exit 2, nothing sent
    (the bootstrap address is closed: reaching for it would be exit 1 after retries)."""
    defaults = {"--schema": "id BIGINT, name STRING", "--primary-key": "id"}
    given = dict(zip(args[::2], args[1::2]))
    options = [part for key, value in {**defaults, **given}.items() for part in (key, value)]
    for extra in ((), ("--if-not-exists",)):
        result = run("--bootstrap", f"127.0.0.1:{closed_port()}", "--retry-timeout", "10s",
                     "table", "create", "db.t", *options, *extra)
        message = assert_one_line_error(result, code=2)
        assert says in message and "(see: kvlease table create --help)" in message


def test_a_group_without_its_command_shows_its_help():
    result = run("lease")
    assert result.exit_code == 2 and "Commands:" in result.output and "acquire" in result.output


@pytest.mark.parametrize("bootstrap", ["nonsense", "127.0.0.1:99999", "host:", ":5", "a b:1", "127.0.0.1:1,,x"])
def test_a_malformed_bootstrap_address_is_a_usage_error_not_a_retry(bootstrap):
    for args in (("--bootstrap", bootstrap, "table", "list"), ("table", "list", "--bootstrap", bootstrap)):
        message = assert_one_line_error(run(*args), code=2)
        assert "Invalid value for '--bootstrap': bad coordinator address" in message
    env_result = run("table", "list", env={"KVLEASE_BOOTSTRAP": bootstrap})
    assert "bad coordinator address" in assert_one_line_error(env_result, code=2)


@pytest.mark.parametrize("args", [("cluster", "status"), ("cluster", "stop"), ("cluster", "start"),
                                  ("drill", "coordinator-failover")])
def test_commands_on_a_cluster_directory_take_no_bootstrap(args):
    message = assert_one_line_error(run(*args, "--bootstrap", "127.0.0.1:1"), code=2)
    assert "No such option '--bootstrap'" in message
    help_text = run(*args[:1 if args[0] == "drill" else 2], "--help").output
    assert "--cluster" in help_text and "HOST:PORT" not in help_text


@pytest.mark.parametrize("content, says", [
    ("[]", "is not a kvlease cluster file: not a JSON object"),
    ("{}", "is not a kvlease cluster file: no 'coordinators'"),
    ('{"coordinators": {}}', "'coordinators' is not a list"),
    ('{"coordinators": [{"pid": 5}]}', "an entry of 'coordinators' is not an object with an address and a pid"),
    ('{"coordinators": [], "tablets": [{"address": "h:1", "pid": "5"}]}', "an entry of 'tablets'"),
])
def test_a_cluster_file_of_another_shape_is_a_one_line_error(tmp_path, content, says):
    (tmp_path / "cluster.json").write_text(content)
    for args in (("--cluster", str(tmp_path), "table", "list"), ("cluster", "status", "--dir", str(tmp_path))):
        assert says in assert_one_line_error(run(*args))


def test_cluster_start_in_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("x")
    assert assert_one_line_error(run("cluster", "start", "--dir", str(tmp_path / "file"))) == \
        f"error: {tmp_path / 'file'} exists and is not a directory"
    message = assert_one_line_error(run("cluster", "start", "--dir", str(tmp_path / "file" / "sub")))
    assert message.startswith(f"error: cannot create {tmp_path / 'file'}")


def test_unreachable_bootstrap_names_the_address():
    address = f"127.0.0.1:{closed_port()}"
    message = assert_one_line_error(run("--bootstrap", address, "--retry-timeout", "500ms", "table", "list"))
    assert f"cannot reach coordinator {address}" in message


@pytest.mark.parametrize("error, says", [
    (errors.OutcomeUnknownError("RenewKvSnapshotLease to coordinator c:1 timed out after 30s; it may or may not "
                                "have been applied"),
     "outcome unknown: RenewKvSnapshotLease to coordinator c:1 timed out after 30s; it may or may not have been "
     "applied"),
    (errors.NetworkError("cannot reach coordinator c:1"),
     "cannot reach coordinator c:1 (gave up after retrying for 10s; is the cluster running?)"),
    (errors.ZooKeeperUnavailableError("coordinator c:1 cannot reach ZooKeeper at z:2"),
     "coordinator c:1 cannot reach ZooKeeper at z:2 (gave up after retrying for 10s)"),  # the coordinator runs
    (errors.LeaseNotFoundError("lease 'L' not found"), "lease 'L' not found"),
])
def test_an_error_says_what_is_known_of_it(error, says):
    from kvlease.ops.cli.app import _message

    assert _message(error, State()) == says


def test_retry_timeout_from_env_and_options_after_the_command():
    address = f"127.0.0.1:{closed_port()}"
    result = run("lease", "list", "--bootstrap", address, "--json", env={"KVLEASE_RETRY_TIMEOUT": "300ms"})
    assert f"cannot reach coordinator {address}" in assert_one_line_error(result)


def test_unknown_bench_and_drill():
    assert "unknown benchmark 'nosuch'" in assert_one_line_error(run("bench", "nosuch"), code=2)
    assert "unknown drill 'nosuch'" in assert_one_line_error(run("drill", "nosuch", "--cluster", "/tmp"))


def test_cluster_start_rejects_tablets_it_cannot_start(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kvlease.tablet.__main__" else
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
    assert out.lease_doc(lease, names) == {"lease_id": "L1", "expiration_time": 5, "owner": None, "buckets": [
        {"table": "db.t", "bucket": 0, "snapshot_id": 3}, {"table": "db.t", "bucket": 1, "snapshot_id": 4},
        {"table": "#8", "bucket": 0, "snapshot_id": 1}]}
    assert out.lease_doc(Lease("L2", 5, {tb0: 3}, owner="job-1"), names)["owner"] == "job-1"
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


def test_cluster_status_text_shows_tablets():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=120)).cluster_status({"zookeeper": [], "coordinators": [], "tablets": [
        {"id": "1", "pid": 5, "address": "a:1", "buckets": 3, "alive": True, "registered": True},
        {"id": "2", "pid": 6, "address": "a:2", "buckets": 0, "alive": False, "registered": False}]})
    assert "3 buckets" in buffer.getvalue() and "not registered" in buffer.getvalue()


def test_cluster_status_text_of_a_stopped_cluster_has_no_state_for_its_tablets():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=160)).cluster_status({"zookeeper": [], "coordinators": [
        {"id": "1", "pid": 4, "address": "a:0", "active": False, "epoch": None, "alive": False}], "tablets": [
        {"id": "1", "pid": 5, "address": "a:1", "buckets": None, "alive": False, "registered": None, "error": None}]})
    text = buffer.getvalue()
    assert "error" not in text and "registered" not in text and "buckets" not in text


def test_cluster_status_text_shows_a_failed_question_as_an_error():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=160)).cluster_status({"zookeeper": [], "coordinators": [
        {"id": "1", "pid": 4, "address": "a:0", "active": False, "epoch": None, "alive": True,
         "error": "deadline exceeded"}], "tablets": [
        {"id": "1", "pid": 5, "address": "a:1", "buckets": None, "alive": True, "registered": None,
         "error": "no active coordinator to ask which tablet servers are registered"}]})
    text = buffer.getvalue()
    assert "error: deadline exceeded" in text and "error: no active coordinator" in text
    assert "not registered" not in text and "buckets" not in text


def test_cluster_status_text_shows_a_tablet_s_rebuilds():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=200)).cluster_status({"zookeeper": [], "coordinators": [], "tablets": [
        {"id": "1", "pid": 5, "address": "a:1", "buckets": 3, "alive": True, "registered": True, "rebuilding": 2,
         "rebuild_bytes": 12_500_000, "offsets_behind": 340},
        {"id": "2", "pid": 6, "address": "a:2", "buckets": 3, "alive": True, "registered": True, "rebuilding": 0,
         "rebuild_bytes": 0, "offsets_behind": 0}]})
    text = buffer.getvalue()
    assert "rebuilding 2 bucket(s), 12.5 MB downloaded, 340 offsets behind" in text
    assert text.count("rebuilding") == 1  # a server in sync says nothing of it


def test_cluster_start_tablet_disk_that_is_no_size_or_too_small_is_a_usage_error(tmp_path):
    for size, said in (("3m", "'3m' is too small for the disk of a tablet server: it needs at least 16m"),
                       ("lots", "'lots' is not a size (use e.g. 64m, 1g)")):
        result = run("cluster", "start", "--dir", str(tmp_path / "c"), "--tablet-disk", size)
        assert result.exit_code == 2 and "--tablet-disk" in result.stderr and said in result.stderr, result.output
    assert not (tmp_path / "c").exists()


def test_cluster_status_text_shows_a_tablet_s_small_disk():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=160)).cluster_status({"zookeeper": [], "coordinators": [], "tablets": [
        {"id": "1", "pid": 5, "address": "a:1", "buckets": 3, "alive": True, "registered": True,
         "disk_bytes": 64 << 20, "disk_free_bytes": 41 << 20},
        {"id": "2", "pid": None, "address": "a:2", "buckets": None, "alive": False, "registered": None,
         "disk_bytes": 64 << 20, "disk_free_bytes": None}]})
    text = buffer.getvalue()
    assert "3 buckets; tmpfs disk 64 MiB, 41.0 MiB free" in text and "tmpfs disk 64 MiB, unmounted" in text
