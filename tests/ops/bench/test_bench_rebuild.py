"""``bench rebuild`` for real at small sizes (about 10 s): its own ZooKeeper, coordinator and leader tablet
server processes, moto's S3 server (a process), the follower in this process, 5,000 rows and a 10% tail; nothing
left behind (the session's leak guard checks the processes, this test the temp directory)."""

from __future__ import annotations

import tempfile

import pytest

from kvlease.ops.bench import rebuild as bench_rebuild

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_wiped_follower_is_rebuilt_from_the_snapshot_and_timed_against_the_download(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the benchmark's temp directory goes here
    seen: list[str] = []
    f = bench_rebuild.run(rows=5_000, tail_percent=10, batch=1_000, threads=2, rounds=1, progress=seen.append)
    assert (f["rows"], f["tail_rows"], f["rounds"], f["remote"]) == (5_000, 500, 1, "s3")  # moto's, a process
    # the leader's log starts past 0 (retention after the snapshot) and the tail is after the snapshot
    assert 0 < f["leader_log_start"] <= f["snapshot_log_offset"] < f["leader_log_end"]
    assert f["snapshot_bytes"] > 5_000 * 100 and f["snapshot_files"] >= 2
    (download_s,), (durable_s,), (rebuild,) = f["download_s"], f["durable_download_s"], f["rebuild"]
    assert durable_s > 0
    # rebuilt from the snapshot (rebuild_once fails otherwise) before the tail was applied
    assert 0 < rebuild["installed_s"] <= rebuild["applied_s"] <= rebuild["total_s"]
    assert rebuild["total_s"] == max(rebuild["applied_s"], rebuild["in_isr_s"])
    assert f["rebuild_vs_download"] == pytest.approx(download_s / rebuild["total_s"])
    assert f["download_mb_per_s"] == pytest.approx(f["snapshot_bytes"] / bench_rebuild.MB / download_s)
    (row,) = bench_rebuild.target_rows(f)
    assert row.value == pytest.approx(f["rebuild_vs_download"]) and row.target == 0.5
    assert "snapshot installed" in bench_rebuild.report(f) and "each file fsynced" in bench_rebuild.report(f)
    assert any("rebuilding the wiped follower" in line for line in seen)
    assert list(scratch.iterdir()) == []  # its cluster and the follower's data are gone
