"""What a newcomer meets with a local cluster, through the real ``kvlease`` executable: ``cluster start``
serves rows without options (one tablet server by default), and a stopped cluster started again keeps its
coordinators' and tablet servers' addresses (a port taken meanwhile is replaced, with a warning)."""

from __future__ import annotations

import json
import socket

import pytest

from kvlease.ops import local_cluster
from tests.ops.cli.test_cli_e2e import cluster_dir, kvlease, kvlease_json, print_logs  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def addresses(directory: str, role: str) -> list[str]:
    return [entry["address"] for entry in local_cluster.load(directory)[role]]


def test_default_cluster_serves_and_keeps_its_ports_across_a_restart(cluster_dir):  # noqa: F811
    d = str(cluster_dir)
    try:
        kvlease("cluster", "start", "--dir", d)
        assert len(local_cluster.load(d)["tablets"]) == 1
        created = kvlease("--cluster", d, "table", "create", "db.orders", "--schema", "id BIGINT, v STRING",
                          "--primary-key", "id", "--buckets", "2")
        assert "warning" not in created.stderr, created.stderr
        kvlease("--cluster", d, "put", "db.orders", "-", input='{"id": 1, "v": "one"}\n')
        put_csv_and_parquet_then_read_them_back(d, cluster_dir)
        coordinators, tablets = addresses(d, "coordinators"), addresses(d, "tablets")
        kvlease("cluster", "stop", "--dir", d)

        kvlease("cluster", "start", "--dir", d)
        assert (addresses(d, "coordinators"), addresses(d, "tablets")) == (coordinators, tablets)
        assert kvlease_json("--bootstrap", coordinators[0], "get", "db.orders", "1", "--json")["found"] == 1
        kvlease("cluster", "stop", "--dir", d)

        taken = int(tablets[0].rsplit(":", 1)[1])
        with socket.socket() as squatter:  # another process took the tablet server's port meanwhile
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the old server's TIME_WAIT
            squatter.bind(("127.0.0.1", taken))
            squatter.listen()
            started = kvlease("cluster", "start", "--dir", d)
            assert f"warning: tablet server 1: its port {taken} is taken now" in started.stderr, started.stderr
            assert addresses(d, "coordinators") == coordinators and addresses(d, "tablets") != tablets
            assert kvlease_json("--cluster", d, "get", "db.orders", "1", "--json")["found"] == 1
    except BaseException:
        print_logs(cluster_dir)
        raise


def put_csv_and_parquet_then_read_them_back(d: str, directory) -> None:
    """``put`` of a CSV and a Parquet file on a real cluster; ``scan`` in text form and ``log`` of every
    bucket show them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (directory / "rows.csv").write_text('id,v\n2,"two, with a comma"\n3,three\n')
    pq.write_table(pa.table({"id": pa.array([4, 5], pa.int32()), "v": ["four", None]}), directory / "rows.parquet")
    assert "wrote 2 row(s)" in kvlease("--cluster", d, "put", "db.orders", str(directory / "rows.csv")).stdout
    assert "wrote 2 row(s)" in kvlease("--cluster", d, "put", "db.orders", str(directory / "rows.parquet")).stdout
    got = kvlease_json("--cluster", d, "get", "db.orders", "2", "4", "5", "--json")["rows"]
    assert got == [{"id": 2, "v": "two, with a comma"}, {"id": 4, "v": "four"}, {"id": 5, "v": None}]
    piped = kvlease("--cluster", d, "put", "db.orders", "-", "--format", "parquet", input="x", check=False)
    assert piped.returncode == 2 and "Parquet is read from a file" in piped.stderr

    lines = kvlease("--cluster", d, "scan", "db.orders").stdout.splitlines()
    assert lines[0].split() == ["id", "v"] and len(lines) == 1 + 5 + 1
    assert any(line.split(None, 1) == ["5", "-"] for line in lines)  # null shown as '-'
    records = [json.loads(line) for line in kvlease("--cluster", d, "log", "db.orders").stdout.splitlines()]
    assert sorted(r["row"]["id"] for r in records) == [1, 2, 3, 4, 5]
    assert [r["bucket"] for r in records] == sorted(r["bucket"] for r in records)  # bucket by bucket
