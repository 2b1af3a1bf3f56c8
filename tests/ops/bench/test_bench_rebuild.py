"""``bench rebuild`` for real at small sizes (about 30 s on a quiet machine): for file:// and for moto's S3
server (a process), its own ZooKeeper, coordinator and leader tablet server processes, the follower in this
process, 5,000 rows and a 10% tail, quiet and with a writer (a process) loading the leader; nothing left behind
(the session's leak guard checks the processes, this test the temp directory)."""

from __future__ import annotations

import time

import pytest

from kvlease.ops.bench import rebuild as bench_rebuild
from kvlease.ops.bench.paced_writer import PacedWriter
from kvlease.ops.bench.rebuild_report import cases

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_wiped_follower_is_rebuilt_from_the_snapshot_and_timed_against_the_download(scratch):
    seen: list[str] = []
    f = bench_rebuild.run(rows=5_000, tail_percent=10, batch=1_000, threads=2, rounds=1, remote="both",
                          load_rows_per_s=2_000, progress=seen.append)
    assert (f["rows"], f["tail_rows"], f["rounds"], f["remotes"]) == (5_000, 500, 1, ["file", "s3"])
    assert [(c["remote"], c["load"]) for c in cases(f)] == [("file", "quiet"), ("file", "busy"),
                                                            ("s3", "quiet"), ("s3", "busy")]
    for run in f["runs"]:
        # the leader's log starts past 0 (retention after the snapshot) and the tail is after the snapshot
        assert 0 < run["leader_log_start"] <= run["snapshot_log_offset"] < run["leader_log_end"]
    for case in cases(f):
        assert case["snapshot_bytes"] > 5_000 * 100 and case["snapshot_files"] >= 2
        (download_s,), (durable_s,), (rebuild,) = case["download_s"], case["durable_download_s"], case["rebuild"]
        assert durable_s > 0
        # rebuilt from the snapshot (rebuild_once fails otherwise) before the tail was applied
        assert 0 < rebuild["installed_s"] <= rebuild["applied_s"] <= rebuild["total_s"]
        assert rebuild["total_s"] == max(rebuild["applied_s"], rebuild["in_isr_s"])
        # the anchor is the durable download; the page-cache copy is shown beside it
        assert case["rebuild_vs_download"] == pytest.approx(durable_s / rebuild["total_s"])
        assert case["rebuild_vs_page_cache_download"] == pytest.approx(download_s / rebuild["total_s"])
        assert case["download_mb_per_s"] == pytest.approx(case["snapshot_bytes"] / bench_rebuild.MB / durable_s)
    quiet, busy = cases(f)[:2]
    assert "writer_rows" not in quiet and busy["writer_rows"] > 0  # the writer ran during the busy case only
    assert busy["rebuild"][0]["log_end"] > f["runs"][0]["leader_log_end"]  # its writes are in what was applied
    rows = bench_rebuild.target_rows(f)
    assert [r.target for r in rows] == [0.5] * 4
    assert [r.value for r in rows] == pytest.approx([c["rebuild_vs_download"] for c in cases(f)])
    assert "file://, a writer at 2,000 rows/s" in rows[1].metric and "s3://, quiet" in rows[2].metric
    text = bench_rebuild.report(f)
    assert "snapshot installed" in text and "each file fsynced" in text and "s3:// remote storage" in text
    assert any("rebuilding the wiped follower" in line for line in seen)
    assert list(scratch.iterdir()) == []  # its clusters and the follower's data are gone


def test_the_paced_writer_keeps_its_rate_and_raises_a_failed_write():
    class Client:
        def __init__(self, fail: bool) -> None:
            self.fail, self.batches = fail, []

        def upsert(self, batch) -> None:
            if self.fail:
                raise ValueError("no leader")
            self.batches.append(batch.column(0).to_pylist())

    client = Client(fail=False)
    writer = PacedWriter(client, ids=1_500, rows_per_s=20_000).start()
    try:
        writer.wait_first(10)
        assert writer.rows >= 1_000 and client.batches  # the load is on once it returns
        time.sleep(0.3)
    finally:
        writer.stop()
    assert 0.5 * 20_000 * 0.3 <= writer.rows <= 20_000 * writer.seconds + 1_000  # paced: not faster than asked
    ids = [i for batch in client.batches for i in batch]
    assert ids[:3] == [0, 1, 2] and max(ids) == 1_499 and ids[1_500] == 0  # the ids in turn, wrapping
    failing = PacedWriter(Client(fail=True), ids=10, rows_per_s=100).start()
    with pytest.raises(RuntimeError, match="no leader"):
        failing.wait_first(10)
    with pytest.raises(RuntimeError, match="no leader"):
        failing.stop()
    with pytest.raises(ValueError, match="positive"):
        PacedWriter(client, ids=0, rows_per_s=1)


def test_the_isr_is_asked_for_only_once_the_snapshot_is_installed(tmp_path, monkeypatch):
    """The ISR poll is an RPC in the follower's own process: before the install (when the replica cannot be in the
    ISR) it only took CPU from the download the rebuild is timed with. Fakes for the server and the coordinator."""
    polls = {"applied": 0}
    rebuilder = type("Rebuilder", (), {"in_progress": 1, "rebuilt": 0})()
    server = type("Server", (), {"fetchers": type("F", (), {"rebuilder": rebuilder})(), "stop": lambda self: None})()

    def applied(_server, _table_id):
        polls["applied"] += 1
        if polls["applied"] == 30:  # the install, after 30 polls (0.15 s); the tail applied at the next poll
            rebuilder.rebuilt = 1
        return 100 if polls["applied"] > 30 else -1

    asked = []

    def state(_admin, _table_id):
        asked.append(rebuilder.rebuilt)
        return type("State", (), {"isr": [1, bench_rebuild.FOLLOWER_ID] if len(asked) > 1 else [1]})()

    monkeypatch.setattr(bench_rebuild, "start_follower", lambda config: server)
    monkeypatch.setattr(bench_rebuild, "applied_offset", applied)
    monkeypatch.setattr(bench_rebuild, "bucket_state", state)
    config = {bench_rebuild.cfg.TABLET_DATA_DIR: str(tmp_path / "gone")}
    _server, marks = bench_rebuild.rebuild_once(config, None, 7, 100)
    assert asked and all(asked)  # never before the install
    assert marks["started_s"] <= marks["installed_s"] <= marks["in_isr_s"] == marks["total_s"]
