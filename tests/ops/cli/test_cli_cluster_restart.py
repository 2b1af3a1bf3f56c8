"""``kvlease cluster restart --dir D --tablet N|--coordinator N|--zookeeper N`` and the tablet servers'
health in ``kvlease cluster status``: usage errors in-process, then the real executable on a real
local cluster (slow): each role restarted, three tablet servers restarted at once (each new pid recorded,
`cluster stop` stops them all), and a restart that names the buckets it does not wait for (their last
in-sync replica is down, or their data was lost)."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import time

import pytest
from rich.console import Console

from kvlease.ops import local_cluster
from kvlease.ops.cli import output as out
from tests.support.cli_runner import assert_one_line_error, run
from kvlease.ops.wait import wait_until
from tests.ops.cli.test_cli_e2e import (CLI_ENV, KVLEASE, cluster_dir, kvlease, kvlease_json,  # noqa: F401
                                        print_logs)


@pytest.mark.unit
@pytest.mark.parametrize("options", [[], ["--tablet", "1", "--coordinator", "1"]], ids=["none", "two"])
def test_restart_names_exactly_one_process(tmp_path, options):
    result = run("cluster", "restart", "--dir", str(tmp_path), *options)
    assert result.exit_code == 2, result.output
    assert "one process" in result.stderr and "Traceback" not in result.output


@pytest.mark.unit
def test_restart_of_a_process_the_cluster_does_not_have_is_a_one_line_error(tmp_path):
    (tmp_path / "cluster.json").write_text(json.dumps({"zookeeper": [], "coordinators": [], "tablets": []}))
    line = assert_one_line_error(run("cluster", "restart", "--dir", str(tmp_path), "--tablet", "9"))
    assert "no tablet server 9" in line


@pytest.mark.unit
def test_status_text_shows_an_unhealthy_tablet_and_why():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=200)).cluster_status({"zookeeper": [], "coordinators": [], "tablets": [
        {"id": "1", "pid": 5, "address": "127.0.0.1:9", "alive": True, "registered": True, "buckets": 3,
         "healthy": False, "serving": 2, "problems": ["1 bucket(s) over its capacity of 2 (tablet.buckets.max)"]},
        {"id": "2", "pid": 6, "address": "127.0.0.1:8", "alive": True, "registered": True, "buckets": 4,
         "healthy": True, "serving": 4, "problems": []}]})
    lines = buffer.getvalue().splitlines()
    assert any("3 buckets, serves 2; unhealthy: 1 bucket(s) over its capacity of 2" in line for line in lines)
    assert any("4 buckets" in line and "unhealthy" not in line for line in lines)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_restart_each_role_and_status_shows_tablet_health(cluster_dir):  # noqa: F811
    d = str(cluster_dir)
    try:
        kvlease("cluster", "start", "--dir", d, "--tablets", "1")
        kvlease("--cluster", d, "table", "create", "db.t", "--schema", "id BIGINT, v STRING", "--primary-key", "id",
                "--buckets", "3")
        kvlease("--cluster", d, "put", "db.t", "-", input="".join(f'{{"id": {i}, "v": "r{i}"}}\n' for i in range(30)))
        status = kvlease_json("cluster", "status", "--dir", d, "--json")
        tablet = status["tablets"][0]
        assert (tablet["healthy"], tablet["problems"], tablet["buckets"], tablet["serving"]) == (True, [], 3, 3)
        assert tablet["capacity"] > 0 and 0 < tablet["open_fds"] < tablet["max_fds"]
        assert "3 buckets" in kvlease("cluster", "status", "--dir", d).stdout

        for option, role in (("--tablet", "tablets"), ("--coordinator", "coordinators"), ("--zookeeper", "zookeeper")):
            before = local_cluster.member(local_cluster.load(d), role, "1")["pid"]
            out = kvlease_json("--json", "cluster", "restart", "--dir", d, option, "1")
            assert out["restarted"]["id"] == 1 and out["restarted"]["pid"] != before
            assert local_cluster.member(local_cluster.load(d), role, "1")["pid"] == out["restarted"]["pid"]
            got = kvlease_json("--cluster", d, "get", "db.t", "7", "--json")  # served again, data intact
            assert got["rows"] == [{"id": 7, "v": "r7"}]
        status = kvlease_json("cluster", "status", "--dir", d, "--json")
        assert all(p["alive"] for role in ("zookeeper", "coordinators", "tablets") for p in status[role])
        assert status["tablets"][0]["healthy"] is True
    except BaseException:
        print_logs(cluster_dir)
        raise


def create_table(d: str, buckets: int, rows: int = 20) -> None:
    """``db.t`` with one replica per bucket, ``rows`` rows in it."""
    kvlease("--cluster", d, "table", "create", "db.t", "--schema", "id BIGINT, v STRING", "--primary-key", "id",
            "--buckets", str(buckets), "--replication-factor", "1")
    kvlease("--cluster", d, "put", "db.t", "-", input="".join(f'{{"id": {i}, "v": "r{i}"}}\n' for i in range(rows)))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_three_tablet_servers_restarted_at_once_are_all_recorded_and_all_stopped(cluster_dir):  # noqa: F811
    d = str(cluster_dir)
    restarts: list[subprocess.Popen] = []
    try:
        kvlease("cluster", "start", "--dir", d, "--tablets", "3")
        create_table(d, 6)
        before = {int(t["id"]): t["pid"] for t in local_cluster.load(d)["tablets"]}
        restarts = [subprocess.Popen([KVLEASE, "--json", "cluster", "restart", "--dir", d, "--tablet", str(n)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CLI_ENV,
                                     stdin=subprocess.DEVNULL) for n in (1, 2, 3)]
        outputs = [proc.communicate(timeout=300) for proc in restarts]
        assert [proc.returncode for proc in restarts] == [0, 0, 0], outputs
        new = {json.loads(stdout)["restarted"]["id"]: json.loads(stdout)["restarted"]["pid"] for stdout, _ in outputs}
        assert {int(t["id"]): t["pid"] for t in local_cluster.load(d)["tablets"]} == new  # none lost
        assert sorted(new) == [1, 2, 3] and not set(new.values()) & set(before.values())
        assert all(local_cluster.pid_alive(pid) for pid in new.values())

        kvlease("cluster", "stop", "--dir", d)
        assert not any(local_cluster.pid_alive(pid) for pid in new.values())
    except BaseException:
        print_logs(cluster_dir)
        raise
    finally:
        for proc in restarts:  # a restart the test gave up on
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def buckets_on(d: str) -> dict[int, list[int]]:
    """Tablet server -> the buckets of ``db.t`` it holds (one replica each)."""
    held: dict[int, list[int]] = {}
    for bucket in kvlease_json("--cluster", d, "table", "describe", "db.t", "--json")["assignment"]:
        held.setdefault(bucket["replicas"][0], []).append(bucket["bucket"])
    return held


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_restart_names_the_buckets_it_does_not_wait_for(cluster_dir):  # noqa: F811
    d = str(cluster_dir)
    try:
        kvlease("cluster", "start", "--dir", d, "--tablets", "2")
        create_table(d, 4)
        held = buckets_on(d)
        assert sorted(held) == [1, 2], held

        # tablet server 2 stopped: tablet server 1 restarted serves its own buckets and names the others
        local_cluster.kill(d, "tablets", "2", signal.SIGTERM)
        began = time.monotonic()
        restarted = kvlease("cluster", "restart", "--dir", d, "--tablet", "1", "--timeout", "60s")
        assert time.monotonic() - began < 45, restarted  # not the whole timeout
        assert restarted.stdout.splitlines()[1:] == [
            f"waiting: db.t bucket {b} — its last in-sync replica, tablet 2, is down" for b in held[2]]
        served = local_cluster.served_buckets(local_cluster.load(d))
        assert [w["bucket"] for w in served["waiting"]] == held[2] and len(served["unserved"]) == len(held[2])

        # tablet server 2 back: nothing waits
        assert kvlease_json("--json", "cluster", "restart", "--dir", d, "--tablet", "2")["waiting"] == []

        # tablet server 1's data wiped: its buckets wait for `bucket restore`, which the restart names
        local_cluster.kill(d, "tablets", "1", signal.SIGTERM)
        shutil.rmtree(cluster_dir / "tablet-1" / "data")
        began = time.monotonic()
        restarted = kvlease_json("--json", "cluster", "restart", "--dir", d, "--tablet", "1", "--timeout", "60s")
        assert time.monotonic() - began < 45, restarted
        assert restarted["waiting"] == [
            {"table": "db.t", "bucket": b,
             "why": f"its data was lost: `kvlease bucket restore db.t --bucket {b} --accept-data-loss`"}
            for b in held[1]]
        for b in held[1]:
            kvlease("--cluster", d, "bucket", "restore", "db.t", "--bucket", str(b), "--accept-data-loss")
        wait_until(lambda: not local_cluster.served_buckets(local_cluster.load(d))["unserved"], 60,
                 "every bucket served after the restores")
    except BaseException:
        print_logs(cluster_dir)
        raise
