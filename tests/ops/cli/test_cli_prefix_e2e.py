"""The real ``kvlease`` executable on a local cluster of real processes: ``table create --bucket-key``,
``describe`` showing it, ``put``, ``get --prefix`` answering exactly the rows of the prefix (the same as a
``scan`` filtered here), after updates and deletes; and one-line errors for a bad bucket key or prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ops.cli.test_cli_e2e import cluster_dir, kvlease, kvlease_json, print_logs  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

USERS = ["a", "ab", "a b", "b", "é"]


def test_get_prefix_end_to_end(cluster_dir, tmp_path):
    try:
        walk_prefix_commands(cluster_dir, tmp_path)
    except BaseException:
        print_logs(cluster_dir)
        raise


def one_line_error(*args: str, code: int) -> str:
    proc = kvlease(*args, check=False)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def walk_prefix_commands(cluster_dir: Path, tmp_path: Path) -> None:
    d = str(cluster_dir)
    kvlease("cluster", "start", "--dir", d, "--tablets", "2")
    c = ("--cluster", d)
    schema = ("--schema", "user STRING, seq BIGINT, v STRING", "--primary-key", "user,seq", "--buckets", "4")
    error = one_line_error(*c, "table", "create", "db.bad", *schema, "--bucket-key", "seq", code=2)
    assert "bucket key (seq) is not a prefix of the primary key (user, seq)" in error
    error = one_line_error(*c, "table", "create", "db.bad", *schema, "--bucket-key", "nope", code=2)
    assert "bucket key column 'nope' is not a column of the primary key" in error
    created = kvlease_json(*c, "table", "create", "db.ev", *schema, "--bucket-key", "user", "--json")
    assert created["bucket_key"] == ["user"]
    assert "bucket key" in kvlease(*c, "table", "describe", "db.ev").stdout

    lines = [json.dumps({"user": u, "seq": s, "v": f"{u}{s}"}) for u in USERS for s in range(30)]
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    kvlease(*c, "put", "db.ev", str(tmp_path / "rows.jsonl"))
    kvlease(*c, "delete", "db.ev", "ab,3", "ab,7", "b,0")
    (tmp_path / "more.jsonl").write_text(json.dumps({"user": "ab", "seq": 5, "v": "new"}) + "\n")
    kvlease(*c, "put", "db.ev", str(tmp_path / "more.jsonl"))

    scanned = kvlease_json(*c, "scan", "db.ev", "--json")["rows"]
    assert len(scanned) == len(USERS) * 30 - 3
    for user in ("a", "ab", "é"):  # "a" and "ab": one string a prefix of the other
        got = kvlease_json(*c, "get", "db.ev", "--prefix", f"user={user}", "--json")
        wanted = sorted((r for r in scanned if r["user"] == user), key=lambda r: r["seq"])
        assert got["rows"] == wanted and got["found"] == len(wanted), user
        if user == "ab":  # seq 3 deleted, 5 updated
            assert [r["v"] for r in got["rows"]][2:5] == ["ab2", "ab4", "new"]
    assert "no rows with user=zz" in kvlease(*c, "get", "db.ev", "--prefix", "user=zz").stdout

    error = one_line_error(*c, "get", "db.ev", "--prefix", "seq=1", code=1)
    assert "column 'seq' is not in the bucket key (user)" in error
    error = one_line_error(*c, "get", "db.ev", "--prefix", "nope=1", code=2)
    assert "table db.ev has no column 'nope'" in error
    error = one_line_error(*c, "get", "db.ev", "a,1", "--prefix", "user=a", code=2)
    assert "not both" in error
    kvlease(*c, "table", "create", "db.plain", *schema)
    error = one_line_error(*c, "get", "db.plain", "--prefix", "user=a", code=1)
    assert "table db.plain has no bucket key" in error
    kvlease("cluster", "stop", "--dir", d)

