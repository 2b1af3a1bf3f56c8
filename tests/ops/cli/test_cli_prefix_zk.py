"""The real ``kvlease`` executable, run as a subprocess, against a real coordinator and tablet servers (in this
process) on a real ZooKeeper: ``table create --bucket-key``, ``describe`` showing it, ``put``, ``get --prefix``
answering exactly the rows of the prefix (the same as a ``scan`` filtered here), after updates and deletes;
and one-line errors for a bad bucket key or prefix."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.client.test_table_client_cluster import local_cluster  # noqa: F401 (fixture)
from tests.ops.cli.test_cli_schema_zk import CLI_ENV, KVLEASE

pytestmark = [pytest.mark.zk, pytest.mark.timeout(300)]

USERS = ["a", "ab", "a b", "b", "é"]


def test_get_prefix_end_to_end(local_cluster, tmp_path):
    cluster = local_cluster(2)
    walk_prefix_commands(cluster.coordinator.address, tmp_path)


def kvlease(address: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([KVLEASE, *args, "--bootstrap", address], capture_output=True, text=True, timeout=120,
                          env=CLI_ENV, stdin=subprocess.DEVNULL)
    if check:
        assert proc.returncode == 0, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def kvlease_json(address: str, *args: str) -> dict:
    return json.loads(kvlease(address, *args).stdout)


def one_line_error(address: str, *args: str, code: int) -> str:
    proc = kvlease(address, *args, check=False)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def walk_prefix_commands(c: str, tmp_path: Path) -> None:
    schema = ("--schema", "user STRING, seq BIGINT, v STRING", "--primary-key", "user,seq", "--buckets", "4")
    error = one_line_error(c, "table", "create", "db.bad", *schema, "--bucket-key", "seq", code=2)
    assert "bucket key (seq) is not a prefix of the primary key (user, seq)" in error
    error = one_line_error(c, "table", "create", "db.bad", *schema, "--bucket-key", "nope", code=2)
    assert "bucket key column 'nope' is not a column of the primary key" in error
    created = kvlease_json(c, "table", "create", "db.ev", *schema, "--bucket-key", "user", "--json")
    assert created["bucket_key"] == ["user"]
    assert "bucket key" in kvlease(c, "table", "describe", "db.ev").stdout

    lines = [json.dumps({"user": u, "seq": s, "v": f"{u}{s}"}) for u in USERS for s in range(30)]
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    kvlease(c, "put", "db.ev", str(tmp_path / "rows.jsonl"))
    kvlease(c, "delete", "db.ev", "ab,3", "ab,7", "b,0")
    (tmp_path / "more.jsonl").write_text(json.dumps({"user": "ab", "seq": 5, "v": "new"}) + "\n")
    kvlease(c, "put", "db.ev", str(tmp_path / "more.jsonl"))

    scanned = kvlease_json(c, "scan", "db.ev", "--json")["rows"]
    assert len(scanned) == len(USERS) * 30 - 3
    for user in ("a", "ab", "é"):  # "a" and "ab": one string a prefix of the other
        got = kvlease_json(c, "get", "db.ev", "--prefix", f"user={user}", "--json")
        wanted = sorted((r for r in scanned if r["user"] == user), key=lambda r: r["seq"])
        assert got["rows"] == wanted and got["found"] == len(wanted), user
        if user == "ab":  # seq 3 deleted, 5 updated
            assert [r["v"] for r in got["rows"]][2:5] == ["ab2", "ab4", "new"]
    assert "no rows with user=zz" in kvlease(c, "get", "db.ev", "--prefix", "user=zz").stdout

    error = one_line_error(c, "get", "db.ev", "--prefix", "seq=1", code=1)
    assert "column 'seq' is not in the bucket key (user)" in error
    error = one_line_error(c, "get", "db.ev", "--prefix", "nope=1", code=2)
    assert "table db.ev has no column 'nope'" in error
    error = one_line_error(c, "get", "db.ev", "a,1", "--prefix", "user=a", code=2)
    assert "not both" in error
    kvlease(c, "table", "create", "db.plain", *schema)
    error = one_line_error(c, "get", "db.plain", "--prefix", "user=a", code=1)
    assert "table db.plain has no bucket key" in error
