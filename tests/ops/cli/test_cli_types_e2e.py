"""Every column type through the real ``kvlease`` executable and a local cluster: ``table create --schema``,
``put`` from JSON lines, CSV and Parquet, ``get``/``scan``/``log --json`` (the JSON forms of docs/schemas.md),
and clear one-line errors for a nested primary key and a DECIMAL that does not fit."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ops.cli.test_cli_e2e import cluster_dir, kvlease, kvlease_json, print_logs  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCHEMA = ("id BIGINT, amount DECIMAL(12,2), big DECIMAL(30,4), day DATE, at TIMESTAMP, local TIMESTAMP_NTZ, "
          "tod TIME, f FLOAT, t8 TINYINT, s16 SMALLINT, raw BYTES, tags ARRAY<STRING>, attrs MAP<STRING,BIGINT>, "
          "im MAP<INT,STRING>, line STRUCT<sku STRING, qty INT, when DATE>")
#: A JSON line of every type, and how ``--json`` prints it back.
JSON_IN = ('{"id": 1, "amount": "12.50", "big": 12345678901234567890.1234, "day": "1969-07-20", '
           '"at": "2026-03-01T12:00:00.000001+02:00", "local": "2026-03-01T12:00:00.5", "tod": "23:59:59.999999", '
           '"f": 1.5, "t8": -128, "s16": 32767, "raw": "AAH/", "tags": ["a", null], "attrs": {"n": 1}, '
           '"im": [[3, "three"]], "line": {"sku": "s1", "when": "2000-01-02"}}')
JSON_OUT = {"id": 1, "amount": "12.50", "big": "12345678901234567890.1234", "day": "1969-07-20",
            "at": "2026-03-01T10:00:00.000001", "local": "2026-03-01T12:00:00.500000", "tod": "23:59:59.999999",
            "f": 1.5, "t8": -128, "s16": 32767, "raw": "AAH/", "tags": ["a", None], "attrs": {"n": 1},
            "im": [[3, "three"]], "line": {"sku": "s1", "qty": None, "when": "2000-01-02"}}


def test_every_type_through_the_cli(cluster_dir, tmp_path):
    try:
        walk(cluster_dir, tmp_path)
    except BaseException:
        print_logs(cluster_dir)
        raise


def walk(cluster_dir: Path, tmp_path: Path) -> None:
    d = str(cluster_dir)
    kvlease("cluster", "start", "--dir", d, "--tablets", "1")
    c = ("--cluster", d)
    nested_key = kvlease(*c, "table", "create", "db.bad", "--schema", "k ARRAY<INT>, v INT", "--primary-key", "k",
                         "--buckets", "1",
                         check=False)
    assert nested_key.returncode == 2 and "a key column cannot be an ARRAY, a MAP or a STRUCT" in nested_key.stderr
    kvlease(*c, "table", "create", "db.o", "--schema", SCHEMA, "--primary-key", "id", "--buckets", "2")

    lines = tmp_path / "rows.jsonl"
    lines.write_text(JSON_IN + "\n" + '{"id": 2, "amount": 0.1, "im": {"7": "seven"}}\n')
    assert kvlease_json(*c, "put", "db.o", str(lines), "--json") == {"table": "db.o", "rows": 2}
    got = kvlease_json(*c, "get", "db.o", "1", "2", "--json")["rows"]
    assert got[0] == JSON_OUT
    assert got[1]["amount"] == "0.10" and got[1]["im"] == [[7, "seven"]] and got[1]["day"] is None

    csv = tmp_path / "rows.csv"
    csv.write_text('id,amount,day,at,tod,tags,attrs,line\n'
                   '3,-7.25,0001-01-01,2026-01-01T00:00:00,00:00:00,"[""x"",""y""]","{""k"": 5}","{""qty"": 4}"\n')
    assert kvlease_json(*c, "put", "db.o", str(csv), "--json") == {"table": "db.o", "rows": 1}
    row3 = kvlease_json(*c, "get", "db.o", "3", "--json")["rows"][0]
    assert (row3["amount"], row3["day"], row3["at"], row3["tod"]) == (
        "-7.25", "0001-01-01", "2026-01-01T00:00:00.000000", "00:00:00.000000")
    assert (row3["tags"], row3["attrs"], row3["line"]) == (["x", "y"], {"k": 5}, {"sku": None, "qty": 4,
                                                                                    "when": None})

    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({
        "id": pa.array([4], pa.int32()), "amount": pa.array([Decimal("99.9")], pa.decimal128(5, 1)),
        "day": pa.array([19000], pa.date32()), "s16": pa.array([-3], pa.int8()),
        "tags": pa.array([["p"]], pa.list_(pa.string())),
        "line": pa.array([{"sku": "q", "qty": 1, "when": None}],
                         pa.struct([("sku", pa.string()), ("qty", pa.int32()), ("when", pa.date32())]))}), parquet)
    assert kvlease_json(*c, "put", "db.o", str(parquet), "--json") == {"table": "db.o", "rows": 1}
    row4 = kvlease_json(*c, "get", "db.o", "4", "--json")["rows"][0]
    assert (row4["amount"], row4["day"], row4["s16"], row4["tags"], row4["line"]) == (
        "99.90", "2022-01-08", -3, ["p"], {"sku": "q", "qty": 1, "when": None})

    scanned = {r["id"]: r for r in kvlease_json(*c, "scan", "db.o", "--json")["rows"]}
    assert sorted(scanned) == [1, 2, 3, 4] and scanned[1] == JSON_OUT
    logged = [json.loads(line)["row"] for b in (0, 1)
              for line in kvlease(*c, "log", "db.o", "--bucket", str(b)).stdout.splitlines()]
    assert {r["id"]: r for r in logged}[1] == JSON_OUT

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 5, "amount": "1.234"}\n')
    failed = kvlease(*c, "put", "db.o", str(bad), check=False)
    assert failed.returncode == 1 and len(failed.stderr.strip().splitlines()) == 1
    assert "column 'amount'" in failed.stderr and "does not fit DECIMAL(12,2)" in failed.stderr
    kvlease("cluster", "stop", "--dir", d)
