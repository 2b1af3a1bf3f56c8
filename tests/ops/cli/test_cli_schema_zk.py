"""``kvlease table alter`` (schema changes) and ``table describe`` (schema id, comments, history): the real
``kvlease`` executable, run as a subprocess, against a real coordinator (in this process) on a real
ZooKeeper. Refusals are one line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import coordinators

pytestmark = [pytest.mark.zk, pytest.mark.timeout(300)]

KVLEASE = str(Path(sys.executable).parent / "kvlease")
CLI_ENV = {k: v for k, v in os.environ.items() if not k.startswith("KVLEASE_")}


@pytest.fixture
def coordinator(make_config):
    with coordinators.serving(make_config()) as server:
        yield server


def kvlease(coordinator, *args: str, columns: int = 80) -> subprocess.CompletedProcess:
    return subprocess.run([KVLEASE, *args, "--bootstrap", coordinator.address], capture_output=True, text=True,
                          timeout=120, env={**CLI_ENV, "COLUMNS": str(columns)}, stdin=subprocess.DEVNULL)


def ok(coordinator, *args: str, columns: int = 80) -> str:
    proc = kvlease(coordinator, *args, columns=columns)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def one_line_error(coordinator, *args: str, code: int = 1) -> str:
    proc = kvlease(coordinator, *args)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_alter_each_change_and_describe_the_schema_and_its_history(coordinator):
    ok(coordinator, "table", "create", "shop.orders", "--schema", "id BIGINT, note STRING, qty INT",
       "--primary-key", "id", "--buckets", "1")
    said = ok(coordinator, "table", "alter", "shop.orders", "--add-column", "price BIGINT COMMENT 'in cents'")
    assert said.strip() == """altered table shop.orders: --add-column "price BIGINT COMMENT 'in cents'" (schema id 2)"""
    ok(coordinator, "table", "alter", "shop.orders", "--rename-column", "note", "remark")
    ok(coordinator, "table", "alter", "shop.orders", "--widen-column", "qty bigint")
    ok(coordinator, "table", "alter", "shop.orders", "--drop-column", "remark")
    doc = json.loads(ok(coordinator, "table", "alter", "shop.orders", "--comment", "one row per order", "--json"))
    assert doc["schema_id"] == 6 and doc["comment"] == "one row per order"
    described = json.loads(ok(coordinator, "table", "describe", "shop.orders", "--json"))
    assert described["schema"] == [{"name": "id", "type": "BIGINT", "id": 0}, {"name": "qty", "type": "BIGINT", "id": 2},
                                   {"name": "price", "type": "BIGINT", "id": 3, "comment": "in cents"}]
    assert [(v["schema_id"], v["change"]) for v in described["history"]] == [
        (1, "create"), (2, "add column price BIGINT"), (3, "rename column note to remark"),
        (4, "widen column qty INT to BIGINT"), (5, "drop column remark"), (6, "comment")]
    text = " ".join(ok(coordinator, "table", "describe", "shop.orders", columns=200).split())
    for shown in ("schema id 6", "comment one row per order", "price BIGINT 3 in cents", "schema history",
                  "widen column qty INT to BIGINT", "rename column note to remark"):
        assert shown in text, shown


def test_the_same_alter_again_answers_the_same_schema_id(coordinator):
    ok(coordinator, "table", "create", "db.t", "--schema", "id BIGINT, v STRING", "--primary-key", "id",
       "--buckets", "1")
    first = json.loads(ok(coordinator, "table", "alter", "db.t", "--add-column", "c INT", "--json"))
    again = json.loads(ok(coordinator, "table", "alter", "db.t", "--add-column", "c INT", "--json"))
    assert first["schema_id"] == again["schema_id"] == 2
    assert len(json.loads(ok(coordinator, "table", "describe", "db.t", "--json"))["history"]) == 2


def test_refusals_are_one_line_errors(coordinator):
    ok(coordinator, "table", "create", "db.t", "--schema", "id INT, v STRING, n BIGINT", "--primary-key", "id",
       "--buckets", "1")
    alter = ("table", "alter", "db.t")
    assert one_line_error(coordinator, *alter, "--widen-column", "n INT") == (
        "error: cannot change column n from BIGINT to INT: only a widening is allowed (TINYINT -> SMALLINT -> INT -> "
        "BIGINT, FLOAT -> DOUBLE, a DECIMAL's precision up with the same scale)")
    assert "column id of table db.t is a primary key column: it cannot be retyped" in one_line_error(
        coordinator, *alter, "--widen-column", "id BIGINT")
    assert "it cannot be renamed" in one_line_error(coordinator, *alter, "--rename-column", "id", "key")
    assert "it cannot be dropped" in one_line_error(coordinator, *alter, "--drop-column", "id")
    assert "table db.t has no column nope" in one_line_error(coordinator, *alter, "--drop-column", "nope")
    assert "column v exists already" in one_line_error(coordinator, *alter, "--add-column", "v BIGINT")
    assert "table db.nope does not exist" in one_line_error(coordinator, "table", "alter", "db.nope",
                                                            "--add-column", "c INT")
    # usage errors: nothing is sent
    assert "bad column type 'WHAT'" in one_line_error(coordinator, *alter, "--add-column", "c WHAT", code=2)
    assert "expected 'NAME TYPE" in one_line_error(coordinator, *alter, "--widen-column", "n", code=2)
    assert "one schema change at a time, and no other setting with it: got --add-column, --drop-column" in (
        one_line_error(coordinator, *alter, "--add-column", "c INT", "--drop-column", "v", code=2))
    assert json.loads(ok(coordinator, "table", "describe", "db.t", "--json"))["schema_id"] == 1
