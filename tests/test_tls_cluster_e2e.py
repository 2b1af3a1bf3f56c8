"""``kvlease cluster start --secure``: mutual TLS everywhere, and the CLI connects with TLS on its own.

``--cluster D`` takes the client certificate from cluster.json; ``--bootstrap``
needs ``--ca-file``/``--cert-file``/``--key-file``; without them the CLI gets
an error naming TLS.
"""

from __future__ import annotations

import json

import pytest

from tests.test_cli_e2e import (  # noqa: F401 (cluster_dir is a fixture)
    cluster_dir, kvlease, kvlease_json, print_logs)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_secure_cluster_and_cli(cluster_dir, tmp_path):
    try:
        d = str(cluster_dir)
        kvlease("cluster", "start", "--dir", d, "--tablets", "1", "--secure")
        doc = json.loads((cluster_dir / "cluster.json").read_text())
        assert doc["security"]["client_auth"] is True
        config = (cluster_dir / "coordinator-1" / "config.toml").read_text()
        assert '"security.enabled" = true' in config and "node.pem" in config
        assert "node.pem" in (cluster_dir / "tablet-1" / "config.toml").read_text()

        c = ("--cluster", d)
        kvlease(*c, "table", "create", "db.t", "--schema", "id BIGINT, name STRING", "--primary-key", "id",
                "--buckets", "2")
        rows = tmp_path / "rows.jsonl"
        rows.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(1, 11)))
        assert kvlease_json(*c, "put", "db.t", str(rows), "--json") == {"table": "db.t", "rows": 10}
        assert "n7" in kvlease(*c, "get", "db.t", "7").stdout
        assert kvlease_json("cluster", "status", "--dir", d, "--json")["tablets"][0]["buckets"] == 2

        address = doc["coordinators"][0]["address"]
        sec = doc["security"]
        tls = ("--ca-file", sec["ca_file"], "--cert-file", sec["cert_file"], "--key-file", sec["key_file"])
        assert "db.t" in kvlease("--bootstrap", address, *tls, "table", "list").stdout
        plain = kvlease("--bootstrap", address, "--retry-timeout", "0s", "table", "list", check=False)
        assert plain.returncode == 1 and "TLS" in plain.stderr, plain.stderr
        assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr  # gRPC logs nothing of its own
        kvlease("cluster", "stop", "--dir", d)
    except BaseException:
        print_logs(cluster_dir)
        raise
