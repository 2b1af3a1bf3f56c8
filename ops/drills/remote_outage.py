"""Take the file:// remote storage away for --outage seconds (default 4) under lease traffic.

Checks: calls fail cleanly (typed errors, none longer than the client's
retry budget plus a request timeout); ZooKeeper never points at a missing
lease file (sampled before, during and after the outage); every acknowledged
lease reads back as acknowledged; no file of a leased snapshot is deleted;
after recovery an acquire succeeds within 30 s and no orphan lease file is
left once the coordinator has cleaned up. Needs a file:// remote and
--tablets 1 or more.

The machine may run as root, so permissions cannot break a directory: the
remote root is swapped, atomically (``renameat2(RENAME_EXCHANGE)``), with a
plain file. Every path under it then fails (ENOTDIR) for every process, and
swapping back restores it as it was. If a drill is killed mid-outage, the
next drill on the cluster swaps it back first.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
import urllib.parse
from pathlib import Path

from common.storage import FileStorage
from ops import local_cluster
from ops.drills.report import Report, finish
from ops.drills.checks import OK, failures_clean, no_orphan_files, pointers_resolve, recovered
from ops.drills.cluster import ClusterShapeError, DrillCluster, require
from ops.drills.leases import LeaseDrill
from ops.drills.lease_layout import LEASE_FILES, lease_nodes, pointer_sample, pointers

NAME = "remote-outage"
OPTIONS = ("clients", "seed", "outage")
ACKS = 200
SAMPLE_EVERY_S = 0.5
RECOVERY_BOUND_S = 30.0
CLEANUP_WAIT_S = 15.0
REQUEST_TIMEOUT_S = 5.0
RETRY_TOTAL_S = 2.0  # short, so calls during the outage fail instead of waiting it out
ASIDE = ".remote-outage"  # suffix of the real directory's name during an outage
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=1, file_remote=True)


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS):
            raise ClusterShapeError(f"the file system of {a} cannot swap two paths atomically "
                                    f"(renameat2 RENAME_EXCHANGE): {os.strerror(code)}")
        raise OSError(code, f"cannot swap {a} and {b}: {os.strerror(code)}")


class RemoteOutage:
    """The remote root swapped with a plain file while active; ``real`` is where its files are then."""

    def __init__(self, remote_uri: str) -> None:
        self.root = Path(urllib.parse.unquote(urllib.parse.urlparse(remote_uri).path))
        self.aside = self.root.with_name(self.root.name + ASIDE)
        self.active = False

    @property
    def real(self) -> Path:
        return self.aside if self.active else self.root

    def restore_interrupted(self) -> bool:
        """Swap back an outage a killed drill left behind; True if there was one."""
        if self.aside.is_dir() and self.root.is_file():
            _exchange(self.root, self.aside)
            self.aside.unlink()
            return True
        return False

    def begin(self) -> None:
        self.aside.write_text(f"kvlease drill {NAME}: the remote storage is away; its files are in {self.aside}\n")
        try:
            _exchange(self.root, self.aside)
        except BaseException:
            self.aside.unlink()
            raise
        self.active = True

    def end(self) -> None:
        if self.active:
            _exchange(self.root, self.aside)
            self.active = False
            self.aside.unlink()

    def lease_files(self) -> list[str]:
        return FileStorage(self.real.as_uri(), fsync=False).list(LEASE_FILES)


def run(cluster_dir: str, clients: int = 16, seed: int = 0, outage: float = 4.0) -> Report:
    doc = local_cluster.load(cluster_dir)
    check_shape(doc)
    remote = RemoteOutage(doc["remote"])
    restored = remote.restore_interrupted()
    report = Report(NAME)
    with DrillCluster(cluster_dir, NAME) as cluster, LeaseDrill(
            cluster, clients, seed, request_timeout_s=REQUEST_TIMEOUT_S, retry_total_s=RETRY_TOTAL_S) as drill:
        drill.start()
        drill.before_fault(ACKS)
        samples = [pointer_sample(cluster.zk, remote.lease_files, "before the outage")]
        remote.begin()
        try:
            began = time.time()
            while time.time() < began + outage:
                time.sleep(SAMPLE_EVERY_S)
                samples.append(pointer_sample(cluster.zk, remote.lease_files,
                                              f"{time.time() - began:.1f}s into the outage"))
        finally:
            remote.end()
        ended = time.time()
        first = drill.clients.wait_for(lambda op: op.kind == "acquire" and op.outcome == OK and op.t0 > ended,
                                       RECOVERY_BOUND_S)
        drill.clients.more_acks(ACKS, 30)
        drill.stop()
        samples.append(pointer_sample(cluster.zk, remote.lease_files, "after the outage"))
        orphans_at_stop, listed, nodes = _wait_for_cleanup(cluster, remote)
        during = [op for op in drill.clients.snapshot() if op.t1 >= began]
        report.add(failures_clean(during, RETRY_TOTAL_S + REQUEST_TIMEOUT_S + 1.0))
        report.add(pointers_resolve(samples))
        report.add(recovered([None if first is None else round(first.t1 - ended, 3)], RECOVERY_BOUND_S,
                             "an acquire succeeds after the outage"))
        report.add(no_orphan_files(listed, pointers(nodes)))
        for check in drill.checks():
            report.add(check)
        failed = [op for op in during if op.outcome != OK and began <= op.t0 <= ended]
        report.figures.update(outage_s=outage, clients=clients, recovery_s=None if first is None else
                              round(first.t1 - ended, 3), calls_failed_in_outage=len(failed),
                              pointer_samples=len(samples), orphans_when_traffic_stopped=orphans_at_stop,
                              interrupted_outage_restored=restored, **drill.figures())
        report.add(cluster.whole_again())
    return report


def _wait_for_cleanup(cluster: DrillCluster, remote: RemoteOutage) -> tuple[int, list[str], dict]:
    """Wait (up to CLEANUP_WAIT_S) until every lease file is one a lease node names; returns how many
    orphans there were at first, and the last listing and nodes."""
    first = None
    deadline = time.monotonic() + CLEANUP_WAIT_S
    while True:
        nodes = lease_nodes(cluster.zk)
        listed = remote.lease_files()
        referenced = {path for paths in pointers(nodes).values() for path in paths}
        orphans = [path for path in listed if path not in referenced]
        first = len(orphans) if first is None else first
        if not orphans or time.monotonic() > deadline:
            return first, listed, nodes
        time.sleep(0.2)


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
