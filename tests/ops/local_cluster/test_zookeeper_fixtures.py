"""The ZooKeeper launcher (ops/local_cluster/zookeeper.py) and the fixtures built on it."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap

import pytest
from kazoo.client import KazooClient

from kvlease.common import config as cfg
from kvlease.ops.local_cluster import zookeeper
from kvlease.ops.local_cluster import ZooKeeperCluster, ZooKeeperError, four_letter, holds_port, stop_pids
from kvlease.ops.wait import poll, wait_until
from tests.support.paths import REPO

REPO = str(REPO)


def _dead(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie (dead, waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether process ``pid`` is dead within ``timeout_s``."""
    return poll(lambda: _dead(pid), timeout_s)[1]


def _client(hosts: str) -> KazooClient:
    retry = {"max_tries": -1, "delay": 0.05, "max_delay": 0.5, "deadline": 20}
    client = KazooClient(hosts=hosts, timeout=4, connection_retry=dict(retry), command_retry=dict(retry))
    client.start(timeout=15)
    return client


# --- the session server and its fixtures ---------------------------------------------------

def test_standalone_server_answers(zk_server):
    node = zk_server.nodes[0]
    assert zk_server.connect_string == node.address == f"127.0.0.1:{node.client_port}"
    assert "Mode: standalone" in four_letter(node.client_port, "srvr")
    assert four_letter(node.client_port, "ruok") == "imok"
    assert os.path.exists(f"/proc/{node.pid}")
    assert "zookeeper node 1" in zk_server.log_tail(5)


def test_zk_config_points_at_the_server_and_a_fresh_chroot(zk_config, zk_server, zk_root):
    assert zk_config[cfg.ZK_ADDRESS] == zk_server.connect_string
    assert zk_config[cfg.ZK_ROOT] == zk_root and zk_root.startswith("/t-")
    assert zk_config[cfg.ZK_SESSION_TIMEOUT] == 4000
    assert zk_config[cfg.REMOTE_DATA_DIR].startswith("file:///")
    assert os.path.isdir(zk_config[cfg.REMOTE_DATA_DIR][len("file://"):])
    assert zk_config[cfg.REMOTE_FSYNC] is False
    assert zk_config[cfg.METRICS_PORT] == -1
    assert zk_config[cfg.COORDINATOR_PORT] == 0


def test_zk_client_works_inside_the_chroot(zk_client, zk_server, zk_root):
    zk_client.create("/hello", b"world")
    bare = _client(zk_server.connect_string)
    try:
        assert bare.get(f"{zk_root}/hello")[0] == b"world"
    finally:
        bare.stop()
        bare.close()


def test_make_config_takes_dotted_overrides_and_shares_the_chroot(make_config, zk_config):
    a = make_config({"kv.scanner.ttl": "1s"})
    b = make_config(**{"kv.scanner.max-per-bucket": 3})
    assert a[cfg.SCANNER_TTL] == 1000 and b[cfg.SCANNER_MAX_PER_BUCKET] == 3
    assert a[cfg.ZK_ROOT] == b[cfg.ZK_ROOT] == zk_config[cfg.ZK_ROOT]
    assert a[cfg.REMOTE_DATA_DIR] == zk_config[cfg.REMOTE_DATA_DIR]


def test_tests_using_zk_fixtures_are_marked_zk(request, zk_root):
    assert request.node.get_closest_marker("zk") is not None
    assert request.node.get_closest_marker("unit") is None


# --- the ensemble ------------------------------------------------------------------------------

@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_ensemble_survives_killing_one_node_and_restarts_it(zk_ensemble, victim):
    modes = [four_letter(node.client_port) or "" for node in zk_ensemble.nodes]
    index = next(i for i, mode in enumerate(modes) if f"Mode: {victim}" in mode)
    client = _client(zk_ensemble.connect_string)
    try:
        client.create("/before", b"1")
        zk_ensemble.kill(index)
        assert not zk_ensemble.alive(index)
        client.retry(client.create, "/during", b"2")  # a quorum of 2 still serves writes
        zk_ensemble.restart(index)
        assert zk_ensemble.serving(index)
    finally:
        client.stop()
        client.close()
    direct = _client(zk_ensemble.nodes[index].address)  # the restarted node caught up
    try:
        direct.sync("/during")
        assert direct.get("/during")[0] == b"2"
        assert direct.get("/before")[0] == b"1"
    finally:
        direct.stop()
        direct.close()


# --- the launcher ------------------------------------------------------------------------------

def test_stop_leaves_no_process_and_is_idempotent(tmp_path):
    cluster = ZooKeeperCluster.start(str(tmp_path), 1)
    pid = cluster.nodes[0].pid
    cluster.stop()
    assert _gone(pid, 0.1)
    cluster.stop()
    assert not cluster.alive(0)


def test_a_killed_standalone_node_restarts_with_its_data(tmp_path):
    with ZooKeeperCluster.start(str(tmp_path), 1) as cluster:
        client = _client(cluster.connect_string)
        try:
            client.create("/kept", b"yes")
            old_pid = cluster.nodes[0].pid
            cluster.kill(0)
            assert not cluster.alive(0) and _gone(old_pid, 0.1)
            cluster.restart(0)
            assert cluster.serving(0) and cluster.nodes[0].pid != old_pid
            assert client.retry(client.get, "/kept")[0] == b"yes"
        finally:
            client.stop()
            client.close()


#: A client's ConnectRequest (protocol 0, no zxid, 30 s, no session, empty password, not read-only), framed.
_CONNECT = struct.pack(">iqiqi16s?", 0, 0, 30_000, 0, 16, b"\0" * 16, False)


def _connect_as_soon_as_the_port_opens(port: int) -> socket.socket:
    return wait_until(lambda: socket.create_connection(("127.0.0.1", port), timeout=1), 30, "the node opened its port",
                      interval_s=0.002, retry_on=(ConnectionRefusedError,))


def test_a_client_connecting_while_a_standalone_node_starts_is_answered_or_turned_away(tmp_path):
    """A session request sent the moment the port opens (before the node has loaded its data) gets an
    answer or a closed connection, never silence: kazoo would wait its whole session timeout for it
    (and lose the session) whenever it reconnected to a restarted node at that moment."""
    with ZooKeeperCluster.start(str(tmp_path), 1) as cluster:
        for _ in range(3):  # with ZooKeeper's NIO server most of these were left hanging
            cluster.kill(0)
            cluster.restart(0, wait=False)
            with _connect_as_soon_as_the_port_opens(cluster.nodes[0].client_port) as sock:
                sock.settimeout(5)
                sock.sendall(struct.pack(">i", len(_CONNECT)) + _CONNECT)
                try:
                    sock.recv(4096)  # an answer, or b"" (closed): either way the client goes on
                except ConnectionResetError:
                    pass
                except socket.timeout:
                    pytest.fail("the starting node neither answered nor closed the connection within 5 s")
            wait_until(lambda: cluster.serving(0), 30, "the restarted node serves")


def test_start_retries_on_new_ports_when_a_port_was_taken(tmp_path, monkeypatch):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    real = zookeeper.free_ports
    calls = []

    def ports(count):
        calls.append(count)
        picked = real(count)
        return [squatter.getsockname()[1], *picked[1:]] if len(calls) == 1 else picked

    monkeypatch.setattr(zookeeper, "free_ports", ports)
    try:
        with ZooKeeperCluster.start(str(tmp_path), 1) as cluster:
            assert len(calls) == 2
            assert cluster.nodes[0].client_port != squatter.getsockname()[1]
            assert cluster.serving(0)
    finally:
        squatter.close()


def test_a_zookeeper_that_took_the_picked_port_first_is_not_taken_for_ours(tmp_path, monkeypatch, zk_server):
    """Another cluster's node answers on the port (as the session's server does here): ours, which could not
    bind it, is started again on new ports, and the cluster's address is its own node's."""
    taken = zk_server.nodes[0].client_port
    real = zookeeper.free_ports
    calls = []

    def ports(count):
        calls.append(count)
        picked = real(count)
        return [taken, *picked[1:]] if len(calls) == 1 else picked

    monkeypatch.setattr(zookeeper, "free_ports", ports)
    with ZooKeeperCluster.start(str(tmp_path), 1) as cluster:
        assert len(calls) == 2
        assert cluster.nodes[0].client_port != taken
        assert holds_port(cluster.nodes[0].pid, cluster.nodes[0].client_port)


@pytest.fixture
def launched_pids(monkeypatch):
    """Pids of every JVM ZooKeeperCluster launches during the test."""
    pids = []
    real_launch = ZooKeeperCluster._launch

    def launch(self, index):
        real_launch(self, index)
        pids.append(self.nodes[index].pid)

    monkeypatch.setattr(ZooKeeperCluster, "_launch", launch)
    return pids


def test_failed_start_raises_with_the_log_tail_and_leaves_no_process(tmp_path, monkeypatch, launched_pids):
    monkeypatch.setattr(zookeeper, "classpath", lambda: "/nonexistent.jar")
    with pytest.raises(ZooKeeperError, match="exited during startup") as info:
        ZooKeeperCluster.start(str(tmp_path), 1, ready_timeout_s=20)
    assert "Could not find or load main class" in str(info.value)  # the JVM's own words, from the log
    assert launched_pids and all(_gone(pid, 0.1) for pid in launched_pids)


def test_start_timeout_raises_and_leaves_no_process(tmp_path, monkeypatch, launched_pids):
    monkeypatch.setattr(zookeeper, "is_serving", lambda port: False)
    with pytest.raises(ZooKeeperError, match="did not serve requests within 1s"):
        ZooKeeperCluster.start(str(tmp_path), 3, ready_timeout_s=1)
    assert len(launched_pids) == 3
    assert all(_gone(pid, 0.1) for pid in launched_pids)


def test_attached_jvm_dies_with_its_parent_even_on_kill_9(tmp_path):
    script = textwrap.dedent(f"""
        import json, sys, time
        from kvlease.ops.local_cluster import ZooKeeperCluster
        cluster = ZooKeeperCluster.start({str(tmp_path)!r}, 1)
        print(json.dumps([n.pid for n in cluster.nodes]), flush=True)
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(parent.stdout.readline())
        assert pids and not _gone(pids[0], 0.1)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    assert _gone(pids[0], 10)


def test_detached_cluster_outlives_nothing_but_stop_pids(tmp_path):
    cluster = ZooKeeperCluster.start(str(tmp_path), 1, detached=True)
    pid = cluster.nodes[0].pid
    try:
        assert os.getsid(pid) == pid  # its own session: a terminal's Ctrl-C does not reach it
        stop_pids([pid], match="no-such-command-line")
        assert not _gone(pid, 0.2), "stop_pids must leave a non-matching process alone"
        stop_pids([pid], timeout_s=10, match="org.apache.zookeeper")
        assert _gone(pid, 0.1)
        stop_pids([pid])  # already gone: nothing to do
    finally:
        cluster.stop()


def test_stop_pids_escalates_to_sigkill(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        stop_pids([proc.pid], timeout_s=0.5)
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


# --- the pytest plumbing itself (an inner pytest session) ----------------------------------------

def test_failing_zk_test_prints_the_log_tail_and_the_guard_catches_leaks(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent("""
        from kvlease.ops.local_cluster import ZooKeeperCluster

        def test_fails(zk_client):
            assert zk_client.exists("/") is None

        def test_leaks(tmp_path):
            ZooKeeperCluster.start(str(tmp_path), 1, detached=True)
    """))
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_inner.py"),
         "--basetemp", str(tmp_path / "inner")],  # the failing inner test's temp dir goes with ours
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "ZooKeeper log tail (zk_server)" in out, out
    assert "binding to port" in out, out  # a line of the server's log
    assert "still running at its end" in out and "(ZooKeeper)" in out, out


# --- Docker variant (skipped without a Docker engine) ------------------------------------------

def test_docker_zookeeper_round_trip(docker_zk):
    client = _client(docker_zk)
    try:
        client.create("/kvlease-docker", b"ok")
        assert client.get("/kvlease-docker")[0] == b"ok"
    finally:
        client.stop()
        client.close()


@pytest.mark.slow
def test_attached_zookeeper_dies_with_a_kill_9_parent(tmp_path):
    """The JVM of an attached cluster goes when the process that started it is killed -9."""
    script = (
        "import sys, time\n"
        "from kvlease.ops.local_cluster import ZooKeeperCluster\n"
        f"c = ZooKeeperCluster.start({str(tmp_path)!r}, 1)\n"
        "print(c.nodes[0].pid, flush=True)\n"
        "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=str(zookeeper.__file__).rsplit("/ops/", 1)[0])
    try:
        jvm = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=10)
        assert _gone(jvm, 10), "the JVM outlived its kill -9'd parent"
    finally:
        if parent.poll() is None:
            parent.kill()
