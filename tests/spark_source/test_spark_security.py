"""The Spark source on a secure cluster (mutual TLS + users + ACLs): writes and reads with the user/password
options, refused without the table's ACL and changing nothing then.

A read without the TLS options fails at once naming the TLS mismatch (client.transport.tls_mismatch), not
after the client's whole retry budget (60 s by default)."""

from __future__ import annotations

import time

import pytest

from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.spark_source.schema import table_schema
from tests.support.secure_cluster import SecureCluster

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


@pytest.fixture
def secure(make_config, tmp_path):
    with SecureCluster(make_config, tmp_path, client_auth=True) as cluster:
        cluster.add_user("bob", "bob-pw")
        (tmp_path / "bob.password").write_text("bob-pw\n")
        yield cluster


def options(secure: SecureCluster, tmp_path, **more) -> dict:
    paths = secure.paths
    return {"bootstrap": secure.cluster.coordinator.address, "table": "db.t", "ca-file": str(paths.ca),
            "cert-file": str(paths.client_cert), "key-file": str(paths.client_key), "user": "bob",
            "password-file": str(tmp_path / "bob.password"), **more}


def test_write_and_read_need_write_and_read_on_the_table(spark, secure, tmp_path):
    info = secure.cluster.create_table("db.t", COLUMNS, ["id"], 2)
    rows = [{"id": i, "v": f"v{i}"} for i in range(20)]
    frame = spark.createDataFrame(rows, table_schema(info, with_changes=False))
    opts = options(secure, tmp_path)

    # no grant at all: the table cannot even be described
    with pytest.raises(Exception, match="User:bob may not DESCRIBE table db.t"):
        frame.write.format("kvlease").options(**opts).mode("append").save()
    with pytest.raises(Exception, match="User:bob may not DESCRIBE table db.t"):
        spark.read.format("kvlease").options(**opts).load().collect()

    # WRITE only: writes land, a read is refused at the lease (and leaves none behind)
    secure.grant("User:bob", "WRITE", "db.t")
    frame.write.format("kvlease").options(**opts).mode("append").save()
    with pytest.raises(Exception, match="User:bob may not READ table db.t"):
        spark.read.format("kvlease").options(**opts).load().collect()
    assert secure.admin.list_leases() == []

    # READ only: reads work, a write is refused by the tablet server and changes nothing
    secure.revoke("User:bob", "WRITE", "db.t")
    secure.grant("User:bob", "READ", "db.t")
    with TableClient(secure.admin, "db.t") as table:
        table.trigger_snapshot()
    back = spark.read.format("kvlease").options(**opts).load().select("id", "v").collect()
    assert sorted((r.id, r.v) for r in back) == [(r["id"], r["v"]) for r in rows]
    changed = spark.createDataFrame([{"id": 0, "v": "changed"}], table_schema(info, with_changes=False))
    with pytest.raises(Exception, match="User:bob may not WRITE table db.t"):
        changed.write.format("kvlease").options(**opts).mode("append").save()
    with TableClient(secure.admin, "db.t") as table:
        assert table.lookup([0]) == [{"id": 0, "v": "v0"}]


def test_a_wrong_password_fails_the_read_with_authentication_failed(spark, secure, tmp_path):
    secure.cluster.create_table("db.t", COLUMNS, ["id"], 1)
    opts = options(secure, tmp_path, password="wrong")
    del opts["password-file"]
    with pytest.raises(Exception, match="authentication failed for user 'bob'"):
        spark.read.format("kvlease").options(**opts).load().collect()


def test_a_read_without_the_tls_options_is_told_at_once(spark, secure, tmp_path):
    secure.cluster.create_table("db.t", COLUMNS, ["id"], 1)
    opts = {"bootstrap": secure.cluster.coordinator.address, "table": "db.t"}  # (a password needs TLS: refused)
    start = time.monotonic()
    with pytest.raises(Exception, match="it speaks TLS and this client does not"):
        spark.read.format("kvlease").options(**opts).load().collect()
    assert time.monotonic() - start < 30  # the client's retry budget is 60 s
