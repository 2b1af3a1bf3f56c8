"""The real ``kvlease`` executable scanning a live table: ``scan --json`` shape and content,
``--bucket``, ``--limit``, the text table, the offsets handing over to ``log``.

``cluster start --tablets 1``, a 3-bucket table, rows through ``put``, then
``scan``. The fixture stops (and at last kills) whatever the test left
running; the logs are printed when the test fails.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from kvlease.ops import local_cluster
from tests.ops.cli.test_cli_e2e import cluster_dir, kvlease, kvlease_json, print_logs, recorded_pids  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_cli_scan_end_to_end(cluster_dir, tmp_path):
    try:
        walk_scan(cluster_dir, tmp_path)
    except BaseException:
        print_logs(cluster_dir)
        raise


def walk_scan(cluster_dir: Path, tmp_path: Path) -> None:
    d = str(cluster_dir)
    kvlease("cluster", "start", "--dir", d, "--tablets", "1")
    c = ("--cluster", d)
    kvlease(*c, "table", "create", "db.s", "--schema", "id BIGINT, name STRING, raw BYTES",
            "--primary-key", "id", "--buckets", "3")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "name": f"n{i}", "raw": "AAE="}) + "\n" for i in range(500)))
    kvlease(*c, "put", "db.s", str(rows))
    kvlease(*c, "delete", "db.s", "7", "8")

    doc = kvlease_json(*c, "scan", "db.s", "--json")
    assert list(doc) == ["table", "rows", "log_offsets"] and doc["table"] == "db.s"
    assert sorted(r["id"] for r in doc["rows"]) == [i for i in range(500) if i not in (7, 8)]
    assert doc["rows"][0].keys() == {"id", "name", "raw"} and all(r["raw"] == "AAE=" for r in doc["rows"])
    assert sorted(doc["log_offsets"]) == ["0", "1", "2"]
    # a bucket's offset is where its log ends (nothing written since): the log continues from there
    for bucket, offset in doc["log_offsets"].items():
        log = kvlease_json(*c, "log", "db.s", "--bucket", bucket, "--json")
        assert log["log_end_offset"] == offset

    one = kvlease_json(*c, "scan", "db.s", "--bucket", "1", "--json")
    assert list(one["log_offsets"]) == ["1"] and 0 < len(one["rows"]) < len(doc["rows"])
    assert {r["id"] for r in one["rows"]} <= {r["id"] for r in doc["rows"]}

    limited = kvlease_json(*c, "scan", "db.s", "--limit", "10", "--json")
    assert len(limited["rows"]) == 10 and len({r["id"] for r in limited["rows"]}) == 10
    both = kvlease_json(*c, "scan", "db.s", "--bucket", "2", "--limit", "3", "--json")
    assert len(both["rows"]) == 3 and list(both["log_offsets"]) == ["2"]

    text = kvlease(*c, "scan", "db.s", "--limit", "5")
    assert "name" in text.stdout and "log offsets" in text.stdout and text.stderr == ""

    bad = kvlease(*c, "scan", "db.s", "--bucket", "3", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "buckets 0..2" in bad.stderr
    missing = kvlease(*c, "scan", "db.nope", "--json", check=False)
    assert missing.returncode == 1 and missing.stdout == ""
    assert kvlease(*c, "scan", "db.s", "--limit", "0", check=False).returncode == 2

    # the tablet server's metrics, at the address cluster.json names: the scans above were counted
    tablet = json.loads((cluster_dir / "cluster.json").read_text())["tablets"][0]
    with urllib.request.urlopen(f"http://{tablet['metrics_address']}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    opened = [line for line in metrics.splitlines() if line.startswith("kvlease_scanners_opened_total ")]
    assert opened and float(opened[0].split()[1]) >= 3, metrics
    assert "kvlease_scanners_open " in metrics and "kvlease_scan_rows_total " in metrics

    kvlease("cluster", "stop", "--dir", d)
    assert not any(local_cluster.pid_alive(pid) for pid in recorded_pids(cluster_dir))
