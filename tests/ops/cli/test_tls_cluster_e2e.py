"""``kvlease cluster start --secure``: mutual TLS, authentication and ACLs everywhere, and the CLI logs in on its own.

``--cluster D`` takes the client certificate and the super user admin's credentials (D/admin.password) from
cluster.json; ``--bootstrap`` needs ``--ca-file``/``--cert-file``/``--key-file`` and ``--user``/``--password-file``;
without TLS the CLI gets an error naming TLS. The whole CLI flow runs as admin, then a user bob is added and
granted, and works within his grants (a write, snapshot trigger, drop or create outside them is denied). Apart,
on a secure cluster of its own, Spark reads with the directory's credentials and with bob's.
"""

from __future__ import annotations

import json
import stat

import pytest

from kvlease.ops.wait import wait_until
from tests.ops.cli.test_cli_e2e import (  # noqa: F401 (cluster_dir is a fixture)
    cluster_dir, kvlease, kvlease_json, print_logs)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_secure_cluster_and_cli(cluster_dir, tmp_path):
    try:
        d = str(cluster_dir)
        doc, password_file, admin_password = _start_secure(cluster_dir)
        sec = doc["security"]
        # the whole CLI flow as admin (--cluster D logs in by itself)
        c = ("--cluster", d)
        rows = _admin_flow(c, d, tmp_path)
        # bob: added and granted by admin; reads db.t, is denied what he was not granted
        bob_file = tmp_path / "bob.password"
        bob_file.write_text("bob-Secret-42\n")
        address = doc["coordinators"][0]["address"]
        tls = ("--ca-file", sec["ca_file"], "--cert-file", sec["cert_file"], "--key-file", sec["key_file"])
        _bob_flow(c, ("--bootstrap", address, *tls, "--user", "bob", "--password-file", str(bob_file)), rows)
        _credentials_elsewhere(cluster_dir, tmp_path, address, tls, password_file, admin_password)
        kvlease("cluster", "stop", "--dir", d)
    except BaseException:
        print_logs(cluster_dir)
        raise


def test_spark_reads_a_secure_cluster_with_its_directory_and_with_a_users_credentials(cluster_dir, tmp_path, spark):
    """Apart from the CLI flow above (the Spark tests share one worker: this one holds it only for a start)."""
    try:
        d = str(cluster_dir)
        doc, _password_file, _admin_password = _start_secure(cluster_dir)
        sec = doc["security"]
        c = ("--cluster", d)
        kvlease(*c, "table", "create", "db.t", "--schema", "id BIGINT, name STRING", "--primary-key", "id",
                "--buckets", "2")
        rows = tmp_path / "rows.jsonl"
        rows.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(1, 11)))
        kvlease(*c, "put", "db.t", str(rows))
        bob_file = tmp_path / "bob.password"
        bob_file.write_text("bob-Secret-42\n")
        kvlease(*c, "user", "add", "bob", "--password-stdin", input="bob-Secret-42\n")
        kvlease(*c, "acl", "add", "--principal", "User:bob", "--operation", "READ", "--table", "db.t")
        address = doc["coordinators"][0]["address"]

        # a Spark read with credentials: the cluster directory's (admin), and bob's over --bootstrap
        read = spark.read.format("kvlease").option("cluster", d).option("table", "db.t").load()
        assert sorted(r.id for r in read.select("id").collect()) == list(range(1, 11))
        bob_options = {"bootstrap": address, "table": "db.t", "ca-file": sec["ca_file"],
                       "cert-file": sec["cert_file"], "key-file": sec["key_file"], "user": "bob",
                       "password-file": str(bob_file)}
        assert spark.read.format("kvlease").options(**bob_options).load().count() == 10
        kvlease("cluster", "stop", "--dir", d)
    except BaseException:
        print_logs(cluster_dir)
        raise


def _start_secure(cluster_dir):
    """``cluster start --secure``: its files and configs; returns (cluster.json, admin's password file, password)."""
    started = kvlease("cluster", "start", "--dir", str(cluster_dir), "--tablets", "1", "--secure")
    password_file = cluster_dir / "admin.password"
    admin_password = password_file.read_text().strip()
    assert f"--password-file {password_file}" in started.stderr and admin_password not in started.stderr
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    doc = json.loads((cluster_dir / "cluster.json").read_text())
    sec = doc["security"]
    assert sec["client_auth"] is True and sec["username"] == "admin" and sec["password_file"] == str(password_file)
    assert admin_password not in json.dumps(doc)
    for home in ("coordinator-1", "tablet-1"):
        config_file = cluster_dir / home / "config.toml"
        config = config_file.read_text()
        assert '"security.enabled" = true' in config and "node.pem" in config
        assert '"security.internal.password"' in config and '"security.zookeeper.digest" = "kvlease:' in config
        assert '"security.super-users" = "User:admin"' in config
        assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    return doc, password_file, admin_password


def _admin_flow(c, d, tmp_path):
    """Tables, rows, snapshots and leases as admin; returns the rows file."""
    kvlease(*c, "table", "create", "db.t", "--schema", "id BIGINT, name STRING", "--primary-key", "id",
            "--buckets", "2")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(1, 11)))
    assert kvlease_json(*c, "put", "db.t", str(rows), "--json") == {"table": "db.t", "rows": 10}
    assert "n7" in kvlease(*c, "get", "db.t", "7").stdout
    assert len(kvlease_json(*c, "scan", "db.t", "--json")["rows"]) == 10
    # the tablet server's own count comes from its metrics endpoint (2 s to answer): polled, a loaded machine
    # may leave one scrape unanswered (then the status says not known: None)
    wait_until(lambda: kvlease_json("cluster", "status", "--dir", d, "--json")["tablets"][0]["buckets"] == 2, 60,
               "the tablet server to report its 2 buckets")
    kvlease(*c, "snapshot", "trigger", "db.t", "--wait")
    assert kvlease_json(*c, "snapshot", "list", "db.t", "--json")["snapshots"]
    kvlease(*c, "lease", "acquire", "L1", "--table", "db.t", "--latest", "--duration", "10m")
    kvlease(*c, "lease", "renew", "L1", "--duration", "20m")
    assert len(kvlease_json(*c, "lease", "describe", "L1", "--json")["buckets"]) == 2
    assert [lease["lease_id"] for lease in kvlease_json(*c, "lease", "list", "--json")["leases"]] == ["L1"]
    assert kvlease_json(*c, "lease", "release", "L1", "--table", "db.t", "--bucket", "0", "--json")["released"]
    assert kvlease_json(*c, "lease", "drop", "L1", "--json")["dropped"] is True
    return rows


def _bob_flow(c, bob, rows) -> None:
    """bob is added and granted READ on db.t by admin; he reads it and is denied the rest."""
    proc = kvlease(*c, "user", "add", "bob", "--password-stdin", input="bob-Secret-42\n")
    assert "added user bob" in proc.stdout
    assert kvlease_json(*c, "user", "list", "--json") == {"users": ["admin", "bob"]}
    kvlease(*c, "acl", "add", "--principal", "User:bob", "--operation", "READ", "--table", "db.t")
    assert "n7" in kvlease(*bob, "get", "db.t", "7").stdout
    assert kvlease_json(*bob, "acl", "list", "--json")["acls"] == [
        {"resource_type": "table", "resource": "db.t", "principal": "User:bob", "operation": "READ"}]
    denied = kvlease(*bob, "acl", "add", "--principal", "User:bob", "--operation", "WRITE", "--table", "db.t",
                     check=False)
    assert denied.returncode == 1 and "User:bob may not ALTER table db.t" in denied.stderr, denied.stderr
    assert len(denied.stderr.strip().splitlines()) == 1, denied.stderr
    denied = kvlease(*bob, "user", "add", "mallory", "--password-stdin", input="x\n", check=False)
    assert denied.returncode == 1 and "may not ALTER cluster" in denied.stderr, denied.stderr
    assert len(kvlease_json(*bob, "scan", "db.t", "--json")["rows"]) == 10
    kvlease(*bob, "lease", "acquire", "B1", "--table", "db.t", "--latest", "--duration", "10m")
    assert kvlease_json(*bob, "lease", "drop", "B1", "--json")["dropped"] is True
    for command, operation, resource in (
            (("put", "db.t", str(rows)), "WRITE", "table db.t"),
            (("snapshot", "trigger", "db.t"), "WRITE", "table db.t"),
            (("table", "drop", "db.t"), "DROP", "table db.t"),
            (("table", "create", "db.u", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "1"),
             "CREATE", "database db")):
        denied = kvlease(*bob, *command, check=False)
        assert denied.returncode == 1 and f"User:bob may not {operation} {resource}" in denied.stderr, \
            denied.stderr
    assert [t["table"] for t in kvlease_json(*c, "table", "list", "--json")["tables"]] == ["db.t"]


def _credentials_elsewhere(cluster_dir, tmp_path, address, tls, password_file, admin_password) -> None:
    """A wrong password, admin over --bootstrap, no TLS; no log shows a password."""
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-it\n")
    failed = kvlease("--bootstrap", address, *tls, "--user", "bob", "--password-file", str(wrong),
                     "--retry-timeout", "0s", "table", "list", check=False)
    assert failed.returncode == 1 and "authentication failed" in failed.stderr, failed.stderr

    # admin from elsewhere: the same credentials with --bootstrap
    admin = ("--bootstrap", address, *tls, "--user", "admin", "--password-file", str(password_file))
    assert "db.t" in kvlease(*admin, "table", "list").stdout
    plain = kvlease("--bootstrap", address, "--retry-timeout", "0s", "table", "list", check=False)
    assert plain.returncode == 1 and "TLS" in plain.stderr, plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr  # gRPC logs nothing of its own
    for log in [cluster_dir / "coordinator-1" / "coordinator.log", cluster_dir / "tablet-1" / "tablet.log"]:
        text = log.read_text()
        assert admin_password not in text and "bob-Secret-42" not in text
