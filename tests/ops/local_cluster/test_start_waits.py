"""The start's waits (``ops/local_cluster/start_waits.py``) against processes that exit while they wait: a
coordinator or tablet server that loses its port exits, and must be started again, never taken for started
(the answer came from another server) nor for dead."""

from __future__ import annotations

import contextlib

import pytest

from kvlease.ops.local_cluster import start_waits
from kvlease.ops.local_cluster.processes import ClusterError

pytestmark = pytest.mark.unit


class Proc:
    """A process as the waits see it (``poll``, ``pid``, ``returncode``)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self):
        return self.returncode


class ExitsOnceSeen(Proc):
    """A process that loses its port as the wait looks: running at the first look, exited from the next on."""

    def poll(self):
        code, self.returncode = self.returncode, 1
        return code


class PortLosers:
    """``relaunch``: each process seen exited (once) is started again as a new one on a new port; the new ones
    listen on theirs."""

    def __init__(self, doc: dict, role: str) -> None:
        self.doc, self.role, self.examined, self.relaunched = doc, role, set(), 0

    def __call__(self, procs: list) -> None:
        for i, proc in enumerate(procs):
            if proc.poll() is not None and proc.pid not in self.examined:
                self.examined.add(proc.pid)
                self.relaunched += 1
                procs[i] = Proc(1000 + self.relaunched)
                self.doc[self.role][i]["address"] = f"127.0.0.1:{2000 + self.relaunched}"


@pytest.fixture
def ports(monkeypatch):
    """Only the relaunched processes (pids from 1000) hold their ports."""
    monkeypatch.setattr(start_waits, "holds_port", lambda pid, port: pid >= 1000)


def test_a_coordinator_that_exits_while_another_answers_for_its_port_is_started_again(ports):
    """Our coordinator runs when the wait begins; while another cluster's coordinator on its port answers
    "active", ours exits (its bind failed): the wait starts it again and returns only once the new one holds
    its port, not on the other's answer."""
    doc = {"coordinators": [{"id": "1", "address": "127.0.0.1:1500", "log": "c.log"}]}
    procs = [Proc(1)]
    relaunch = PortLosers(doc, "coordinators")

    def wait_for_active(client, timeout_s):
        procs[0].returncode = 1 if procs[0].pid == 1 else None  # ours exits during the other's answer

    start_waits.wait_active(doc, procs, 5.0, lambda *a, **k: contextlib.nullcontext(), wait_for_active, relaunch)
    assert relaunch.relaunched == 1 and procs[0].pid == 1001 and doc["coordinators"][0]["address"] == "127.0.0.1:2001"


def test_a_tablet_server_that_exits_on_its_lost_port_just_after_the_wait_looked_is_started_again(ports):
    """A tablet server exiting (its port taken) right after the wait looked at it is examined by the relaunch
    before it is called dead: started again, and the wait ends once it registers; one that exited for another
    reason still fails the start, naming its exit code."""
    doc = {"coordinators": [{"id": "1", "address": "127.0.0.1:1500", "log": "c.log"}],
           "tablets": [{"id": "1", "address": "127.0.0.1:1600", "log": "t.log"}]}

    procs = [ExitsOnceSeen(1)]
    relaunch = losers = PortLosers(doc, "tablets")

    class Admin:
        def list_tablet_servers(self):
            return [type("Server", (), {"id": 1})()] if procs[0].pid != 1 else []

    start_waits.wait_tablets(doc, procs, 5.0, lambda *a, **k: contextlib.nullcontext(Admin()), relaunch)
    assert losers.relaunched == 1 and procs[0].pid == 1001
    procs[0].returncode = 3  # a crash, not a lost port: relaunched only once (PortLosers examines a pid once)
    losers.examined.add(1001)
    with pytest.raises(ClusterError, match=r"tablet server\(s\) 1 \(exit code 3"):
        start_waits.fail_if_tablets_exited(doc, procs, losers)


def test_a_lone_coordinator_exiting_on_its_lost_port_as_the_wait_looks_is_started_again_not_called_dead(ports):
    """The wait's "every coordinator exited" check sees the exit only after the relaunch examined it: a lone
    coordinator that lost its port is started again, and the start does not fail."""
    doc = {"coordinators": [{"id": "1", "address": "127.0.0.1:1500", "log": "c.log"}]}
    procs = [ExitsOnceSeen(1)]
    relaunch = PortLosers(doc, "coordinators")
    start_waits.wait_active(doc, procs, 5.0, lambda *a, **k: contextlib.nullcontext(), lambda client, timeout: None,
                            relaunch)
    assert relaunch.relaunched == 1 and procs[0].pid == 1001
