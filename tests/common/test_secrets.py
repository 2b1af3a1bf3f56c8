"""Credentials (S3 keys, passwords, the ZooKeeper digest) never show: not in logs (DEBUG, every library's),
ZooKeeper data, error messages sent to clients, CoordinatorInfo, nor in a config's repr; config files
holding them are mode 0600."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from kvlease.client.table import TableClient
from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.redaction import REDACTED, scrub
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column
from kvlease.common.zk import make_client
from tests.support.secure_cluster import ADMIN, ADMIN_PASSWORD, INTERNAL_PASSWORD, SecureCluster

ACCESS_KEY = "AKIAKVLEASE7TESTKEYID"
SECRET_KEY = "kvl3ase+S3cr3t/Zq8wT4nM0pXvB2rY6uH1dJ9s"
ZK_PASSWORD = "zk-Dig3st-Pa55w0rd"
DIGEST = f"kvlease-zk:{ZK_PASSWORD}"
SECRETS = (ACCESS_KEY, SECRET_KEY, ZK_PASSWORD, INTERNAL_PASSWORD, ADMIN_PASSWORD)
COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def zk_data(client, path: str = "/") -> dict[str, bytes]:
    data, _ = client.get(path)
    found = {path: data}
    for name in client.get_children(path):
        found.update(zk_data(client, f"{path.rstrip('/')}/{name}"))
    return found


def test_credentials_show_nowhere(make_config, tmp_path, s3_endpoint, s3_overrides, s3_client, caplog):
    caplog.set_level(logging.DEBUG)
    for name in ("botocore", "boto3", "urllib3", "s3transfer", "kazoo"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    bucket = s3_overrides["remote.data.dir"].split("/")[2]
    overrides = {**s3_overrides, "remote.s3.access-key": ACCESS_KEY, "remote.s3.secret-key": SECRET_KEY,
                 "security.zookeeper.digest": DIGEST}
    messages: list[str] = []
    try:
        with SecureCluster(make_config, tmp_path, overrides=overrides) as c:
            info = c.admin.coordinator_info()
            table = c.cluster.create_table("db.t", COLUMNS, ["id"], 2)
            with TableClient(c.admin, "db.t", c.client_config(ADMIN, ADMIN_PASSWORD), retry_total_s=1) as client:
                client.upsert([{"id": i, "v": f"v{i}"} for i in range(50)])
                snapshots = client.trigger_snapshot(wait=True)
                c.admin.acquire_lease("reader", {TableBucket(table.table_id, s.bucket): s.snapshot_id
                                                 for s in snapshots}, 60_000)
                messages.append(repr(c.admin.describe_lease("reader")))
                # S3 fails: the bucket is gone; the tablet's error reaches the client
                for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                    s3_client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]}
                                                                               for o in page.get("Contents", [])]})
                s3_client.delete_bucket(Bucket=bucket)
                client.upsert([{"id": 1, "v": "changed"}])
                with pytest.raises(errors.KvLeaseError) as failed:
                    client.trigger_snapshot(wait=True)
                messages.append(str(failed.value))
            # a wrong bucket, straight through the storage the servers use
            wrong = open_storage("s3://no-such-bucket-kvlease/p", c.cluster.coordinator.config)
            with pytest.raises(errors.StorageError) as no_bucket:
                wrong.read("x")
            messages.append(str(no_bucket.value))
            # a wrong password is refused without the password in the answer
            with pytest.raises(errors.AuthenticationFailedError) as refused:
                c.admin_as(ADMIN, "not-" + ADMIN_PASSWORD).list_tables()
            messages.append(str(refused.value))
            zk = make_client(make_config({"security.zookeeper.digest": DIGEST}))
            try:
                data = zk_data(zk)
            finally:
                zk.stop()
                zk.close()
            messages.append(repr(c.cluster.coordinator.config))
            messages.append(repr(c.cluster.tablets[1].config.redacted()))
    finally:
        s3_client.create_bucket(Bucket=bucket)  # for the fixture's cleanup
    assert "StorageError" in type(failed.value).__name__ or "storage" in str(failed.value).lower()
    assert "NoSuchBucket" in messages[2] or "does not exist" in messages[2]
    for text in messages:
        assert not leaks(text), text
    assert not leaks(repr(info)) and info.s3_endpoint == s3_endpoint.url
    assert len(data) > 10 and not [path for path, value in data.items() if leaks(value.decode("latin-1"))]
    logged = [record.getMessage() + (record.exc_text or "") for record in caplog.records]
    assert any("botocore" in r.name for r in caplog.records), "botocore logged nothing: the check would be empty"
    assert not [line for line in logged if leaks(line)]
    assert any(f"Credential={REDACTED}" in line for line in logged)  # botocore's Authorization header, blanked


def test_a_config_shows_no_credential_and_its_file_is_private(tmp_path):
    config = cfg.Config({"remote.s3.access-key": ACCESS_KEY, "remote.s3.secret-key": SECRET_KEY,
                         "security.password": ADMIN_PASSWORD, "security.internal.password": INTERNAL_PASSWORD,
                         "security.zookeeper.digest": DIGEST, "remote.s3.region": "eu-west-1"}, env={})
    assert cfg.SECRET_KEYS == {"remote.s3.access-key", "remote.s3.secret-key", "security.password",
                               "security.internal.password", "security.zookeeper.digest"}
    assert not leaks(repr(config)) and "eu-west-1" in repr(config)
    assert not leaks(repr(config.redacted())) and config.redacted()["remote.s3.secret-key"] == REDACTED
    assert set(config.secrets()) >= set(SECRETS)
    path = tmp_path / "config.toml"
    path.write_text("")
    os.chmod(path, 0o644)
    cfg.write_file(path, config.as_dict())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert cfg.Config.load(path, env={})["remote.s3.secret-key"] == SECRET_KEY


def test_scrub_and_log_records_blank_registered_values(caplog):
    from kvlease.common.redaction import protect

    protect(["Sh0rt", "a-registered-credential-value"])
    assert scrub("x a-registered-credential-value y") == f"x {REDACTED} y"
    caplog.set_level(logging.DEBUG)
    log = logging.getLogger("some.library")
    log.debug("auth %s", "a-registered-credential-value")
    try:
        raise ValueError("bad a-registered-credential-value")
    except ValueError:
        log.exception("failed")
    assert "a-registered-credential-value" not in caplog.text and caplog.text.count(REDACTED) >= 2
