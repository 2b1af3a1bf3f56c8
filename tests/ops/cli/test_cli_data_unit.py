"""The kvlease data commands (put/get/delete/log, snapshot trigger) against a fake
TableClient, and the parsing of keys and column values, without a cluster."""

from __future__ import annotations

import io
import json
import math
from datetime import datetime

import pytest
from click.testing import CliRunner
from rich.console import Console

from kvlease.client.log_position import LogPosition
from kvlease.common import errors
from kvlease.common.tables import Column, TableInfo
from kvlease.ops.cli import output as out
from kvlease.ops.cli import changelog, data, kvlease, values
from kvlease.ops.cli.app import State
from tests.support.cli_runner import NO_ENV, FakeTableClient, assert_one_line_error

pytestmark = pytest.mark.unit


WIDE = TableInfo(9, "db", "w", (Column("id", "BIGINT"), Column("name", "STRING"), Column("ts", "TIMESTAMP"),
                                Column("b", "BYTES"), Column("ok", "BOOLEAN"), Column("d", "DOUBLE")), ("id",), 2)
PAIR = TableInfo(10, "db", "p", (Column("a", "INT"), Column("s", "STRING"), Column("v", "STRING")), ("a", "s"), 2)


@pytest.mark.parametrize("text, table, expected", [
    ("-5", WIDE, {"id": -5}),
    (" 12 ", WIDE, {"id": 12}),
    ("7,abc", PAIR, {"a": 7, "s": "abc"}),
    ('[7, "a,b"]', PAIR, {"a": 7, "s": "a,b"}),
    ('["7", "x"]', PAIR, {"a": 7, "s": "x"}),
    ("7,", PAIR, {"a": 7, "s": ""}),
])
def test_parse_key(text, table, expected):
    assert values.parse_key(text, table) == expected


@pytest.mark.parametrize("text, table, message", [
    ("abc", WIDE, "column 'id': expected BIGINT, got 'abc'"),
    ("1.5", WIDE, "column 'id': expected BIGINT"),
    ("9223372036854775808", WIDE, "out of range for BIGINT"),
    ("7", PAIR, "2 column(s) (a, s), got 1"),
    ("1,2,3", PAIR, "got 3 value(s)"),
    ("2147483648,x", PAIR, "column 'a': 2147483648 is out of range for INT"),
    ("[7, null]", PAIR, "column 's': a primary key value cannot be null"),
    ("[7, x", PAIR, "not a JSON array"),
])
def test_parse_key_errors_name_the_column(text, table, message):
    with pytest.raises(ValueError) as info:
        values.parse_key(text, table)
    assert message in str(info.value)


def test_convert_value_by_type():
    assert values.convert_value("true", "BOOLEAN") is True and values.convert_value(False, "BOOLEAN") is False
    assert values.convert_value("2024-01-02T03:04:05", "TIMESTAMP") == datetime(2024, 1, 2, 3, 4, 5)
    assert values.convert_value("1700000000000000", "TIMESTAMP") == 1_700_000_000_000_000
    assert values.convert_value("aGk=", "BYTES") == b"hi"
    assert values.convert_value(3, "DOUBLE") == 3.0 and math.isnan(values.convert_value("nan", "DOUBLE"))
    for value, type_ in (("maybe", "BOOLEAN"), (True, "BIGINT"), ("x", "DOUBLE"), (5, "STRING"),
                         ("not base64!", "BYTES"), ("yesterday", "TIMESTAMP")):
        with pytest.raises(ValueError):
            values.convert_value(value, type_)


def test_json_values_of_rows():
    doc = out.rows_doc("db.w", ["1", "2"], [
        {"id": 1, "ts": datetime(2024, 1, 2, 3, 4, 5), "b": b"hi", "d": float("nan"), "e": float("-inf")}, None])
    assert doc == {"table": "db.w", "keys": ["1", "2"], "found": 1, "rows": [
        {"id": 1, "ts": "2024-01-02T03:04:05.000000", "b": "aGk=", "d": "NaN", "e": "-Infinity"}, None]}
    json.dumps(doc, allow_nan=False)


@pytest.fixture
def fake_table(monkeypatch):
    clients = {}

    def table_client(self, path):
        table = {"db.w": WIDE, "db.p": PAIR}.get(path)
        if table is None:
            raise errors.TableNotExistError(f"table {path} does not exist")
        return clients.setdefault(path, FakeTableClient(table))

    monkeypatch.setattr(State, "table_client", table_client)
    return clients


def run_in(*args: str, input: str | None = None):
    return CliRunner().invoke(kvlease, ["--bootstrap", "127.0.0.1:1", *args], input=input, env=NO_ENV,
                              prog_name="kvlease")


def test_put_takes_back_the_nan_and_infinities_that_get_prints(fake_table):
    lines = ['{"id": 1, "d": "NaN"}', '{"id": 2, "d": "Infinity"}', '{"id": 3, "d": "-Infinity"}', '{"id": 4, "d": 2.5}']
    assert run_in("put", "db.w", input="\n".join(lines) + "\n").exit_code == 0
    stored = {row["id"]: row["d"] for batch in fake_table["db.w"].upserts for row in batch}
    assert math.isnan(stored[1]) and stored[2] == math.inf and stored[3] == -math.inf and stored[4] == 2.5
    printed = run_in("get", "db.w", "1", "2", "3", "4", "--json")
    assert printed.exit_code == 0, printed.output
    rows = json.loads(printed.stdout)["rows"]
    assert [row["d"] for row in rows] == ["NaN", "Infinity", "-Infinity", 2.5]
    again = run_in("put", "db.w", input="\n".join(json.dumps({"id": r["id"] + 10, "d": r["d"]}) for r in rows) + "\n")
    assert again.exit_code == 0, again.output
    stored = {row["id"]: row["d"] for batch in fake_table["db.w"].upserts for row in batch}
    assert math.isnan(stored[11]) and stored[12] == math.inf and stored[13] == -math.inf and stored[14] == 2.5


def test_put_reads_json_lines_in_batches(fake_table, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1, "name": "a", "ts": "2024-01-02T03:04:05", "b": "aGk="}\n\n{"id": 2}\n'
                    '{"id": 3, "ok": true, "d": 1}\n')
    result = run_in("put", "db.w", str(path), "--batch-size", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"table": "db.w", "rows": 3}
    client = fake_table["db.w"]
    assert [len(b) for b in client.upserts] == [2, 1]
    assert client.rows[(1,)]["ts"] == datetime(2024, 1, 2, 3, 4, 5) and client.rows[(1,)]["b"] == b"hi"
    result = run_in("put", "db.w", input='{"id": 4}\n')  # stdin
    assert result.exit_code == 0 and "wrote 1 row(s) to db.w" in result.stdout


@pytest.mark.parametrize("lines, message, written", [
    (['{"id": 1}', '{"id": 2}', '{"id": "x"}'], "line 3, column 'id': expected BIGINT, got 'x'", [1, 2]),
    (['{"id": 1}', '{"id": 2}', "", '{"id": 3', '{"id": 5}'], "line 4: not valid JSON", [1, 2]),
    (['{"id": 1}', '[1, 2]'], "line 2: expected a JSON object", []),
    (['{"id": 1}', '{"id": 2, "zzz": 1}'], "line 2, column 'zzz': unknown column", []),
    (['{"id": 1}', '{"name": "no key"}'], "line 2, column 'id': primary key is missing", []),
    (['{"id": 1}', '{"id": 2, "ts": "soon"}'], "line 2, column 'ts': expected ISO-8601", []),
    (['{"id": 1}', '{"id": 2}', '{"id": 3}', '{"id": 9999999999999999999}'],
     "line 4, column 'id': 9999999999999999999 is out of range for BIGINT (-9223372036854775808..", [1, 2]),
    (['{"id": 1, "d": "nan"}'], "line 1, column 'd': expected DOUBLE, got 'nan'", []),  # only what get prints
])
def test_put_names_the_bad_line_and_writes_nothing_of_its_batch(fake_table, lines, message, written):
    result = run_in("put", "db.w", "--batch-size", "2", input="\n".join(lines) + "\n")
    error = assert_one_line_error(result)
    assert message in error
    assert f"{len(written)} row(s) before" in error
    client = fake_table["db.w"]
    assert [row["id"] for batch in client.upserts for row in batch] == written  # the bad line's batch: nothing


def test_put_reads_csv_by_extension_converting_to_the_column_types(fake_table, tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('id,name,ts,b,ok,d\n1,"a, ""quoted""\nline",2024-01-02T03:04:05,aGk=,true,NaN\n'
                    '\n2,,,,,\n3,x,1700000000000000,,no,-2.5\n')
    result = run_in("put", "db.w", str(path), "--batch-size", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"table": "db.w", "rows": 3}
    client = fake_table["db.w"]
    assert [len(b) for b in client.upserts] == [2, 1]
    one, two, three = (client.rows[(k,)] for k in (1, 2, 3))
    assert one["name"] == 'a, "quoted"\nline' and one["ts"] == datetime(2024, 1, 2, 3, 4, 5)
    assert one["b"] == b"hi" and one["ok"] is True and math.isnan(one["d"])
    assert two == {"id": 2, "name": "", "ts": None, "b": None, "ok": None, "d": None}  # empty: null, "" for STRING
    assert three["ts"] == datetime(2023, 11, 14, 22, 13, 20) and three["ok"] is False and three["d"] == -2.5
    result = run_in("put", "db.w", "-", "--format", "csv", input="id,name\n4,four\n")  # stdin with --format
    assert result.exit_code == 0 and fake_table["db.w"].rows[(4,)]["name"] == "four", result.output


@pytest.mark.parametrize("text, message, written", [
    ('id,name\n1,"two\nlines"\n2,b\nx,c\n', "line 5, column 'id': expected BIGINT, got 'x'", [1, 2]),
    ("id,name\n1,a\n2,b\n3\n", "line 4: 1 value(s), but the header names 2 column(s)", [1, 2]),
    ("id,zzz\n1,a\n", "line 1 (the header), column 'zzz': unknown column (table db.w has id, name", []),
    ("name\na\n", "line 1 (the header): primary key column(s) id missing", []),
    ("id,ok\n1,true\n2,maybe\n", "line 3, column 'ok': expected BOOLEAN, got 'maybe'", []),
    ("id\n1\n2\n3\n99999999999999999999\n", "line 5, column 'id': 99999999999999999999 is out of range", [1, 2]),
])
def test_put_csv_names_the_bad_line_and_column(fake_table, tmp_path, text, message, written):
    path = tmp_path / "rows.csv"
    path.write_text(text)
    error = assert_one_line_error(run_in("put", "db.w", str(path), "--batch-size", "2"))
    assert message in error and f"the {len(written)} row(s) before" in error
    assert [row["id"] for batch in fake_table.get("db.w", FakeTableClient(WIDE)).upserts for row in batch] == written


def test_put_reads_parquet_casting_to_the_column_types(fake_table, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int32()), "name": ["a", None, "c"],
                             "ts": pa.array([0, 1_000, None], pa.timestamp("ms", tz="UTC"))}), path)
    result = run_in("put", "db.w", str(path), "--batch-size", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"table": "db.w", "rows": 3}
    client = fake_table["db.w"]
    assert [len(b) for b in client.upserts] == [2, 1]
    assert client.rows[(2,)]["ts"] == datetime(1970, 1, 1, 0, 0, 1) and client.rows[(2,)]["name"] is None

    bad = tmp_path / "bad.pq"
    pq.write_table(pa.table({"id": ["4", "5", "6", "x"]}), bad)
    error = assert_one_line_error(run_in("put", "db.w", str(bad), "--batch-size", "2"))
    assert "row 4, column 'id': 'x' is not a BIGINT value (the file's type: string)" in error
    assert "the 2 row(s) before row 3 were written" in error
    not_parquet = tmp_path / "rows.txt"
    not_parquet.write_text('{"id": 1}\n')
    assert "not a Parquet file" in assert_one_line_error(run_in("put", "db.w", str(not_parquet), "--format", "parquet"))


def test_put_progress_knows_how_far_through_the_file_it_is(tmp_path):
    from kvlease.ops.cli.put_sources import Reader

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"id": {i}}}\n' for i in range(100)))
    with open(path, "rb") as source:
        reader = Reader(source, "jsonl", WIDE, 50)
        seen = [(len(rows), reader.fraction()) for rows, _where in reader]
    assert [n for n, _ in seen] == [50, 50] and 0 < seen[0][1] <= seen[1][1] == 1.0
    assert data._progress("db.w", 50_000, 0.5) == "db.w: 50,000 rows written (50% of the input) …"


def test_get_and_delete(fake_table):
    fake_table.setdefault("db.p", FakeTableClient(PAIR)).rows[(7, "a,b")] = {"a": 7, "s": "a,b", "v": "x"}
    result = run_in("get", "db.p", '[7, "a,b"]', "8,z", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"table": "db.p", "keys": ['[7, "a,b"]', "8,z"], "found": 1,
                                         "rows": [{"a": 7, "s": "a,b", "v": "x"}, None]}
    text = run_in("get", "db.p", '[7, "a,b"]', "8,z").stdout
    assert "a,b" in text and "not found: 8,z" in text
    result = run_in("delete", "db.p", '[7, "a,b"]', "8,z", "--json")
    assert json.loads(result.stdout) == {"table": "db.p", "keys": 2, "deleted": 1}
    assert "-5" in run_in("get", "db.w", "-5").stdout  # negative keys are not options


@pytest.mark.parametrize("args, message", [
    (("get", "db.w", "abc"), "'abc': column 'id': expected BIGINT"),
    (("delete", "db.p", "1"), "the primary key has 2 column(s)"),
    (("get", "db.w"), "Missing argument"),
])
def test_bad_keys_are_usage_errors(fake_table, args, message):
    result = run_in(*args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_get_unknown_table_is_one_line(fake_table):
    assert "table db.nope does not exist" in assert_one_line_error(run_in("get", "db.nope", "1"))


def test_log_prints_json_lines_up_to_the_end(fake_table):
    result = run_in("log", "db.w", "--bucket", "1")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["offset"] for r in lines] == [2, 3, 4]  # from the earliest kept offset
    assert lines[0] == {"offset": 2, "change_type": "+I", "timestamp": "2023-11-14T22:13:20.002Z",
                        "row": {"id": 2, "name": "n2"}}
    doc = json.loads(run_in("log", "db.w", "--bucket", "0", "--from", "3", "--json").stdout)
    assert doc["from_offset"] == 3 and doc["log_end_offset"] == 5 and [r["offset"] for r in doc["records"]] == [3, 4]
    assert doc["records"][0] == {"offset": 3, "change_type": "+I", "timestamp": 1_700_000_000_003,
                                 "row": {"id": 3, "name": "n3"}}
    assert run_in("log", "db.w", "--bucket", "0", "--follow", "--json").exit_code == 2
    assert "buckets 0..1, not 2" in assert_one_line_error(run_in("log", "db.w", "--bucket", "2"))


def test_log_fences_each_fetch_after_the_first_by_the_epoch_of_the_last_entry_read(fake_table):
    assert run_in("log", "db.w", "--bucket", "1").exit_code == 0
    client = fake_table["db.w"]
    assert client.fetches == [2, 4] and client.epochs_sent == [None, 3]  # nothing below the earliest offset
    client.fetches, client.epochs_sent = [], []
    assert run_in("log", "db.w", "--bucket", "1", "--from", "3").exit_code == 0
    assert client.fetches == [3] and client.epochs_sent == [3]  # a start inside the log: the epoch below it


def test_log_stops_with_one_line_when_offsets_it_printed_were_lost(fake_table, monkeypatch):
    def refused(self, bucket, position, max_bytes=0, max_wait_ms=0):
        if position.epoch is not None:
            raise errors.DataLostError("bucket 1 of db.w: offsets 2..3 this reader read (the last under leader "
                                       "epoch 3) are not in the bucket's log any more")
        return self.records[2:4], 5, LogPosition(4, 3)

    monkeypatch.setattr(FakeTableClient, "fetch_log_from", refused)
    result = run_in("log", "db.w", "--bucket", "1")
    assert [json.loads(line)["offset"] for line in result.stdout.splitlines()] == [2, 3]
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line] == [
        "error: bucket 1 of db.w: offsets 2..3 this reader read (the last under leader epoch 3) are not in the "
        "bucket's log any more"]


def test_log_without_bucket_reads_every_bucket_in_order(fake_table):
    result = run_in("log", "db.w")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["bucket"], r["offset"]) for r in lines] == [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
    assert lines[0] == {"bucket": 0, "offset": 2, "change_type": "+I", "timestamp": "2023-11-14T22:13:20.002Z",
                        "row": {"id": 2, "name": "n2"}}
    doc = json.loads(run_in("log", "db.w", "--from-timestamp", "1700000000003", "--json").stdout)
    assert doc["table"] == "db.w" and [b["bucket"] for b in doc["buckets"]] == [0, 1]
    assert [(b["from_offset"], b["log_end_offset"], [r["offset"] for r in b["records"]]) for b in doc["buckets"]] \
        == [(3, 5, [3, 4]), (3, 5, [3, 4])]


def test_log_follow_without_bucket_long_polls_every_bucket_in_turn(fake_table, monkeypatch):
    fetched, polls = [], []
    fetch_log = FakeTableClient.fetch_log

    def fetch(self, bucket, from_offset, max_bytes=0):
        fetched.append((bucket, from_offset))
        return fetch_log(self, bucket, from_offset, max_bytes)

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(FakeTableClient, "fetch_log", fetch)
    monkeypatch.setattr(changelog.time, "sleep", sleep)
    result = run_in("log", "db.w", "--follow", "--poll-interval", "50ms")
    assert result.exit_code == 130, result.output
    assert [(r["bucket"], r["offset"]) for r in map(json.loads, result.stdout.splitlines())] == \
        [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
    assert fetched[-2:] == [(0, 5), (1, 5)] and fake_table["db.w"].waits_sent == [0] * 4 + [25, 25]  # then follow
    assert polls == [pytest.approx(0.025, abs=0.01)] * 2  # answered at once (an old server): it sleeps, never spins


@pytest.mark.parametrize("when, first", [
    ("1700000000003", 3), ("2023-11-14T22:13:20.002Z", 2), ("2023-11-14T22:13:20.0025", 3),
    ("2023-11-14T23:13:20.001+01:00", 1), ("2030-01-01", None), ("0", 1)])
def test_log_from_timestamp_starts_at_the_first_record_at_or_after_it(fake_table, when, first):
    result = run_in("log", "db.w", "--bucket", "0", "--from-timestamp", when, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["offset"] for r in doc["records"]] == ([] if first is None else list(range(first, 5)))


@pytest.mark.parametrize("args, message", [
    (("--from-timestamp", "yesterday"), "neither ms since the epoch nor an ISO-8601 time"),
    (("--from-timestamp", "1969-12-31T23:59:59Z"), "before 1970"),
    (("--from-timestamp", "5", "--from", "1"), "not both"),
])
def test_log_from_timestamp_usage_errors(fake_table, args, message):
    result = run_in("log", "db.w", "--bucket", "0", *args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_log_follow_ended_by_ctrl_c_exits_130(fake_table, monkeypatch):
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(changelog.time, "sleep", sleep)
    result = run_in("log", "db.w", "--bucket", "0", "--from", "0", "--follow", "--poll-interval", "50ms")
    assert result.exit_code == 130, result.output
    assert result.stderr == "error: interrupted\n"
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["offset"] for line in lines] == [0, 1, 2, 3, 4]
    assert lines[0]["timestamp"] is None and lines[1]["timestamp"] == "2023-11-14T22:13:20.001Z"  # v1: no time
    assert polls == [pytest.approx(0.05, abs=0.01)] * 3  # an empty answer sooner than the wait: no spin


@pytest.mark.parametrize("json_mode", [False, True])
def test_log_interrupted_before_the_end_exits_130_not_0(fake_table, monkeypatch, json_mode):
    """Ctrl-C while ``log`` reads up to the end: what it printed is not the whole log, and the exit code says so
    (130, as every command: ``scan``, ``put``, …); with --json nothing is printed."""
    fetch_log = FakeTableClient.fetch_log

    def interrupted_second_fetch(self, bucket, from_offset, max_bytes=0):
        if self.fetches:
            raise KeyboardInterrupt
        return fetch_log(self, bucket, from_offset, max_bytes)

    monkeypatch.setattr(FakeTableClient, "fetch_log", interrupted_second_fetch)
    result = run_in("log", "db.w", "--bucket", "0", "--from", "0", *(["--json"] if json_mode else []))
    assert result.exit_code == 130, result.output
    assert result.stderr == "error: interrupted\n"
    assert [json.loads(line)["offset"] for line in result.stdout.splitlines()] == ([] if json_mode else [0, 1])


def test_iso_time_ms_is_utc_with_milliseconds():
    assert out.iso_time_ms(0) == "1970-01-01T00:00:00.000Z"
    assert out.iso_time_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert out.iso_time_ms(253_402_300_799_999) == "9999-12-31T23:59:59.999Z"  # exact, no float rounding
    assert out.iso_time_ms(None) is None


def test_snapshot_trigger(fake_table, monkeypatch):
    from kvlease.client import snapshot_trigger as st

    outcomes = [st.BucketOutcome(1, st.COMMITTED, st.CommittedSnapshot(1, 4, 5)),
                st.BucketOutcome(0, st.UNCHANGED, st.CommittedSnapshot(0, 3, 7))]
    monkeypatch.setattr(st, "trigger_snapshots", lambda client, wait, on_outcome: outcomes)
    doc = json.loads(run_in("snapshot", "trigger", "db.w", "--wait", "--json").stdout)
    assert doc == {"table": "db.w", "waited": True, "snapshots": [
        {"bucket": 0, "snapshot_id": 3, "log_offset": 7, "new": False},
        {"bucket": 1, "snapshot_id": 4, "log_offset": 5, "new": True}], "empty": [], "not_committed": []}
    outcomes[:] = [st.BucketOutcome(0, st.COMMITTED), st.BucketOutcome(1, st.COMMITTED)]
    assert "triggered" in run_in("snapshot", "trigger", "db.w").stdout
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=100)).committed(out.committed_doc("db.w", [], True))
    assert "nothing committed" in buffer.getvalue()


def test_snapshot_trigger_that_failed_on_some_buckets_lists_both_and_exits_1(fake_table, monkeypatch):
    from kvlease.client import snapshot_trigger as st

    down = errors.LeaderNotAvailableError("bucket 1 of table db.w: its leader, tablet server 2, is not live")
    outcomes = [st.BucketOutcome(0, st.COMMITTED, st.CommittedSnapshot(0, 3, 7)),
                st.BucketOutcome(1, st.FAILED, error=down)]
    monkeypatch.setattr(st, "trigger_snapshots", lambda client, wait, on_outcome: outcomes)
    result = run_in("snapshot", "trigger", "db.w", "--wait")
    assert result.exit_code == 1
    assert "committed now" in result.stdout and "not committed" in result.stdout and "is not live" in result.stdout
    assert result.stderr.strip() == (
        "error: db.w: bucket 1 not committed (1 of 2 done; first error: bucket 1 of table db.w: its leader, "
        "tablet server 2, is not live)")
    outcomes[0] = st.BucketOutcome(0, st.FAILED, error=down)  # every bucket failed: just the error
    assert assert_one_line_error(run_in("snapshot", "trigger", "db.w", "--wait", "--json")) == f"error: {down.message}"


# -- numbers beyond the wire types, bytes that are not UTF-8 ---------------------------------


@pytest.mark.parametrize("args, message", [
    (("lease", "renew", "L1", "--duration", "99999999999999999999d"), "out of range"),
    (("lease", "acquire", "L1", "--table", "db.w", "--snapshot", "99999999999=1", "--duration", "1m"),
     "bucket 99999999999 is out of range (0..2147483647)"),
    (("lease", "acquire", "L1", "--table", "db.w", "--snapshot", "0=99999999999999999999", "--duration", "1m"),
     "snapshot id 99999999999999999999 is out of range (0..9223372036854775807)"),
    (("lease", "release", "L1", "--table", "db.w", "--bucket", str(2**40)), "out of range (0..2147483647)"),
    (("log", "db.w", "--bucket", "0", "--from", str(10**23)), "0<=x<=9223372036854775807"),
    (("log", "db.w", "--bucket", str(2**40)), "0<=x<=2147483647"),
    (("log", "db.w", "--bucket", "0", "--from-timestamp", str(10**23)), "out of range"),
    (("scan", "db.w", "--limit", str(10**20)), "1<=x<=9223372036854775807"),
    (("scan", "db.w", "--bucket", str(2**40)), "bucket 1099511627776 is out of range (0..2147483647)"),
    (("table", "create", "db.x", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", str(2**40)),
     "1<=x<=2147483647"),
])
def test_numbers_beyond_the_wire_types_are_usage_errors(fake_table, args, message):
    result = run_in(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "internal error" not in result.output


@pytest.mark.parametrize("data, line", [
    (b'{"id": 1}\n{"id": 2}\n\xff\xfe garbage\n', 3),
    (b"\xc3\x28" + bytes(range(256)) * 4, 1),  # like head -c 1000 /dev/urandom
])
def test_put_of_bytes_that_are_not_utf8_names_the_line_and_writes_nothing_of_its_batch(fake_table, data, line):
    result = CliRunner().invoke(kvlease, ["--bootstrap", "127.0.0.1:1", "put", "db.w", "-"], input=data,
                                env=NO_ENV, prog_name="kvlease")
    error = assert_one_line_error(result)
    assert error.startswith(f"error: line {line}: not UTF-8"), error
    assert fake_table.get("db.w") is None or fake_table["db.w"].upserts == []
