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
(:class:`kvlease.ops.drills.faults.RemoteOutage`, which chaos uses too.)
"""

from __future__ import annotations

import time

from kvlease.ops import local_cluster
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.checks import OK, failures_clean, no_orphan_files, pointers_resolve, recovered
from kvlease.ops.drills.cluster import DrillCluster, require
from kvlease.ops.drills.faults import RemoteOutage
from kvlease.ops.drills.leases import LeaseDrill
from kvlease.ops.drills.lease_layout import lease_nodes, pointer_sample, pointers
from kvlease.ops.wait import poll

NAME = "remote-outage"
OPTIONS = ("clients", "seed", "outage")
ACKS = 200
SAMPLE_EVERY_S = 0.5
RECOVERY_BOUND_S = 30.0
CLEANUP_WAIT_S = 15.0
REQUEST_TIMEOUT_S = 5.0
RETRY_TOTAL_S = 2.0  # short, so calls during the outage fail instead of waiting it out


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=1, file_remote=True)


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
    seen: list[tuple[int, list[str], dict]] = []  # (orphans, listing, nodes) of each look

    def clean() -> bool:
        nodes = lease_nodes(cluster.zk)
        listed = remote.lease_files()
        referenced = {path for paths in pointers(nodes).values() for path in paths}
        seen.append((len([path for path in listed if path not in referenced]), listed, nodes))
        return not seen[-1][0]
    poll(clean, CLEANUP_WAIT_S, interval_s=0.2)
    return seen[0][0], seen[-1][1], seen[-1][2]


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
