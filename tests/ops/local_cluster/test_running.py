"""``local_cluster.running``: the one way the benchmarks start a cluster; it is stopped however the block ends."""

from __future__ import annotations

import pytest

import kvlease.ops.local_cluster.launch as launch
from kvlease.ops import local_cluster


@pytest.fixture
def calls(monkeypatch):
    made: list = []
    monkeypatch.setattr(launch, "start", lambda directory, **options: made.append(("start", directory, options))
                        or {"dir": directory})
    monkeypatch.setattr(launch, "stop", lambda directory: made.append(("stop", directory)))
    return made


@pytest.mark.unit
def test_the_block_gets_the_cluster_and_it_is_stopped_after(calls):
    with local_cluster.running("D", tablets=2) as doc:
        assert doc == {"dir": "D"} and calls == [("start", "D", {"tablets": 2})]
    assert calls[-1] == ("stop", "D")


@pytest.mark.unit
def test_it_is_stopped_when_the_block_fails(calls):
    with pytest.raises(RuntimeError, match="bench failed"):
        with local_cluster.running("D"):
            raise RuntimeError("bench failed")
    assert calls[-1] == ("stop", "D")


@pytest.mark.unit
def test_a_cluster_error_while_stopping_does_not_hide_the_blocks_own(monkeypatch, calls):
    def stop(directory):
        raise local_cluster.ClusterError(f"no cluster in {directory}")
    monkeypatch.setattr(launch, "stop", stop)
    with pytest.raises(KeyboardInterrupt):
        with local_cluster.running("D"):
            raise KeyboardInterrupt
