"""Error messages quote a caller's value capped (``common.errors.show``): a 5 MB key or name never makes a
5 MB message. Unit tests of the helper and of each place that quotes a value; a real cluster for
``RECORD_TOO_LARGE`` and the CLI. Also the other message helpers: ``single_line`` and ``did_you_mean``."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from kvlease.common import errors
from kvlease.common.errors import SHOW_LIMIT, did_you_mean, show, single_line
from kvlease.ops.cli import kvlease
from tests.support.cli_runner import NO_ENV, assert_one_line_error, run

BIG = 5 << 20  # 5 MB, the key of issue 27
#: What a message around one quoted value may take at most: the value's share plus the sentence.
MESSAGE_LIMIT = SHOW_LIMIT + 400


# -- the helper ----------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("value", ["abc", b"\x00\x01", 7, None, ["a", 1], {"id": 3}, "x" * SHOW_LIMIT])
def test_a_short_value_is_its_repr(value):
    assert show(value) == repr(value)


@pytest.mark.unit
@pytest.mark.parametrize("make, unit", [(lambda: "k" * BIG, "characters"), (lambda: b"\xff" * BIG, "bytes"),
                                        (lambda: bytearray(b"b" * BIG), "bytes")], ids=["str", "bytes", "bytearray"])
def test_a_long_string_shows_its_start_and_its_length(make, unit):
    value = make()
    text = show(value)
    assert len(text) < SHOW_LIMIT * 5  # an escaped byte is 4 characters of repr
    assert text.endswith(f"… ({BIG:,} {unit})")
    assert text.startswith(repr(value[:10]).rstrip("')"))


@pytest.mark.unit
@pytest.mark.parametrize("make", [lambda: {"id": "k" * BIG}, lambda: ["k" * BIG], lambda: ("a",) * BIG,
                                  lambda: list(range(BIG // 8)), lambda: 10 ** 5000, lambda: {"k" * BIG: 1},
                                  lambda: "\n" * BIG, lambda: ValueError("x\n" * BIG)],
                         ids=["dict", "list", "tuple", "ints", "int", "dict-key", "newlines", "object"])
def test_any_value_is_capped_and_on_one_line(make):
    text = show(make())
    assert len(text) <= SHOW_LIMIT * 5 and "\n" not in text


@pytest.mark.unit
def test_a_value_whose_repr_fails_is_named_by_its_type():
    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert show(Broken()).startswith("<Broken")


@pytest.mark.unit
@pytest.mark.parametrize("word, hint", [
    ("tabel", "did you mean 'table'?"),
    ("MAXROWPERTRIGGER", "did you mean 'maxRowsPerTrigger'?"),  # compared case-insensitively, shown as spelled
    ("startup.mod", "did you mean 'startup.mode'?"),
    ("startingOffsets", ""),  # not close to any: no guess (at difflib's own 0.6 it was 'ending.offsets')
    ("colour", ""),
    ("t" * (SHOW_LIMIT + 1), ""),
])
def test_did_you_mean_names_the_closest_known_name_or_nothing(word, hint):
    known = ["table", "maxRowsPerTrigger", "startup.mode", "startup.timestamp", "ending.offsets", "cluster"]
    assert did_you_mean(word, known) == hint


@pytest.mark.unit
def test_single_line_escapes_line_breaks_and_keeps_the_rest():
    assert single_line("a\nb\r\x00c\td é") == "a\\nb\\r\\x00c\td é"
    assert single_line(single_line("a\nb")) == single_line("a\nb")


# -- every place that quotes a caller's value --------------------------------------------------------


def _message(call) -> str:
    try:
        call()
    except (errors.KvLeaseError, click.ClickException) as exc:
        return getattr(exc, "message", None) or exc.format_message()
    except (ValueError, TypeError) as exc:
        return str(exc)
    raise AssertionError("no error")


def _raise(exc: Exception):
    raise exc


def _refusal(instructions) -> Exception:
    (refuse,) = instructions
    return refuse.error


def _echo_sites():
    from kvlease.common import config as cfg
    from kvlease.common import model, tables
    from kvlease.common.codec import RowCodec
    from kvlease.common.security import acl, authn
    from kvlease.client import admin
    from kvlease.ops.cli import plugins, values
    from kvlease.coordinator.catalog import TableCatalog
    from kvlease.leases import checks as lease_checks
    from kvlease.tablet.scan import manager as scan

    huge = "k" * BIG
    table = tables.TableInfo(1, "db", "t", (tables.Column("id", "STRING"), tables.Column("n", "BIGINT")), ("id",), 2)
    codec = RowCodec(table)
    return {
        "table name": lambda: tables.parse_table_path(f"db.{huge}"),
        "column name": lambda: tables.check_name("column", huge),
        "column definition": lambda: tables.parse_schema(f"id {huge} x"),
        "column type": lambda: tables.validate_spec(tables.TableSpec("db", "t", (tables.Column("id", huge),),
                                                                     ("id",), 1)),
        "primary key": lambda: tables.validate_spec(tables.TableSpec("db", "t", (tables.Column("id", "INT"),),
                                                                     (huge,), 1)),
        "lease id": lambda: _raise(ValueError(model.lease_id_problem(huge))),
        "lease not found": lambda: _raise(lease_checks.not_found_error(huge)),
        "duration": lambda: cfg.parse_duration_ms(huge),
        "size": lambda: cfg.parse_size(huge),
        "config key": lambda: cfg.Config({huge: 1}),
        "row column": lambda: codec.to_batch([{"id": "a", huge: 1}]),
        "row value": lambda: codec.to_batch([{"id": "a", "n": huge}]),
        "bootstrap": lambda: admin.parse_bootstrap(huge),
        "acl operation": lambda: acl.Operation.parse(huge),
        "acl principal": lambda: acl.check_principal(f"User:{huge} x"),
        "user name": lambda: authn.check_user_name(huge),
        "cli key": lambda: values.parse_keys([huge], tables.TableInfo(2, "db", "n", table.columns, ("n",), 1)),
        "cli drill": lambda: plugins.load_drill("k" * BIG),
        "scanner id": lambda: _raise(_refusal(scan.ScannerManager(8, 8, 1000).handle(scan.Continue(b"k" * BIG, 0, 1)))),
        "table not found": lambda: TableCatalog().get("db", huge),
        "cli value": lambda: values.convert_value(huge, "BIGINT"),
        "cli duration": lambda: values.DURATION.convert(huge, None, None),
        "cli bucket=snapshot": lambda: values.BucketSnapshot().convert(huge, None, None),
        "cli lease id": lambda: values.LEASE_ID.convert(huge, None, None),
    }


@pytest.mark.unit
@pytest.mark.parametrize("site", sorted(_echo_sites()))
def test_each_place_that_quotes_a_value_caps_it(site):
    message = _message(_echo_sites()[site])
    assert len(message) < MESSAGE_LIMIT, (site, message[:300])
    assert "kkkkkkkk" in message or "6b6b6b6b" in message, message  # it still shows the start of the value (hex)


# -- a real cluster --------------------------------------------------------------------------------------


@pytest.fixture
def small_rows_cluster(make_config, tmp_path):
    from tests.support.local_cluster import LocalCluster

    c = LocalCluster(make_config, tmp_path, tablets=1, tablet_overrides={"table.max-row-size": "1mb"})
    try:
        yield c
    finally:
        c.close()


def test_record_too_large_names_the_row_and_its_size_but_not_a_5_mb_key(small_rows_cluster):
    from kvlease.client.table import TableClient
    from kvlease.common.tables import Column

    c = small_rows_cluster
    c.create_table("db.big_keys", [Column("id", "STRING"), Column("v", "STRING")], ["id"], 1)
    with TableClient(c.admin, "db.big_keys", retry_total_s=10) as client:
        with pytest.raises(errors.RecordTooLargeError) as info:
            client.upsert([{"id": "k" * BIG, "v": "x"}])
        assert client.list_offsets([0])[0] == (0, 0)  # nothing written
    message = info.value.message
    assert len(message) < MESSAGE_LIMIT, message[:300]
    assert message.startswith("upsert row 0 (key {'id': 'kkkk") and "bytes, over the limit of 1048576" in message


def test_the_cli_prints_one_short_line_for_a_5_mb_key(small_rows_cluster):
    from kvlease.common.tables import Column

    c = small_rows_cluster
    c.create_table("db.cli_keys", [Column("id", "STRING"), Column("v", "STRING")], ["id"], 1)
    address = ("--bootstrap", c.coordinator.address, "--retry-timeout", "10s")
    put = CliRunner().invoke(kvlease, [*address, "put", "db.cli_keys"], input=json.dumps({"id": "k" * BIG}) + "\n",
                             env=NO_ENV, prog_name="kvlease")
    line = assert_one_line_error(put)  # the message, and what put adds: the lines it was writing
    assert len(line) < MESSAGE_LIMIT + 200 and "upsert row 0 (key {'id': 'kkkk" in line, line[:300]
    bad_id = run(*address, "lease", "describe", "L" * BIG)  # a lease id over the 128-character rule: usage error
    assert len(assert_one_line_error(bad_id, code=2)) < MESSAGE_LIMIT + 200
