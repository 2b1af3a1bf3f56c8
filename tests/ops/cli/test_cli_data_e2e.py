"""The real ``kvlease`` executable moving data through a local cluster with tablet servers.

``cluster start --tablets 2``, a table, ``put`` from a JSON-lines file, ``get``,
``delete``, ``log`` (also ``--follow``, ended by Ctrl-C: exit 130), ``snapshot trigger
--wait``, ``snapshot list``, ``lease acquire --latest`` on those snapshots, and
``cluster stop`` leaving no process behind. The fixture stops (and at last
kills) whatever the test left running, and the test prints every log when it
fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from kvlease.ops import local_cluster
from kvlease.ops.cli.output import iso_time_ms
from kvlease.ops.wait import wait_until
from tests.ops.cli.test_cli_e2e import (  # noqa: F401 (cluster_dir is a fixture)
    CLI_ENV, KVLEASE, cluster_dir, kvlease, kvlease_json, print_logs, recorded_pids)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_cli_data_end_to_end(cluster_dir, tmp_path):
    try:
        walk_the_data_commands(cluster_dir, tmp_path)
    except BaseException:
        print_logs(cluster_dir)  # pytest shows captured output of failed tests
        raise


def log_lines(*args: str) -> list[dict]:
    return [json.loads(line) for line in kvlease(*args).stdout.splitlines()]


def walk_the_data_commands(cluster_dir: Path, tmp_path: Path) -> None:
    d = str(cluster_dir)
    kvlease("cluster", "start", "--dir", d, "--tablets", "2")
    status = kvlease_json("cluster", "status", "--dir", d, "--json")
    assert [t["id"] for t in status["tablets"]] == [1, 2]  # integers, as in `table describe`
    assert all(t["alive"] and t["address"] for t in status["tablets"])
    assert all((cluster_dir / f"tablet-{t['id']}" / "config.toml").exists() for t in status["tablets"])

    c = ("--cluster", d)
    kvlease(*c, "table", "create", "db.t", "--schema", "id BIGINT, name STRING, score DOUBLE",
            "--primary-key", "id", "--buckets", "3")
    status = kvlease_json("cluster", "status", "--dir", d, "--json")
    assert sum(t["buckets"] for t in status["tablets"]) == 3

    put_get_delete(c, tmp_path)
    bucket_7, end_7 = read_the_log(c)
    follow_log_until_ctrl_c(c, bucket_7, end_7, tablets=[t["address"] for t in status["tablets"]])
    snapshot_and_lease(c)

    pids = recorded_pids(cluster_dir)
    assert len(pids) == 4  # ZooKeeper, a coordinator, two tablet servers
    kvlease("cluster", "stop", "--dir", d)
    assert [pid for pid in pids if local_cluster.pid_alive(pid)] == []


def put_get_delete(c: tuple[str, ...], tmp_path: Path) -> None:
    """300 rows put from a file, a bad file refused, gets, an update from stdin and a delete."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "name": f"n{i}", "score": i / 4}) + "\n" for i in range(1, 301)))
    assert kvlease_json(*c, "put", "db.t", str(rows), "--json") == {"table": "db.t", "rows": 300}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1000, "name": "fine"}\n{"id": 1001, "name": 5}\n')
    failed = kvlease(*c, "put", "db.t", str(bad), check=False)
    assert failed.returncode == 1 and "line 2, column 'name'" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1

    got = kvlease_json(*c, "get", "db.t", "1", "300", "1000", "--json")
    assert got["rows"] == [{"id": 1, "name": "n1", "score": 0.25}, {"id": 300, "name": "n300", "score": 75.0}, None]
    assert "n7" in kvlease(*c, "get", "db.t", "7").stdout

    update = subprocess.run([KVLEASE, *c, "put", "db.t", "-"], input='{"id": 7, "name": "seven"}\n', text=True,
                            capture_output=True, env=CLI_ENV, timeout=60)
    assert update.returncode == 0, update.stderr
    assert kvlease_json(*c, "delete", "db.t", "8", "9999", "--json") == {"table": "db.t", "keys": 2, "deleted": 1}
    assert kvlease_json(*c, "get", "db.t", "7", "8", "--json")["rows"] == [
        {"id": 7, "name": "seven", "score": None}, None]


def read_the_log(c: tuple[str, ...]) -> tuple[int, int]:
    """``log`` of every bucket, as lines and --json, from a timestamp; returns the bucket of id 7 and its log end."""
    by_bucket = {b: log_lines(*c, "log", "db.t", "--bucket", str(b)) for b in range(3)}
    records = [r for b in range(3) for r in by_bucket[b]]
    assert len(records) == 300 + 2 + 1
    assert sorted(r["change_type"] for r in records if r["row"]["id"] in (7, 8)) == ["+I", "+I", "+U", "-D", "-U"]
    bucket_7 = next(b for b in range(3) if any(r["row"]["id"] == 7 for r in by_bucket[b]))
    doc = kvlease_json(*c, "log", "db.t", "--bucket", str(bucket_7), "--json")
    changes_7 = [r["change_type"] for r in doc["records"] if r["row"]["id"] == 7]
    assert changes_7 == ["+I", "-U", "+U"] and doc["log_end_offset"] == len(doc["records"])
    stamps = [r["timestamp"] for r in doc["records"]]  # --json: ms since the epoch, never going backwards
    assert all(isinstance(t, int) for t in stamps) and stamps == sorted(stamps)
    assert [r["timestamp"] for r in log_lines(*c, "log", "db.t", "--bucket", str(bucket_7))] == [
        iso_time_ms(t) for t in stamps]  # lines: the same times as ISO-8601 UTC text
    middle = stamps[len(stamps) // 2]
    since = kvlease_json(*c, "log", "db.t", "--bucket", str(bucket_7), "--from-timestamp", iso_time_ms(middle),
                         "--json")
    assert since["from_offset"] == stamps.index(middle) and since["records"] == doc["records"][stamps.index(middle):]
    return bucket_7, doc["log_end_offset"]


def connected_to(pid: int, ports: set[int]) -> bool:
    """Whether process ``pid`` holds an established TCP connection to one of ``ports`` (``/proc/net/tcp*``)."""
    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            sockets.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed meanwhile
            continue
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:  # sl, local address, remote address, state (01: established), ..., inode
            rows = [line.split() for line in fh.readlines()[1:]]
        if any(row[3] == "01" and int(row[2].rsplit(":", 1)[1], 16) in ports and f"socket:[{row[9]}]" in sockets
               for row in rows):
            return True
    return False


def snapshot_and_lease(c: tuple[str, ...]) -> None:
    """``snapshot trigger --wait`` catches every bucket up; ``lease acquire --latest`` takes those snapshots."""
    ends = {b: kvlease_json(*c, "log", "db.t", "--bucket", str(b), "--json")["log_end_offset"] for b in range(3)}
    triggered = kvlease_json(*c, "snapshot", "trigger", "db.t", "--wait", "--json")
    assert triggered["waited"] is True
    # a bucket the periodic snapshot (kv.snapshot.interval) already caught up is skipped
    assert all(s["log_offset"] == ends[s["bucket"]] for s in triggered["snapshots"])
    listed = kvlease_json(*c, "snapshot", "list", "db.t", "--json")["snapshots"]
    latest = {}
    for s in listed:
        if s["snapshot_id"] > latest.get(s["bucket"], {"snapshot_id": -1})["snapshot_id"]:
            latest[s["bucket"]] = s
    assert sorted(latest) == [0, 1, 2] and all(latest[b]["log_offset"] == ends[b] for b in range(3))
    assert {(s["bucket"], s["snapshot_id"]) for s in triggered["snapshots"]} <= {
        (s["bucket"], s["snapshot_id"]) for s in listed}
    leased = kvlease_json(*c, "lease", "acquire", "reader-1", "--table", "db.t", "--latest", "--duration", "10m",
                          "--json")
    assert sorted((a["bucket"], a["snapshot_id"]) for a in leased["acquired"]) == sorted(
        (b, s["snapshot_id"]) for b, s in latest.items())
    assert leased["unavailable"] == [] and "no_snapshot" not in leased
    relisted = kvlease_json(*c, "snapshot", "list", "db.t", "--json")["snapshots"]
    assert {(s["bucket"], s["snapshot_id"]) for s in relisted if s["leased_by"] == ["reader-1"]} == {
        (b, s["snapshot_id"]) for b, s in latest.items()}


def follow_log_until_ctrl_c(c: tuple[str, ...], bucket: int, end: int, tablets: list[str]) -> None:
    """``log --follow`` prints a record written while it runs, and ends on Ctrl-C with exit code 130."""
    proc = subprocess.Popen([KVLEASE, *c, "log", "db.t", "--bucket", str(bucket), "--from", str(end), "--follow",
                             "--poll-interval", "100ms"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=CLI_ENV)
    ports = {int(address.rsplit(":", 1)[1]) for address in tablets}

    def following() -> bool:  # past its start-up, it asks a tablet server for records
        assert proc.poll() is None, f"log --follow exited: {proc.stderr.read()}"
        return connected_to(proc.pid, ports)
    try:
        wait_until(following, 60, "log --follow connected to a tablet server")
        before = datetime.now(timezone.utc)
        subprocess.run([KVLEASE, *c, "put", "db.t", "-"], input='{"id": 7, "name": "again"}\n', text=True,
                       capture_output=True, env=CLI_ENV, timeout=60, check=True)
        line = json.loads(proc.stdout.readline())
        stamp = line.pop("timestamp")  # ISO-8601 UTC with milliseconds
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp
        assert before - timedelta(seconds=1) <= datetime.fromisoformat(stamp.replace("Z", "+00:00")) <= \
            datetime.now(timezone.utc)
        assert line == {"offset": end, "change_type": "-U", "row": {"id": 7, "name": "seven", "score": None}}
        assert json.loads(proc.stdout.readline())["change_type"] == "+U"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err  # interrupted, as any command: exit 130
        assert err.splitlines()[-1:] == ["error: interrupted"], err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_until(lambda: proc.poll() is not None, 5, "log --follow ended")
