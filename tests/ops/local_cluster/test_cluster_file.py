"""cluster.json changed by several processes at once (ops/local_cluster/cluster_file.py): each change is a
load-modify-save under the directory's lock, written through a temporary file of its own, so no change is
lost and no reader sees half a file (the real restarts: tests/ops/cli/test_cli_cluster_restart.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvlease.ops import local_cluster
from tests.support.fixtures.leaks import kill_group

CHANGES = 200  # enough that writers without the lock lose some (seen: 70 to 100 of 200 each)
#: ``CHANGES`` times: tablet ARGV[2]'s pid + 1, each a change of its own
BUMP = f"""
import sys
from kvlease.ops import local_cluster
for _ in range({CHANGES}):
    with local_cluster.updating(sys.argv[1]) as doc:
        local_cluster.member(doc, "tablets", sys.argv[2])["pid"] += 1
"""


def test_changes_of_several_processes_at_once_are_all_kept(tmp_path):
    doc = {"zookeeper": [], "coordinators": [],
           "tablets": [{"id": str(i), "pid": 1000 * i, "address": f"127.0.0.1:{i}"} for i in (1, 2, 3)]}
    local_cluster.save(tmp_path, doc)
    writers = [subprocess.Popen([sys.executable, "-c", BUMP, str(tmp_path), str(i)], env=local_cluster.child_env(),
                                start_new_session=True) for i in (1, 2, 3)]
    try:
        assert [writer.wait(120) for writer in writers] == [0, 0, 0]
    finally:
        for writer in writers:
            kill_group(writer)
    assert [t["pid"] for t in local_cluster.load(tmp_path)["tablets"]] == [1000 + CHANGES, 2000 + CHANGES,
                                                                           3000 + CHANGES]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json", "cluster.json.lock"]  # no temporary left
    json.loads((tmp_path / "cluster.json").read_text())


@pytest.mark.unit
def test_a_change_that_fails_is_not_saved(tmp_path):
    local_cluster.save(tmp_path, {"coordinators": [{"id": "1", "pid": None, "address": "a"}]})
    with pytest.raises(RuntimeError):
        with local_cluster.updating(tmp_path) as doc:
            doc["coordinators"][0]["pid"] = 7
            raise RuntimeError("half-way")
    assert local_cluster.load(tmp_path)["coordinators"][0]["pid"] is None
