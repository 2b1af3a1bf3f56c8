"""The Spark source over mutual TLS: a write and a batch read with the ca-file/cert-file/key-file options.

(A plaintext client against TLS is tested in test_tls.py: through Spark it waits out the client's whole retry
budget, 60s by default, before failing.)"""

from __future__ import annotations

import pytest

from common.config import Config
from common.tables import Column
from ops import certs
from spark_source.schema import table_schema
from tests.local_cluster import LocalCluster
from tests.test_tls import security


@pytest.fixture
def secure_kv(make_config, tmp_path):
    paths = certs.generate(tmp_path / "certs")

    def make(overrides=None, /, **more):
        return make_config({**security(paths, client_auth=True), **(overrides or {})}, **more)
    cluster = LocalCluster(make, tmp_path, 1,
                           client_config=Config(security(paths, client_auth=True, client=True), env={}))
    try:
        yield cluster, paths
    finally:
        cluster.close()


def test_write_and_read_over_mutual_tls(spark, secure_kv):
    kv, paths = secure_kv
    info = kv.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)
    tls = {"bootstrap": kv.coordinator.address, "table": "db.t", "ca-file": str(paths.ca),
           "cert-file": str(paths.client_cert), "key-file": str(paths.client_key)}
    rows = [{"id": i, "v": f"v{i}"} for i in range(20)]
    spark.createDataFrame(rows, table_schema(info, with_changes=False)).write.format("kvlease") \
        .options(**tls).mode("append").save()
    back = spark.read.format("kvlease").options(**tls).load().select("id", "v").collect()
    assert sorted((r.id, r.v) for r in back) == [(r["id"], r["v"]) for r in rows]
