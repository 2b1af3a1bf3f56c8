"""``kvlease.connect``: where the cluster is (arguments, then the CLI's KVLEASE_* variables, in the CLI's
order), its security settings, bad input as one clear error, and a real cluster reached each way."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import kvlease
from kvlease.client.cluster_dir import read_password_file
from kvlease.client.connect import ENV_BOOTSTRAP, ENV_CLUSTER, ENV_PASSWORD_FILE, ENV_RETRY_TIMEOUT, ENV_TLS_FILES, \
    find_cluster, layered_config
from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.tables import Column
from tests.support.local_cluster import LocalCluster
from tests.support.secure_cluster import ADMIN, ADMIN_PASSWORD, SecureCluster


def cluster_dir(path: Path, address: str, security: dict | None = None) -> Path:
    """A cluster directory naming the coordinator at ``address`` (as ``kvlease cluster start`` writes it)."""
    path.mkdir(parents=True, exist_ok=True)
    doc = {"coordinators": [{"address": address, "pid": None}], "tablets": [], "zookeeper": []}
    if security:
        doc["security"] = security
    (path / "cluster.json").write_text(json.dumps(doc))
    return path


# -- unit: finding the cluster ---------------------------------------------------------------------------


@pytest.mark.unit
def test_arguments_then_kvlease_bootstrap_then_kvlease_cluster(tmp_path):
    d = cluster_dir(tmp_path / "c", "127.0.0.1:9001")
    both = {ENV_BOOTSTRAP: "127.0.0.1:9002", ENV_CLUSTER: str(d)}
    assert find_cluster(env=both) == (["127.0.0.1:9002"], None)
    assert find_cluster(env={ENV_CLUSTER: str(d)}) == (["127.0.0.1:9001"], str(d))
    assert find_cluster(cluster=d, env=both) == (["127.0.0.1:9001"], str(d))  # an argument beats the variables
    assert find_cluster(bootstrap="h1:1, h2:2", env=both) == (["h1:1", "h2:2"], None)
    assert find_cluster(bootstrap=["h1:1"], env={}) == (["h1:1"], None)


@pytest.mark.unit
@pytest.mark.parametrize("name, why", [("missing", "No such file or directory"), ("pw\x00", "embedded null byte")])
def test_a_password_file_that_cannot_be_read_is_one_clear_error(tmp_path, name, why):
    with pytest.raises(errors.InvalidRequestError, match=f"cannot read the password file .*: {why}$"):
        read_password_file(tmp_path / name)


@pytest.mark.unit
def test_bad_input_is_one_clear_error(tmp_path):
    d = cluster_dir(tmp_path / "c", "127.0.0.1:9001")
    cases = {
        (str(d), "h:1"): "give cluster=DIR or bootstrap='HOST:PORT,…', not both",
        (None, None): "no cluster given: connect(cluster=DIR) or connect(bootstrap='HOST:PORT,…'), or set "
                      "KVLEASE_CLUSTER or KVLEASE_BOOTSTRAP",
        (str(tmp_path / "nope"), None): f"cluster='{tmp_path / 'nope'}': no such directory",
        (str(tmp_path), None): f"no cluster in {tmp_path}: {tmp_path / 'cluster.json'} not found (start one with: "
                               f"kvlease cluster start --dir {tmp_path})",
        ("localhost:9000", None): "cluster='localhost:9000': no such directory; for coordinator addresses use "
                                  "connect(bootstrap='localhost:9000')",
        (None, str(d)): f"bootstrap='{d}' is a directory: use connect(cluster='{d}') for a cluster directory",
        (None, "nohost"): "bad coordinator address 'nohost': expected HOST:PORT",
    }
    for (cluster, bootstrap), message in cases.items():
        with pytest.raises(errors.InvalidRequestError) as info:
            kvlease.connect(cluster, bootstrap, env={})
        assert message in info.value.message, (cluster, bootstrap)
        assert "\n" not in info.value.message


@pytest.mark.unit
def test_a_directory_whose_processes_all_stopped_is_said_at_once(tmp_path):
    """The pids cluster.json records tell: none alive is ClusterNotRunningError before anything is sent; one
    alive (a cluster partly running) or none recorded (coordinators run elsewhere) is tried as usual."""
    dead = _exited_pid()
    d = cluster_dir(tmp_path / "c", "127.0.0.1:9001")
    doc = json.loads((d / "cluster.json").read_text())
    doc["coordinators"][0]["pid"] = dead
    doc["tablets"] = [{"id": "1", "pid": dead, "address": "127.0.0.1:9002"}]
    (d / "cluster.json").write_text(json.dumps(doc))
    with pytest.raises(errors.ClusterNotRunningError) as info:
        kvlease.connect(cluster=d, env={})
    assert info.value.message == (f"the cluster in {d} is not running (none of the 2 processes its cluster.json "
                                  f"records runs): start it with: kvlease cluster start --dir {d}")
    doc["tablets"][0]["pid"] = os.getpid()  # one of them runs
    (d / "cluster.json").write_text(json.dumps(doc))
    assert find_cluster(cluster=d, env={}) == (["127.0.0.1:9001"], str(d))


def _exited_pid() -> int:
    """The pid of a process that ran and was reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.unit
def test_admin_client_given_a_directory_names_connect(tmp_path):
    for given in (str(tmp_path), tmp_path, "./cluster"):
        with pytest.raises(errors.InvalidRequestError) as info:
            kvlease.AdminClient(given)
        assert f"use kvlease.connect(cluster={str(given)!r}).admin" in info.value.message


@pytest.mark.unit
def test_the_cli_reads_the_same_variables():
    """The CLI's global options and connect() name the same environment variables."""
    from kvlease.ops.cli.app import kvlease as cli

    envvars = {p.name: p.envvar for p in cli.params}
    assert envvars["cluster_dir"] == ENV_CLUSTER and envvars["bootstrap"] == ENV_BOOTSTRAP
    assert envvars["retry_timeout"] == ENV_RETRY_TIMEOUT and envvars["password_file"] == ENV_PASSWORD_FILE
    assert {envvars["ca_file"], envvars["cert_file"], envvars["key_file"]} == set(ENV_TLS_FILES)


@pytest.mark.unit
def test_config_layers():
    cluster = {"security.enabled": True, "security.tls.ca-file": "/c/ca.pem", "security.username": "admin",
               "security.password": "pw"}
    env = {"KVLEASE_CLIENT_REQUEST_TIMEOUT": "7s"}
    config = layered_config(env, cluster)
    assert (config[cfg.CLIENT_REQUEST_TIMEOUT], config[cfg.SECURITY_USERNAME]) == (7000, "admin")
    # a named user (argument or variable) drops the directory's credentials, keeps its TLS
    for named in (layered_config(env, cluster, user_named=True),
                  layered_config({**env, "KVLEASE_SECURITY_USERNAME": "bob"}, cluster)):
        assert named[cfg.SECURITY_PASSWORD] == "" and named[cfg.TLS_CA_FILE] == "/c/ca.pem"
    tls = layered_config({}, None, {cfg.TLS_CA_FILE.name: "/x/ca.pem", cfg.TLS_CERT_FILE.name: None})
    assert tls[cfg.SECURITY_ENABLED] and tls[cfg.TLS_CA_FILE] == "/x/ca.pem"
    assert not layered_config({}, None, {cfg.TLS_CA_FILE.name: None})[cfg.SECURITY_ENABLED]


@pytest.mark.unit
def test_retry_timeout_and_credentials_checks():
    env = {ENV_BOOTSTRAP: "127.0.0.1:1"}

    def retry_s(**kwargs) -> float:
        with kvlease.connect(**kwargs) as kv:
            return kv.retry_total_s

    assert retry_s(env=env) == 60.0  # client.retry.total-timeout's default
    assert retry_s(env={**env, ENV_RETRY_TIMEOUT: "3s"}) == 3.0
    assert retry_s(retry_timeout=1.5, env={**env, ENV_RETRY_TIMEOUT: "3s"}) == 1.5
    with pytest.raises(errors.InvalidRequestError, match="KVLEASE_RETRY_TIMEOUT: '3' has no unit"):
        kvlease.connect(env={**env, ENV_RETRY_TIMEOUT: "3"})
    with pytest.raises(errors.InvalidRequestError, match="needs TLS .* never sent in the clear"):
        kvlease.connect(user="bob", password="pw", env=env)
    with pytest.raises(cfg.ConfigError, match="client.request-timeout"):
        kvlease.connect(options={"client.request-timeout": "soon"}, env=env)


# -- zk: a real cluster ----------------------------------------------------------------------------------


@pytest.fixture
def one_tablet(make_config, tmp_path):
    cluster = LocalCluster(make_config, tmp_path, 1)
    try:
        yield cluster
    finally:
        cluster.close()


def test_connect_by_directory_and_by_variables_reaches_the_cluster(one_tablet, tmp_path):
    one_tablet.create_table("shop.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)
    d = cluster_dir(tmp_path / "c", one_tablet.coordinator.address)
    with kvlease.connect(cluster=d) as kv:
        assert [t.path for t in kv.admin.list_tables()] == ["shop.t"]
        table = kv.table("shop.t")
        table.upsert([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    with pytest.raises(errors.InvalidRequestError, match="is closed"):  # closed with its connection
        table.lookup([1])
    for env in ({ENV_CLUSTER: str(d)}, {ENV_BOOTSTRAP: one_tablet.coordinator.address, ENV_CLUSTER: "/nowhere"}):
        with kvlease.connect(env=env) as kv:
            assert kv.table("shop.t").lookup([2, 3]) == [{"id": 2, "v": "b"}, None]
    with kvlease.connect(bootstrap=one_tablet.coordinator.address, env={}) as kv:
        with pytest.raises(errors.TableNotExistError):
            kv.table("shop.nope")


def test_connect_to_a_secure_cluster(make_config, tmp_path):
    with SecureCluster(make_config, tmp_path) as secure:
        address = secure.cluster.coordinator.address
        password_file = tmp_path / "admin.password"
        password_file.write_text(ADMIN_PASSWORD + "\n")
        # arguments
        with kvlease.connect(bootstrap=address, ca_file=str(secure.paths.ca), user=ADMIN,
                             password_file=str(password_file), env={}) as kv:
            assert ADMIN in kv.admin.list_users()
        # the CLI's variables
        env = {ENV_BOOTSTRAP: address, "KVLEASE_CA_FILE": str(secure.paths.ca),
               "KVLEASE_SECURITY_USERNAME": ADMIN, "KVLEASE_SECURITY_PASSWORD": ADMIN_PASSWORD}
        with kvlease.connect(env=env) as kv:
            assert ADMIN in kv.admin.list_users()
        # a secure cluster's directory brings its CA and admin credentials
        d = cluster_dir(tmp_path / "c", address, {"ca_file": str(secure.paths.ca), "username": ADMIN,
                                                   "password_file": str(password_file)})
        with kvlease.connect(cluster=d, env={}) as kv:
            assert ADMIN in kv.admin.list_users()
        with kvlease.connect(cluster=d, user=ADMIN, password="wrong", retry_timeout=2, env={}) as kv:
            with pytest.raises(errors.AuthenticationFailedError):
                kv.admin.list_users()
