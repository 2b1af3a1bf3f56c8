"""``kvlease table create --merge-engine …``, ``table describe``, ``kvlease put --partial`` and ``--retract``: the
real ``kvlease`` executable, run as a subprocess, against a real coordinator and tablet server (in this process)
on a real ZooKeeper. Bad options are one line on stderr, never a traceback."""

from __future__ import annotations

import json

import pytest

from kvlease.client.table import TableClient
from tests.client.test_table_client_cluster import local_cluster  # noqa: F401 (fixture)
from tests.ops.cli.test_cli_schema_zk import kvlease

pytestmark = [pytest.mark.zk, pytest.mark.timeout(300)]


def ok(server, *args: str, stdin: str | None = None) -> str:
    proc = kvlease(server, *args, columns=200) if stdin is None else _with_input(server, stdin, *args)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def one_line_error(server, *args: str, code: int = 1, stdin: str | None = None) -> str:
    proc = kvlease(server, *args) if stdin is None else _with_input(server, stdin, *args)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def _with_input(server, stdin: str, *args: str):
    import subprocess

    from tests.ops.cli.test_cli_schema_zk import CLI_ENV, KVLEASE
    return subprocess.run([KVLEASE, *args, "--bootstrap", server.address], capture_output=True, text=True,
                          timeout=120, env=CLI_ENV, input=stdin)


def test_create_describe_put_partial_and_retract(local_cluster):
    cluster = local_cluster(1)
    coordinator = cluster.coordinator
    created = json.loads(ok(coordinator, "table", "create", "shop.sales", "--schema",
                            "id BIGINT, total BIGINT, hits INT, who STRING, note STRING", "--primary-key", "id",
                            "--buckets", "2", "--merge-engine", "aggregation", "--agg", "total=sum", "--agg",
                            "hits=sum", "--agg", "who=listagg", "--agg", "note=last_value", "--delete-behavior", "disable",
                            "--json"))
    assert created["merge_engine"] == {"kind": "aggregation", "aggregates": {"total": "sum", "hits": "sum",
                                                                             "who": "listagg", "note": "last_value"},
                                       "delete_behavior": "disable"}
    assert "aggregation (total=sum, hits=sum, who=listagg, note=last_value, deletes disable)" in ok(
        coordinator, "table", "describe", "shop.sales")
    ok(coordinator, "put", "shop.sales", stdin='{"id": 1, "total": 10, "hits": 1, "who": "ann", "note": "a"}\n'
                                               '{"id": 2, "total": 3, "hits": 1, "who": "bob", "note": "b"}\n')
    # 1: only total written (note kept); 2: note written as null (last_value takes it; total kept)
    ok(coordinator, "put", "shop.sales", "--partial", stdin='{"id": 1, "total": 5}\n{"id": 2, "note": null}\n')
    said = ok(coordinator, "put", "shop.sales", "--retract", stdin='{"id": 1, "total": 4, "hits": 1}\n')
    assert said.strip() == "retracted 1 row(s) from shop.sales"
    with TableClient(cluster.admin, "shop.sales") as client:
        assert client.lookup([1, 2]) == [{"id": 1, "total": 11, "hits": 0, "who": "ann", "note": "a"},
                                         {"id": 2, "total": 3, "hits": 1, "who": "bob", "note": None}]
    assert "column 'who': listagg cannot take a retract" in one_line_error(
        coordinator, "put", "shop.sales", "--retract", stdin='{"id": 1, "who": "ann"}\n')
    assert "refuses deletes" in one_line_error(coordinator, "delete", "shop.sales", "1")
