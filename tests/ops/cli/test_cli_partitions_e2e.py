"""The real ``kvlease`` executable on partitioned tables (docs/partitions.md), one local cluster for the module.

The cluster is started once by ``kvlease cluster start --set auto-partition.check-interval=1s`` (one tablet
server) and shared: partitions added, listed, limited and dropped by hand; an auto-partitioned SECOND table
whose partitions the coordinator makes and drops within seconds; rows of two partitions put, scanned, read
from the changelog and snapshotted per partition; one ``lease acquire --latest`` holding every partition's
buckets, and a partition drop taking its buckets out of that lease; a bad ``--set`` starting nothing; a later
start of the same directory keeping the setting. The fixture stops (and at last kills) whatever runs in the
directory; every log is printed when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from kvlease.client.admin import AdminClient
from kvlease.ops import local_cluster
from kvlease.ops.wait import wait_until
from tests.ops.cli.test_cli_e2e import kvlease, kvlease_json, print_logs, stop_everything

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SETTING = "auto-partition.check-interval=1s"


@pytest.fixture(scope="module")
def cluster(kvlease_tmp: str) -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="cli-partitions-", dir=kvlease_tmp)) / "cluster"
    try:
        with logs_on_failure(directory):
            kvlease("cluster", "start", "--dir", str(directory), "--tablets", "1", "--set", SETTING)
        yield directory
    finally:
        stop_everything(directory)
        shutil.rmtree(directory.parent, ignore_errors=True)


@contextlib.contextmanager
def logs_on_failure(directory: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        print_logs(directory)  # pytest shows captured output of failed tests
        raise


def names(c: tuple[str, ...], table: str) -> list[str]:
    """``partition list``'s names."""
    return [p["partition"] for p in kvlease_json(*c, "partition", "list", table, "--json")["partitions"]]


def partitions_now(directory: Path, table: str) -> list[str]:
    """The partitions of ``table`` as the coordinator lists them (a cheaper poll than a CLI process each time)."""
    with AdminClient(local_cluster.bootstrap(directory), retry_total_s=10) as admin:
        return sorted(p.name for p in admin.list_partitions(table)[1])


def one_line_error(proc, code: int = 1) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: ")
    return proc.stderr.strip()


def test_partitions_by_hand_and_by_time(cluster: Path) -> None:
    with logs_on_failure(cluster):
        c = ("--cluster", str(cluster))
        status = kvlease_json("cluster", "status", "--dir", str(cluster), "--json")
        assert status["settings"] == {"auto-partition.check-interval": "1s"}
        created = kvlease(*c, "--json", "table", "create", "db.orders", "--schema", "day STRING, id BIGINT, v STRING",
                          "--primary-key", "day,id", "--partition-by", "day", "--buckets", "2")
        doc = json.loads(created.stdout)
        assert (doc["partition_key"], doc["partitions"], doc["no_leader"]) == (["day"], [], [])
        assert created.stderr == ""  # no "buckets have no leader": its buckets are its partitions'
        partitions_by_hand(c)
        auto_partitioning(c, cluster)


def partitions_by_hand(c: tuple[str, ...]) -> None:
    """add (and --if-not-exists), list, describe, the partition limit, and errors of one line."""
    first = kvlease_json(*c, "partition", "add", "db.orders", "d1", "--json")
    assert (first["partition"], first["created"]) == ("d1", True)
    kvlease(*c, "partition", "add", "db.orders", "d2")
    again = kvlease_json(*c, "partition", "add", "db.orders", "d2", "--if-not-exists", "--json")
    assert again["created"] is False
    assert "partition d2 of table db.orders already exists" in one_line_error(
        kvlease(*c, "partition", "add", "db.orders", "d2", check=False))
    listed = kvlease_json(*c, "partition", "list", "db.orders", "--json")["partitions"]
    assert [p["partition"] for p in listed] == ["d1", "d2"] and listed[0]["partition_id"] == first["partition_id"]
    assert all(p["held_by"] == [] and p["created_ms"] > 0 for p in listed)
    described = kvlease_json(*c, "table", "describe", "db.orders", "--json")
    assert [(p["partition"], [b["bucket"] for b in p["assignment"]]) for p in described["partitions"]] == [
        ("d1", [0, 1]), ("d2", [0, 1])]
    assert all(b["leader"] == 1 for p in described["partitions"] for b in p["assignment"])
    assert "partitioned by" in kvlease(*c, "table", "list").stdout

    kvlease(*c, "table", "alter", "db.orders", "--max-partitions", "3")
    kvlease(*c, "partition", "add", "db.orders", "d3")
    assert "table.partition.max 3" in one_line_error(kvlease(*c, "partition", "add", "db.orders", "d4", check=False))
    missing = one_line_error(kvlease(*c, "scan", "db.orders", check=False), code=2)
    assert "table db.orders is partitioned: give --partition NAME (its partitions: d1, d2, d3)" in missing


def auto_partitioning(c: tuple[str, ...], directory: Path) -> None:
    """A SECOND table: its first partitions made with it, then made ahead and dropped every second."""
    made = kvlease_json(*c, "table", "create", "db.events", "--schema", "s STRING, id BIGINT", "--primary-key",
                        "s,id", "--partition-by", "s", "--auto-partition", "SECOND", "--precreate", "2", "--retention",
                        "1", "--buckets", "1", "--json")
    first = [p["partition"] for p in made["partitions"]]
    assert len(first) >= 2 and all(len(name) == 14 and name.isdigit() for name in first)  # yyyyMMddHHmmss
    def rolled() -> bool:
        now = partitions_now(directory, "db.events")
        return max(now) > max(first) and min(first) not in now
    assert made["auto_partition"] == {"unit": "SECOND", "precreate": 2, "retention": 1, "time_zone": "UTC"}
    wait_until(rolled, 8, "the coordinator's checks (every second) made later partitions and dropped the first")


def test_rows_of_two_partitions_read_snapshotted_leased_and_dropped(cluster: Path, tmp_path: Path) -> None:
    with logs_on_failure(cluster):
        c = ("--cluster", str(cluster))
        kvlease(*c, "table", "create", "db.sales", "--schema", "day STRING, id BIGINT, v STRING",
                "--primary-key", "day,id", "--partition-by", "day", "--buckets", "2")
        rows = tmp_path / "rows.jsonl"
        rows.write_text("".join(json.dumps({"day": day, "id": i, "v": f"{day}/{i}"}) + "\n"
                                for day, count in (("2026-01-01", 10), ("2026-01-02", 5)) for i in range(count)))
        assert kvlease_json(*c, "put", "db.sales", str(rows), "--json") == {"table": "db.sales", "rows": 15}
        assert names(c, "db.sales") == ["2026-01-01", "2026-01-02"]  # the put made them
        snapshots = read_each_partition(c)
        lease_every_partition(c, snapshots)


def read_each_partition(c: tuple[str, ...]) -> list[dict]:
    """scan, log and snapshot trigger of one partition, snapshot list of one and of all (returned)."""
    scanned = kvlease_json(*c, "scan", "db.sales", "--partition", "2026-01-01", "--json")
    assert scanned["partition"] == "2026-01-01" and sorted(r["id"] for r in scanned["rows"]) == list(range(10))
    assert {r["day"] for r in scanned["rows"]} == {"2026-01-01"}
    log = kvlease_json(*c, "log", "db.sales", "--partition", "2026-01-02", "--json")
    records = [r for b in log["buckets"] for r in b["records"]]
    assert log["partition"] == "2026-01-02" and sorted(r["row"]["id"] for r in records) == list(range(5))
    assert {r["change_type"] for r in records} == {"+I"}
    for day in ("2026-01-01", "2026-01-02"):
        committed = kvlease_json(*c, "snapshot", "trigger", "db.sales", "--partition", day, "--wait", "--json")
        assert committed["partition"] == day and committed["not_committed"] == [] and committed["snapshots"]
    one = kvlease_json(*c, "snapshot", "list", "db.sales", "--partition", "2026-01-02", "--json")
    assert one["partition"] == "2026-01-02" and {s["partition"] for s in one["snapshots"]} == {"2026-01-02"}
    every = kvlease_json(*c, "snapshot", "list", "db.sales", "--json")["snapshots"]
    assert {s["partition"] for s in every} == {"2026-01-01", "2026-01-02"}
    return every


def lease_every_partition(c: tuple[str, ...], snapshots: list[dict]) -> None:
    """One --latest lease over both partitions' snapshots; dropping one takes its buckets out of the lease."""
    acquired = kvlease_json(*c, "lease", "acquire", "R1", "--table", "db.sales", "--latest", "--duration", "10m",
                            "--json")["acquired"]
    assert {(b["partition"], b["bucket"]) for b in acquired} == {(s["partition"], s["bucket"]) for s in snapshots}
    assert {b["partition"] for b in acquired} == {"2026-01-01", "2026-01-02"}
    leases = kvlease_json(*c, "lease", "list", "--json")["leases"]
    assert [lease["lease_id"] for lease in leases] == ["R1"] and len(leases[0]["buckets"]) == len(acquired)
    assert kvlease_json(*c, "partition", "drop", "db.sales", "2026-01-01", "--json")["dropped"] is True
    held = kvlease_json(*c, "lease", "describe", "R1", "--json")["buckets"]
    assert held and {b["partition"] for b in held} == {"2026-01-02"}
    gone = one_line_error(kvlease(*c, "scan", "db.sales", "--partition", "2026-01-01", check=False))
    assert "partition 2026-01-01 of table db.sales does not exist (partitions: 2026-01-02)" in gone
    released = kvlease_json(*c, "lease", "release", "R1", "--table", "db.sales", "--partition", "2026-01-02",
                            "--bucket", "0,1", "--json")
    assert (released["partition"], released["released"], released["lease_remains"]) == ("2026-01-02", True, False)


def test_a_bad_setting_starts_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "never"
    proc = kvlease("cluster", "start", "--dir", str(directory), "--set", "auto-partition.check-intervall=1s",
                   check=False)
    line = one_line_error(proc, code=2)
    assert "unknown config key 'auto-partition.check-intervall': did you mean 'auto-partition.check-interval'?" in line
    assert not directory.exists()


def test_a_later_start_keeps_the_setting(cluster: Path) -> None:
    """Last: the module's cluster stopped and started again without --set still checks every second."""
    with logs_on_failure(cluster):
        d = str(cluster)
        kvlease("cluster", "stop", "--dir", d)
        kvlease("cluster", "start", "--dir", d)
        assert kvlease_json("cluster", "status", "--dir", d, "--json")["settings"] == {
            "auto-partition.check-interval": "1s"}
        before = max(partitions_now(cluster, "db.events"))
        wait_until(lambda: max(partitions_now(cluster, "db.events")) > before, 8,
                   "a later partition, made by a check a second later")
