"""Tablet servers on small disks of their own (``kvlease cluster start --tablet-disk SIZE``,
ops/local_cluster/tablet_disks.py): a real cluster of 1 tablet server whose data dir is a tmpfs of that size,
kept by a restart of the server, unmounted by ``cluster stop`` and by a start that was interrupted; the sizes
and the refusals (not root, data that would be hidden or is gone). Mounting needs root: skipped otherwise."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.local_cluster import tablet_disks

SIZE = "16m"
CONFIG = {"zookeeper.session-timeout": "4s"}


@pytest.mark.unit
def test_sizes_are_read_in_bytes_and_a_size_too_small_or_not_a_size_is_refused():
    assert tablet_disks.parse_size("64m") == tablet_disks.parse_size("64MiB") == tablet_disks.parse_size("64mb") \
        == 64 << 20
    assert tablet_disks.parse_size("1g") == 1 << 30 and tablet_disks.parse_size(str(32 << 20)) == 32 << 20
    with pytest.raises(local_cluster.ClusterError, match="'8m' is too small .* at least 16m"):
        tablet_disks.parse_size("8m")
    with pytest.raises(local_cluster.ClusterError, match="'lots' is not a size"):
        tablet_disks.parse_size("lots")


@pytest.mark.unit
def test_only_root_may_start_tablet_servers_on_small_disks(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(local_cluster.ClusterError, match="only root may do .*uid 1000.*without it"):
        local_cluster.start(tmp_path / "c", tablet_disk=SIZE)
    assert not (tmp_path / "c").exists()  # refused before anything was made
    with pytest.raises(local_cluster.ClusterError, match="needs --tablets 1 or more"):
        local_cluster.start(tmp_path / "c", tablets=0, tablet_disk=SIZE)


@pytest.mark.unit
def test_a_stopped_cluster_keeps_its_data_where_it_was():
    """Started again: a cluster on the host disk is not hidden under new disks, and one whose disks went
    with `cluster stop` is refused (its rows are gone); nothing is asked of a directory without a cluster."""
    on_host = {"tablets": [{"id": "1", "address": "a", "pid": None}]}
    with pytest.raises(local_cluster.ClusterError, match="--tablet-disk would hide it"):
        tablet_disks.kept("/nonexistent/c", on_host, 16 << 20)
    assert tablet_disks.kept("/nonexistent/c", on_host, None) is None
    assert tablet_disks.kept("/nonexistent/c", {}, 16 << 20) is None
    unmounted = {**on_host, tablet_disks.KEY: {"size_bytes": 16 << 20, "tablets": ["1"]}}
    with pytest.raises(local_cluster.ClusterError, match="tablet server.s. 1 were unmounted .*rows are gone"):
        tablet_disks.kept("/nonexistent/c", unmounted, None)


def _cleanup(directory) -> None:
    """Stop whatever the test left running and unmount what it left mounted (the test failed)."""
    if local_cluster.cluster_file(directory).exists():
        doc = local_cluster.load(directory)
        try:
            local_cluster.stop(directory)
        finally:
            for pid in local_cluster.running_pids(doc):
                os.kill(pid, signal.SIGKILL)
    for tablet_id in ("1", "2"):
        path = tablet_disks.data_dir(directory, tablet_id)
        if os.path.ismount(path):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def cluster_dir(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("--tablet-disk mounts a tmpfs: root only")
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        _cleanup(directory)


def start(directory, **options) -> None:
    """``cluster start --tablet-disk 16m``; the test is skipped where root may not mount (a container)."""
    try:
        local_cluster.start(directory, tablet_disk=SIZE, config_overrides=CONFIG, **options)
    except local_cluster.ClusterError as exc:
        if "cannot mount" in exc.message:
            pytest.skip(exc.message)
        raise


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_tablet_server_on_a_small_disk_keeps_it_through_a_restart_and_stop_unmounts_it(cluster_dir):
    start(cluster_dir, tablets=1)
    data = tablet_disks.data_dir(cluster_dir, 1)
    assert os.path.ismount(data)
    stat = os.statvfs(data)
    assert stat.f_blocks * stat.f_frsize == 16 << 20
    assert local_cluster.load(cluster_dir)[tablet_disks.KEY] == {"size_bytes": 16 << 20, "tablets": ["1"]}
    (tablet,) = local_cluster.status(cluster_dir)["tablets"]
    assert tablet["disk_bytes"] == 16 << 20 and 0 < tablet["disk_free_bytes"] <= 16 << 20
    with AdminClient(local_cluster.bootstrap(cluster_dir), retry_total_s=10) as admin:
        admin.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)
        with TableClient(admin, "db.t") as table:
            table.upsert([{"id": i, "v": "x" * 1000} for i in range(200)])
            assert any(path.name.isdigit() for path in data.iterdir())  # the rows are on the small disk

            local_cluster.restart(cluster_dir, "tablets", "1")  # the same data dir: its mount is kept
            assert os.path.ismount(data)
            assert sum(row is not None for row in table.lookup(list(range(200)))) == 200

    local_cluster.stop(cluster_dir)
    assert not os.path.ismount(data)
    assert local_cluster.status(cluster_dir)["tablets"][0]["disk_free_bytes"] is None  # shown as unmounted
    with pytest.raises(local_cluster.ClusterError, match="rows are gone; start a new cluster"):
        local_cluster.start(cluster_dir, tablets=1, config_overrides=CONFIG)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_interrupted_start_unmounts_the_disks_it_mounted(cluster_dir):
    """Ctrl-C (or any failure) once the tablet servers' disks are mounted: the start's undo unmounts them (and,
    a start that failed, writes no cluster.json)."""
    mounted = []

    def interrupt(text: str) -> None:
        if text.startswith("mounting"):
            mounted.append(text)
        if text.startswith("waiting for the tablet servers"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start(cluster_dir, tablets=2, progress=interrupt)
    assert [text.split()[-1] for text in mounted] == [str(tablet_disks.data_dir(cluster_dir, i)) for i in (1, 2)]
    assert not any(os.path.ismount(tablet_disks.data_dir(cluster_dir, i)) for i in (1, 2))
    assert not (cluster_dir / local_cluster.CLUSTER_FILE).exists()
    assert not (cluster_dir / local_cluster.STARTING_FILE).exists()
    tablet_pids = [int((cluster_dir / f"tablet-{i}" / "pid").read_text()) for i in (1, 2)]
    assert not any(local_cluster.pid_alive(pid) for pid in tablet_pids)
