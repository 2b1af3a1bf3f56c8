"""Shared fixtures: real ZooKeeper, a local S3 endpoint, and their Docker variants.

Tiers (markers declared in pyproject.toml):

- ``unit``: pure tests; their modules set ``pytestmark = pytest.mark.unit``.
- ``zk`` / ``s3`` / ``docker``: added automatically to every test whose
  fixtures (directly or through other fixtures) include one of
  :data:`ZK_FIXTURES`, :data:`S3_FIXTURES` or :data:`DOCKER_FIXTURES`.
  A test marked ``unit`` that uses one of them is a usage error.

ZooKeeper: one standalone server per session (``zk_server``) and a fresh chroot
per test (``zk_root``); ``zk_ensemble`` is a 3-node ensemble of its own per
test, for HA tests that kill nodes. A failing test that used them gets the
servers' log tails as a report section.

No test leaves a JVM, moto server, port or temp dir behind: fixtures stop
what they start (pytest also runs finalizers on Ctrl-C), attached JVMs die
with this process (``PR_SET_PDEATHSIG``), and a session guard fails loudly if
any process started during the session outlives it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pytest

from kvlease.common.config import Config
from kvlease.common.zk import make_client
from kvlease.ops.local_cluster import ZooKeeperCluster
from kvlease.ops.wait import poll
from tests.support.fixtures.docker import docker_unavailable_reason, minio_container, zookeeper_container
from tests.support.fixtures.leaks import SESSION_ENV, session_processes
from tests.support.fixtures.s3 import MotoS3Server, S3Endpoint
from tests.support.fixtures.spark import start_spark, stop_spark

ZK_FIXTURES = frozenset({"zk_server", "zk_root", "zk_config", "make_config", "zk_client", "zk_ensemble",
                         "zk_single"})
S3_FIXTURES = frozenset({"s3_endpoint", "s3_client", "s3_bucket", "s3_overrides", "s3_config", "make_s3_config"})
DOCKER_FIXTURES = frozenset({"docker_engine", "docker_zk", "docker_s3"})
SPARK_FIXTURES = frozenset({"spark"})

#: Config values every test config starts from (no fixed ports, no fsync).
TEST_DEFAULTS: dict[str, Any] = {
    "zookeeper.session-timeout": "4s",
    "remote.file.fsync": False,
    "metrics.port": -1,
    "coordinator.port": 0,
    "tablet.port": 0,
}

_LOG_TAIL_LINES = 150
_SESSION_CLUSTERS: list[tuple[str, ZooKeeperCluster]] = []  # (fixture name, cluster)
_ITEM_CLUSTERS = pytest.StashKey[list]()  # per-test clusters, same shape


# --- hooks ------------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    # Inherited by every process the session starts; the leak guard looks for it.
    os.environ[SESSION_ENV] = uuid.uuid4().hex


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixtures, marker in ((ZK_FIXTURES, "zk"), (S3_FIXTURES, "s3"), (DOCKER_FIXTURES, "docker"),
                                (SPARK_FIXTURES, "spark")):
            if names & fixtures:
                item.add_marker(marker)
                if item.get_closest_marker("unit"):
                    misplaced.append(f"{item.nodeid} uses {sorted(names & fixtures)}")
    if misplaced:
        raise pytest.UsageError("tests marked `unit` must not use server fixtures:\n  " + "\n  ".join(misplaced))
    _group_for_workers(items)


def _group_for_workers(items: list[pytest.Item]) -> None:
    """With pytest-xdist (``make test`` runs ``-n``, ``--dist loadgroup``): a module's tests run on one worker,
    so module-scoped clusters are started once; the tests of the session's SparkSession share a worker (one
    Spark JVM per group, not one per worker) and go first, the longest groups, then the multi-process tests of
    ``tests/ops`` (the longest tests), so that short ones fill the workers at the end. The Spark tests are two
    groups, :func:`spark_group`: all on one worker made the suite's longest lane (about 20 minutes of tests
    on 2 cores). Without xdist the markers do nothing."""
    def rank(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("spark") else 1 if item.nodeid.startswith("tests/ops/") else 2

    for item in items:
        if not item.get_closest_marker("xdist_group"):
            spark = item.get_closest_marker("spark") is not None
            item.add_marker(pytest.mark.xdist_group(spark_group(item.nodeid) if spark else item.nodeid.split("::")[0]))
    items.sort(key=rank)  # stable: files keep their order within a rank


#: Spark gives a Python worker it starts (a data source planner, a streaming source runner) a fixed 10 s to
#: import PySpark and connect back, and fails the query otherwise ("Python worker failed to connect back").
#: The kernel shares the CPU between autogroups (one per session: ``setsid``) before it looks at nice values,
#: and every process of a local cluster started by ``kvlease cluster start`` (drills, CLI tests) is detached
#: into a session of its own: eight busy ones left the session of the pytest workers a ninth of the CPU, and
#: the import took 2.6 s instead of 0.45 s on 2 cores (a tenfold load: past 10 s). So a worker moves into a
#: session of its own as it starts the Spark session (the ``spark`` fixture, whatever test it ran first), and
#: raises that autogroup's weight where it may (root: ``SPARK_AUTOGROUP_NICE``); the workers run at nice
#: ``NON_SPARK_NICE`` inside the session they share until then.
SPARK_AUTOGROUP_NICE = -5
NON_SPARK_NICE = 5


def spark_group(nodeid: str) -> str:
    """The worker group of a test that uses the session's SparkSession: the Spark source's own tests, or the
    drills, demo and CLI tests that also run a Spark query (about half the Spark time each)."""
    return "spark-ops" if nodeid.startswith("tests/ops/") else "spark"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _placed
    if _placed or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _placed = True
    os.nice(NON_SPARK_NICE)


def _own_autogroup(nice: int) -> None:
    """Move this process into a new session (so a new autogroup) at nice 0, then set that autogroup's nice
    value: each only where the system lets it (a process group leader cannot ``setsid``; only root may lower
    a nice). Processes it starts afterwards (the Spark JVM and its Python workers) are in the new session."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a plain pytest run: its terminal's session, not ours to leave
    try:
        os.setsid()
    except OSError:
        return  # stays in the session it shares: the autogroup's weight is not ours to change
    for set_nice in (lambda: os.setpriority(os.PRIO_PROCESS, 0, 0),
                     lambda: Path("/proc/self/autogroup").write_text(f"{nice}\n")):
        try:
            set_nice()
        except OSError:
            pass  # no autogroups, or not root: a session of its own already weighs as much as any other


_placed = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.failed:
        clusters = list(item.stash.get(_ITEM_CLUSTERS, []))
        if "zk_server" in getattr(item, "fixturenames", ()):
            clusters += _SESSION_CLUSTERS
        for name, cluster in clusters:
            report.sections.append((f"ZooKeeper log tail ({name})", cluster.log_tail(_LOG_TAIL_LINES)))
    return report


# --- session plumbing ---------------------------------------------------------------

@pytest.fixture(scope="session", autouse=True)
def _no_leaked_processes() -> Iterator[None]:
    """Set up first, torn down last: fails loudly if a started process outlived its test."""
    yield
    marker = os.environ[SESSION_ENV]
    poll(lambda: not session_processes(marker), 3.0, interval_s=0.1)  # processes exiting right now get a moment
    leaks = session_processes(marker)
    if not leaks:
        return
    for leak in leaks:
        try:
            os.kill(leak.pid, 9)
        except ProcessLookupError:
            pass
    lines = [f"  pid {leak.pid}{' (ZooKeeper)' if leak.is_zookeeper else ''}: {leak.cmdline[:300]}"
             for leak in leaks]
    pytest.fail("processes started by this test session were still running at its end "
                "(now killed):\n" + "\n".join(lines), pytrace=False)


@pytest.fixture(scope="session")
def kvlease_tmp() -> Iterator[str]:
    """A temp directory for the whole session, removed at its end (also at exit)."""
    _remove_stale_session_dirs()
    path = tempfile.mkdtemp(prefix=f"kvlease-tests-{os.getpid()}-")
    atexit.register(shutil.rmtree, path, True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _remove_stale_session_dirs() -> None:
    """Remove session dirs of earlier runs that were killed (kill -9 skips every cleanup)."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        parts = name.split("-")
        if name.startswith("kvlease-tests-") and len(parts) >= 4 and parts[2].isdigit():
            if not os.path.exists(f"/proc/{parts[2]}"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


@pytest.fixture
def remote_dir(kvlease_tmp: str) -> Iterator[str]:
    """A fresh empty directory for ``file://`` remote storage, removed after the test."""
    path = tempfile.mkdtemp(prefix="remote-", dir=kvlease_tmp)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- ZooKeeper ------------------------------------------------------------------------

@pytest.fixture(scope="session")
def zk_server(kvlease_tmp: str) -> Iterator[ZooKeeperCluster]:
    """One standalone ZooKeeper for the whole session. Do not kill it; use zk_ensemble."""
    cluster = ZooKeeperCluster.start(os.path.join(kvlease_tmp, "zk-standalone"), 1)
    _SESSION_CLUSTERS.append(("zk_server", cluster))
    try:
        yield cluster
    finally:
        _SESSION_CLUSTERS.remove(("zk_server", cluster))
        cluster.stop()


@pytest.fixture
def zk_root() -> str:
    """A fresh chroot path, e.g. ``/t-3f2a9c0d1e4b``."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_config(zk_server: ZooKeeperCluster, zk_root: str, remote_dir: str) -> Callable[..., Config]:
    """``make_config(overrides=None, /, **more) -> Config`` on this test's chroot and remote dir.

    Overrides are dotted keys: ``make_config({"kv.scanner.ttl": "1s"})`` or
    ``make_config(**{"kv.scanner.ttl": "1s"})``. Every call shares the test's
    ZooKeeper chroot and remote directory. The process environment is ignored.
    """
    base = {
        **TEST_DEFAULTS,
        "zookeeper.address": zk_server.connect_string,
        "zookeeper.path.root": zk_root,
        "remote.data.dir": f"file://{remote_dir}",
    }

    def make(overrides: Mapping[str, Any] | None = None, /, **more: Any) -> Config:
        return Config({**base, **(overrides or {}), **more}, env={})

    return make


@pytest.fixture
def zk_config(make_config: Callable[..., Config]) -> Config:
    """The test's Config: session ZooKeeper, fresh chroot, fresh ``file://`` remote dir."""
    return make_config()


@pytest.fixture
def zk_client(zk_config: Config) -> Iterator[Any]:
    """A started KazooClient on the test's chroot (``common.zk.make_client``)."""
    client = make_client(zk_config)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def zk_ensemble(request: pytest.FixtureRequest, kvlease_tmp: str) -> Iterator[ZooKeeperCluster]:
    """A 3-node ensemble of this test's own (kill/restart nodes freely); all nodes serve at start."""
    yield from _own_zookeeper(request, kvlease_tmp, "zk_ensemble", 3)


@pytest.fixture
def zk_single(request: pytest.FixtureRequest, kvlease_tmp: str) -> Iterator[ZooKeeperCluster]:
    """A standalone ZooKeeper of this test's own (kill/restart it freely: its data stays)."""
    yield from _own_zookeeper(request, kvlease_tmp, "zk_single", 1)


def _own_zookeeper(request: pytest.FixtureRequest, kvlease_tmp: str, name: str,
                   nodes: int) -> Iterator[ZooKeeperCluster]:
    """``nodes`` ZooKeeper servers for one test (their log tails reported if it fails), stopped and removed."""
    base = tempfile.mkdtemp(prefix=f"{name.replace('_', '-')}-", dir=kvlease_tmp)
    try:
        cluster = ZooKeeperCluster.start(base, nodes)
        request.node.stash.setdefault(_ITEM_CLUSTERS, []).append((name, cluster))
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- S3 ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 over real HTTP on 127.0.0.1 and a free port, for the whole session."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with MotoS3Server() as endpoint:
            yield endpoint


@pytest.fixture
def s3_client(s3_endpoint: S3Endpoint) -> Any:
    """A boto3 S3 client on the local endpoint."""
    return s3_endpoint.client()


@pytest.fixture
def s3_bucket(s3_endpoint: S3Endpoint, s3_client: Any) -> Iterator[str]:
    """A fresh bucket, emptied and removed after the test."""
    bucket = s3_endpoint.create_bucket()
    yield bucket
    try:
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if keys:
                s3_client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        s3_client.delete_bucket(Bucket=bucket)
    except Exception:  # best effort: the server goes away at session end anyway
        pass


@pytest.fixture
def s3_overrides(s3_endpoint: S3Endpoint, s3_bucket: str) -> dict[str, str]:
    """Config overrides for ``s3://<fresh bucket>/<prefix>``; combine with ``make_config`` for ZK + S3."""
    return s3_endpoint.overrides(s3_bucket, prefix=f"p-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def make_s3_config(s3_overrides: dict[str, str]) -> Callable[..., Config]:
    """``make_s3_config(overrides=None, /, **more) -> Config`` with S3 remote storage (no ZooKeeper)."""

    def make(overrides: Mapping[str, Any] | None = None, /, **more: Any) -> Config:
        return Config({**TEST_DEFAULTS, **s3_overrides, **(overrides or {}), **more}, env={})

    return make


@pytest.fixture
def s3_config(make_s3_config: Callable[..., Config]) -> Config:
    """A Config whose ``remote.data.dir`` is a fresh ``s3://`` bucket/prefix on the local endpoint."""
    return make_s3_config()


# --- Docker (testcontainers) ----------------------------------------------------------------

@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Skips the test when no Docker engine answers."""
    reason = docker_unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_zk(docker_engine: None) -> Iterator[str]:
    """The connect string of a ``zookeeper:3.8`` container."""
    with zookeeper_container() as address:
        yield address


@pytest.fixture(scope="session")
def docker_s3(docker_engine: None) -> Iterator[S3Endpoint]:
    """A MinIO container as an :class:`S3Endpoint`."""
    with minio_container() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def spark(kvlease_tmp: str) -> Iterator[Any]:
    """A real SparkSession (local[2]) with the kvlease source registered; one per test session."""
    work_dir = Path(tempfile.mkdtemp(prefix="spark-", dir=kvlease_tmp))
    _own_autogroup(SPARK_AUTOGROUP_NICE)
    session = start_spark(work_dir)
    try:
        yield session
    finally:
        stop_spark(session)
        shutil.rmtree(work_dir, ignore_errors=True)


@pytest.fixture
def writers() -> Iterator[list[subprocess.Popen]]:
    """Writer subprocesses a crash test starts (append them); killed and reaped when the test ends."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
