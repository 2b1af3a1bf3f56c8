"""What a failed drill test prints of the cluster's logs (tests/support/cluster_logs.py): each log from the
drill's start, not its last lines (which tell only how the drill made the cluster whole again)."""

from __future__ import annotations

import time

import pytest

from tests.support import cluster_logs

pytestmark = pytest.mark.unit


#: noon today: the stamps around it fall on one day whenever the test runs (the logs' stamps compare by time of day)
NOON = time.mktime(time.localtime()[:3] + (12, 0, 0, 0, 0, -1))


def _stamp(when: float, zookeeper: bool = False) -> str:
    t = time.localtime(when)
    return time.strftime("%H:%M:%S.000" if zookeeper else "%Y-%m-%d %H:%M:%S,000", t)


def test_each_log_is_shown_from_the_drills_start_both_stamp_formats(tmp_path):
    start = NOON
    coordinator = tmp_path / "coordinator-1" / "coordinator.log"
    zookeeper = tmp_path / "zookeeper" / "zk-2" / "zookeeper.log"
    for path in (coordinator, zookeeper):
        path.parent.mkdir(parents=True)
    coordinator.write_text("\n".join(
        [f"{_stamp(start - 60)} INFO before the drill"] * 3
        + [f"{_stamp(start + 1)} WARNING lost the ZooKeeper connection", "Traceback (a continuation line)"]
        + [f"{_stamp(start + 30)} INFO whole again {i}" for i in range(500)]) + "\n")
    zookeeper.write_text(f"{_stamp(start - 5, zookeeper=True)} [main] INFO before\n"
                         f"{_stamp(start + 2, zookeeper=True)} [q] WARN elected\n")

    text = cluster_logs.cluster_logs(tmp_path, start)

    assert "before the drill" not in text and "] INFO before" not in text
    assert "lost the ZooKeeper connection" in text and "Traceback (a continuation line)" in text
    assert "WARN elected" in text
    assert "whole again 499" in text and "whole again 400" not in text  # the first lines, then the last ones
    assert f"[... {502 - cluster_logs.HEAD - cluster_logs.TAIL} lines ...]" in text
    assert text.index("coordinator.log") < text.index("zookeeper.log")


def test_a_log_with_nothing_since_the_start_shows_its_last_lines(tmp_path):
    log = tmp_path / "tablet-1" / "tablet.log"
    log.parent.mkdir()
    log.write_text("\n".join(f"{_stamp(NOON - 7_200)} INFO line {i}" for i in range(100)) + "\n")
    text = cluster_logs.cluster_logs(tmp_path, NOON)
    assert "line 99" in text and "line 40" in text and "line 39" not in text  # TAIL = 60
    assert cluster_logs.TAIL == 60
