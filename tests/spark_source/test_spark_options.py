"""The Spark source's pure parts: options, offsets and read limits, write runs (no Spark job)."""

from __future__ import annotations

import numpy as np
import pytest

from kvlease.common.tables import Column, TableInfo
from kvlease.spark_source import options as opts
from kvlease.spark_source.batch import BatchReader
from kvlease.spark_source.splits import ReadContext
from kvlease.spark_source.stream import StreamReader
from kvlease.spark_source.stream_offsets import LeaseRef, _limited, _offset, _parse
from kvlease.spark_source.writer import DELETE, SKIP, UPSERT, _runs

pytestmark = pytest.mark.unit
BASE = {"bootstrap": "127.0.0.1:1", "table": "shop.orders"}


def parse(**more):
    return opts.parse({**BASE, **{k.replace("_", "."): v for k, v in more.items()}})


def test_defaults():
    o = opts.parse(BASE)
    assert (o.bootstrap, o.table, o.startup_mode, o.bootstrap_mode) == (("127.0.0.1:1",), "shop.orders", "full",
                                                                        "snapshot")
    assert (o.lease_duration_ms, o.acquire_max_attempts, o.acquire_max_wait_s) == (3_600_000, 8, 30.0)
    assert not o.change_feed


def test_names_are_case_insensitive_and_values_typed():
    o = opts.parse({**BASE, "Startup.Mode": "TIMESTAMP", "startup.timestamp": "2026-01-01T00:00:01Z",
                    "maxRowsPerTrigger": "500", "LEASE.DURATION": "10m", "lease.acquire.max-wait": "2s",
                    "split.max-rows": "1000", "ending.offsets": '{"0": 5, "3": 9}'})
    assert o.startup_mode == "timestamp" and o.startup_timestamp_ms == 1767225601000
    assert (o.max_rows_per_trigger, o.lease_duration_ms, o.acquire_max_wait_s, o.split_max_rows) == (
        500, 600_000, 2.0, 1000)
    assert o.ending_offsets == {0: 5, 3: 9} and o.change_feed


@pytest.mark.parametrize("given, named", [
    ({"colour": "red"}, "'colour'"),
    ({"startup.mode": "sometimes"}, "'startup.mode'"),
    ({"bootstrap.mode": "psychic"}, "'bootstrap.mode'"),
    ({"lease.duration": "forever"}, "'lease.duration'"),
    ({"lease.duration": "0s"}, "'lease.duration'"),
    ({"lease.acquire.max-attempts": "-1"}, "'lease.acquire.max-attempts'"),
    ({"maxRowsPerTrigger": "lots"}, "'maxRowsPerTrigger'"),
    ({"split.max-rows": "0"}, "'split.max-rows'"),
    ({"startup.mode": "timestamp"}, "'startup.timestamp'"),
    ({"startup.mode": "timestamp", "startup.timestamp": "yesterday"}, "'startup.timestamp'"),
    ({"startup.timestamp": "5"}, "'startup.timestamp'"),
    ({"startup.mode": "earliest", "ending.offsets": "[1]"}, "'ending.offsets'"),
    ({"startup.mode": "earliest", "ending.offsets": '{"0": -2}'}, "'ending.offsets'"),
    ({"startup.mode": "earliest", "ending.offsets": '{"0": 1}', "ending.timestamp": "5"}, "'ending.timestamp'"),
    ({"ending.timestamp": "5"}, "'ending.timestamp'"),
    ({"startup.mode": "earliest", "ending.offsets": '{"0": Infinity}'}, "'ending.offsets'"),
    ({"startup.mode": "earliest", "ending.offsets": '{"0": NaN}'}, "'ending.offsets'"),
    ({"startup.mode": "earliest", "ending.offsets": '{"0": 1e400}'}, "'ending.offsets'"),
    ({"startup.mode": "earliest", "ending.offsets": '{"0": 99999999999999999999}'}, "'ending.offsets'"),
    ({"startup.mode": "timestamp", "startup.timestamp": "99999999999999999999"}, "'startup.timestamp'"),
    ({"startup.mode": "timestamp", "startup.timestamp": "253402300800000"}, "'startup.timestamp'"),
    ({"startup.mode": "earliest", "ending.timestamp": "9223372036854775807"}, "'ending.timestamp'"),
    ({"bootstrap.mode": "live", "startup.mode": "earliest"}, "'bootstrap.mode'"),
    ({"lease.id": "no spaces please"}, "'lease.id'"),
    ({"lease.id": "job:1"}, "'lease.id'"),  # the coordinator refuses ':'
    ({"lease.id": ".."}, "'lease.id'"),
    ({"table": "orders"}, "'table'"),
    ({"cluster": "/nowhere"}, "'bootstrap' and 'cluster'"),
])
def test_bad_options_name_the_option(given, named):
    with pytest.raises(opts.OptionError) as info:
        opts.parse({**BASE, **given})
    assert named in str(info.value)


@pytest.mark.parametrize("given, reading, message", [
    ({"tabel": "shop.orders"}, True, "unknown option 'tabel': did you mean 'table'?"),
    ({"tabel": "shop.orders"}, False, "unknown option 'tabel': did you mean 'table'?"),
    ({"Startup.Mod": "full"}, True, "unknown option 'startup.mod': did you mean 'startup.mode'?"),
    ({"maxRowPerTrigger": "5"}, True, "unknown option 'maxrowpertrigger': did you mean 'maxRowsPerTrigger'?"),
    ({"checkpointLocaton": "/c"}, False, "unknown option 'checkpointlocaton': did you mean 'checkpointLocation'?"),
    ({"startup.mode": "earlist"}, True,
     "option 'startup.mode': 'earlist' is not one of full, earliest, latest, timestamp; did you mean 'earliest'?"),
    ({"bootstrap.mode": "Liv"}, True, "option 'bootstrap.mode': 'Liv' is not one of snapshot, live; did you mean 'live'?"),
    ({"bootstrap.mode": "psychic"}, True, "option 'bootstrap.mode': 'psychic' is not one of snapshot, live"),
    ({"maxRowsPerTrigger": "5"}, False, "option 'maxRowsPerTrigger' applies to reads only, not to writes"),
    ({"split.max-rows": "many"}, True, "option 'split.max-rows': expected a positive integer, got 'many'"),
])
def test_an_option_error_is_one_line_with_the_near_miss(given, reading, message):
    """As the CLI's usage errors: a near miss names the known option (or value); one line, whatever it quotes."""
    with pytest.raises(opts.OptionError) as info:
        opts.parse({**BASE, **given}, reading=reading)
    assert str(info.value) == message


def test_an_unknown_option_far_from_any_lists_the_known_ones():
    with pytest.raises(opts.OptionError) as info:
        opts.parse({**BASE, "startingOffsets": "earliest"})
    assert str(info.value).startswith("unknown option 'startingoffsets' (known: agg, bootstrap, bootstrap.mode, ")
    assert "maxRowsPerTrigger, " in str(info.value) and "did you mean" not in str(info.value)
    with pytest.raises(opts.OptionError) as info:  # a path with a line break stays on the one line
        opts.parse({"cluster": "/no\nwhere", "table": "a.b"})
    assert str(info.value).startswith("option 'cluster': no cluster in /no\\nwhere") and "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["maxRowsPerTrigger", "lease.duration", "startup.timestamp", "ending.offsets",
                                  "bootstrap.mode"])
def test_a_huge_bad_value_is_quoted_capped_in_the_error(name):
    with pytest.raises(opts.OptionError) as info:
        opts.parse({**BASE, "startup.mode": "timestamp", "startup.timestamp": "1", name: "x" * 1_000_000})
    assert f"'{name}'" in str(info.value) and len(str(info.value)) < 600


@pytest.mark.parametrize("name", ["lease.duration", "lease.acquire.max-wait"])
def test_a_lease_duration_without_a_unit_is_an_error_not_milliseconds(name):
    with pytest.raises(opts.OptionError, match=f"option '{name}': '5' has no unit: write 5ms, 5s"):
        opts.parse({**BASE, name: "5"})


def test_connection_options():
    with pytest.raises(opts.OptionError, match="'bootstrap'.*or 'cluster'.*required"):
        opts.parse({"table": "a.b"})
    with pytest.raises(opts.OptionError, match="'table'"):
        opts.parse({"bootstrap": "h:1"})
    with pytest.raises(opts.OptionError, match="option 'cluster': no cluster in /nowhere"):
        opts.parse({"cluster": "/nowhere", "table": "a.b"})
    with pytest.raises(opts.OptionError, match="'startup.mode' applies to reads only"):
        opts.parse({**BASE, "startup.mode": "full"}, reading=False)


def test_cluster_directory_names_the_coordinators(tmp_path):
    (tmp_path / "cluster.json").write_text('{"coordinators": [{"address": "127.0.0.1:9"}, {"address": "127.0.0.1:8"}]}')
    assert opts.parse({"cluster": str(tmp_path), "table": "a.b"}).bootstrap == ("127.0.0.1:9", "127.0.0.1:8")


def test_the_batch_reader_pushes_no_filter():
    """Spark reuses a Python reader's plan for later queries on the same DataFrame: a pushed filter would
    leak into them. Not overriding pushFilters also keeps reads working with filter pushdown off."""
    from pyspark.sql.datasource import DataSourceReader

    assert BatchReader.pushFilters is DataSourceReader.pushFilters


def test_retry_timeout_goes_to_the_clients_of_the_driver_and_the_executors():
    assert ("client.retry.total-timeout", "5s") in opts.parse({**BASE, "retry.timeout": "5s"}).security
    assert opts.parse(BASE).security == ()
    for bad in ("5q", "0s", ""):
        with pytest.raises(opts.OptionError, match="option 'retry.timeout'"):
            opts.parse({**BASE, "retry.timeout": bad})


def test_offsets_round_trip_and_bad_offsets_are_refused():
    offset = _offset(LeaseRef("L", "o1"), {1: (4, 10), 0: (-1, -1)}, 7)
    assert offset == {"table": 7, "lease": "L", "owner": "o1", "buckets": {"0": {"snapshot": -1, "offset": -1},
                                                                           "1": {"snapshot": 4, "offset": 10}}}
    assert _parse(offset) == (7, LeaseRef("L", "o1"), {0: (-1, -1), 1: (4, 10)})
    # written before offsets named their table, or their lease's owner (an unowned lease)
    assert _parse({"lease": "L", "buckets": {"0": {"snapshot": -1, "offset": 3}}}) == \
        (None, LeaseRef("L", None), {0: (-1, 3)})
    assert _parse(_offset(None, {0: (-1, 3)}, 7)) == (7, None, {0: (-1, 3)})
    with pytest.raises(opts.InvalidRequestError, match="not a kvlease streaming offset"):
        _parse({"lease": "L", "buckets": {"0": {"offset": 3}}})


def test_a_stream_refuses_offsets_of_another_table():
    two_buckets = TableInfo(7, "shop", "orders", (Column("id", "BIGINT"),), ("id",), 2)
    stream = StreamReader(None, ReadContext((), two_buckets, None, ("id",)))
    mine = stream._offset(LeaseRef("L", "o"), {0: (-1, 3), 1: (-1, 5)})
    assert stream._parse(mine) == (LeaseRef("L", "o"), {0: (-1, 3), 1: (-1, 5)})
    dropped = {**mine, "table": 6}  # the table was dropped and created again: a new id
    with pytest.raises(opts.InvalidRequestError, match="written for table id 6, but table shop.orders is now "
                                                       "table id 7"):
        stream._parse(dropped)
    old_format = {"lease": "L", "buckets": mine["buckets"]}  # written before offsets named their table
    assert stream._parse(old_format) == (LeaseRef("L", None), {0: (-1, 3), 1: (-1, 5)})
    with pytest.raises(opts.InvalidRequestError, match=r"has buckets \[0, 1, 2, 3\], but table shop.orders has "
                                                       r"buckets 0..1"):
        stream._parse({"lease": None, "buckets": {str(b): {"snapshot": -1, "offset": 0} for b in range(4)}})


def test_read_limit_is_shared_between_buckets_and_never_exceeded():
    starts = {0: 0, 1: 10, 2: 5}
    ends = {0: 100, 1: 12, 2: 5}
    limited = _limited(starts, ends, 50)
    assert sum(limited[b] - starts[b] for b in starts) == 50
    assert limited == {0: 48, 1: 12, 2: 5}
    assert _limited(starts, ends, 10_000) == ends
    assert _limited(starts, {0: 3, 1: 13, 2: 8}, 2) in ({0: 1, 1: 11, 2: 5}, {0: 1, 1: 10, 2: 6})


def test_write_runs_keep_the_row_order():
    kinds = np.array([UPSERT, UPSERT, DELETE, SKIP, UPSERT, DELETE, DELETE], dtype=np.int8)
    assert list(_runs(kinds)) == [(0, 2, UPSERT), (2, 3, DELETE), (3, 4, SKIP), (4, 5, UPSERT), (5, 7, DELETE)]
    assert list(_runs(np.array([], dtype=np.int8))) == []


def test_tls_options_and_a_secure_cluster_directory(tmp_path):
    import json

    cluster = tmp_path / "cluster"
    cluster.mkdir()
    doc = {"coordinators": [{"address": "127.0.0.1:1"}]}
    (cluster / "cluster.json").write_text(json.dumps(doc))
    assert opts.parse({"cluster": str(cluster), "table": "db.t"}).security == ()
    from kvlease.ops.local_cluster import certs

    made = certs.generate(tmp_path / "certs")  # read and checked at parse (the key must be the certificate's)
    pem = {"ca": made.ca, "client": made.client_cert, "client-key": made.client_key}
    doc["security"] = {"ca_file": str(pem["ca"]), "cert_file": str(pem["client"]),
                       "key_file": str(pem["client-key"]), "client_auth": True}
    (cluster / "cluster.json").write_text(json.dumps(doc))
    security = dict(opts.parse({"cluster": str(cluster), "table": "db.t"}).security)
    assert security["security.enabled"] is True and security["security.tls.cert-file"] == str(pem["client"])
    security = dict(opts.parse({"bootstrap": "h:1", "table": "db.t", "CA-File": str(pem["ca"])},
                               reading=False).security)
    assert security == {"security.enabled": True, "security.tls.ca-file": str(pem["ca"])}
    with pytest.raises(opts.OptionError, match="ca-file"):
        opts.parse({"bootstrap": "h:1", "table": "db.t", "cert-file": str(pem["client"]),
                    "key-file": str(pem["client-key"])})
    # a file that cannot be read, or is not PEM, fails naming the option that gave it
    with pytest.raises(opts.OptionError, match=r"^option 'ca-file': cannot read config key 'security.tls.ca-file' "
                                               r"file /nowhere/ca.pem"):
        opts.parse({"bootstrap": "h:1", "table": "db.t", "ca-file": "/nowhere/ca.pem"})
    with pytest.raises(opts.OptionError, match=r"^option 'key-file': .* is not a PEM file"):
        opts.parse({"bootstrap": "h:1", "table": "db.t", "ca-file": str(pem["ca"]), "cert-file": str(pem["client"]),
                    "key-file": str(cluster / "cluster.json")})
    pem["ca"].unlink()
    with pytest.raises(opts.OptionError, match=r"^option 'cluster': cannot read config key 'security.tls.ca-file'"):
        opts.parse({"cluster": str(cluster), "table": "db.t"})


@pytest.mark.parametrize("bootstrap", ["hostnoport", "h:99999", "h:1,,:2"])
def test_a_malformed_bootstrap_names_the_option(bootstrap):
    with pytest.raises(opts.OptionError, match=r"^option 'bootstrap': bad coordinator address"):
        opts.parse({**BASE, "bootstrap": bootstrap})


def test_split_max_rows_is_bounded_in_the_number_of_partitions(caplog):
    from kvlease.spark_source.enumerator import MAX_LOG_SPLITS, log_splits_for

    ranges = {0: (0, 20_000), 1: (5, 5), 2: (100, 1_107)}
    with caplog.at_level("WARNING"):
        splits = log_splits_for(ranges, 10)
    assert len(splits) <= MAX_LOG_SPLITS
    for b, (start, end) in ranges.items():  # still every record once, in order
        mine = [(s.start, s.end) for s in splits if s.bucket == b]
        assert [x for s, e in mine for x in range(s, e)] == list(range(start, end))
    assert "split.max-rows=10" in caplog.text and "partitions" in caplog.text
    caplog.clear()
    assert len(log_splits_for(ranges, 1_000)) == 20 + 2 and not caplog.text  # under the bound: as asked
    assert len(log_splits_for(ranges, None)) == 2
