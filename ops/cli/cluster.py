"""``kvlease cluster start|stop|status|restart``: a local cluster in a directory."""

from __future__ import annotations

import click

from kvlease.common import errors
from kvlease.ops import local_cluster
from kvlease.ops.cli.app import State, catch_errors, cluster_dir_options, kvlease, pass_state
from kvlease.ops.cli.values import POSITIVE_DURATION


@kvlease.group("cluster")
def cluster_group() -> None:
    """Start, stop and inspect a local cluster in a directory."""


def cluster_dir(state: State, directory: str | None) -> str:
    """The directory of a cluster command: ``--dir``, else ``--cluster`` / ``KVLEASE_CLUSTER``."""
    directory = directory or state.cluster
    if not directory:
        raise errors.InvalidRequestError("no cluster directory given: use --dir DIR (or --cluster DIR / KVLEASE_CLUSTER)")
    return directory


@cluster_group.command("start")
@click.option("--dir", "directory", metavar="D", help="Cluster directory (created if missing).")
@click.option("--zk-nodes", type=click.Choice(["1", "3"]), default=None,
              help="ZooKeeper ensemble size.  [default: 1, or a stopped cluster's own]")
@click.option("--coordinators", type=click.IntRange(min=1), default=None,
              help="Coordinators (one active, the others standbys).  [default: 1, or a stopped cluster's own]")
@click.option("--tablets", type=click.IntRange(min=0), default=None,
              help="Tablet servers (ids 1..N); with 0, tables can be made but not written or read.  [default: 1, "
                   "or a stopped cluster's own]")
@click.option("--remote", metavar="URI", help="remote.data.dir (default: file://D/remote, or a stopped cluster's own).")
@click.option("--timeout", "timeout_ms", type=POSITIVE_DURATION, default="60s", show_default=True,
              help="How long to wait for an active coordinator, then for every tablet server to "
                   "register and every bucket to be served.")
@click.option("--secure", is_flag=True, default=None,
              help="Mutual TLS on every port (a throwaway CA and certificates in D/certs), authentication and "
                   "ACLs, with the super user admin (password in D/admin.password); `kvlease --cluster D …` "
                   "then connects with TLS as admin on its own.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              callback=lambda ctx, param, value: _settings(value),
              help="A config key of every coordinator and tablet server (repeatable), checked as in a config file, "
                   "e.g. auto-partition.check-interval=1s. Kept for later starts of D (and restarts); a later --set "
                   "of a key replaces it.")
@click.option("--tablet-disk", "tablet_disk", metavar="SIZE", callback=lambda ctx, param, value: _disk_size(value),
              help="Each tablet server's data dir on a tmpfs of SIZE of its own (e.g. 64m; root only), so a drill "
                   "can fill one server's disk (drill chaos's disk-full) and never the host's. A tmpfs is memory: "
                   "`cluster stop` unmounts it and its rows are gone.")
@cluster_dir_options
@pass_state
@catch_errors
def cluster_start(state: State, directory: str | None, zk_nodes: str | None, coordinators: int | None,
                  tablets: int | None, remote: str | None, timeout_ms: int, secure: bool | None,
                  settings: dict[str, str], tablet_disk: int | None) -> None:
    """Start ZooKeeper, coordinators and tablet servers in the background; returns once a
    coordinator is active, every tablet server is registered and every bucket of every table
    answers on its leader (ready; a bucket that waits on `kvlease bucket restore` is named).
    A stopped cluster started again in D keeps its shape (the options it was started with,
    from D/cluster.json: options that differ are refused), its --set settings, its tables and its
    coordinators' and tablet servers' ports (a port taken meanwhile is replaced, with a warning). A start that
    fails stops what it started, leaves D/cluster.json as it was and names the log files."""
    directory = cluster_dir(state, directory)
    if remote and not remote.startswith(("file:///", "s3://")):
        raise click.BadParameter(f"{errors.show(remote)} is not file:///PATH or s3://BUCKET/PREFIX", param_hint="'--remote'")
    started = local_cluster.start(
        directory, zk_nodes=int(zk_nodes) if zk_nodes else None, coordinators=coordinators, tablets=tablets,
        remote=remote, ready_timeout_s=timeout_ms / 1000.0, progress=lambda text: click.echo(f"{text} …", err=True),
        secure=secure, warn=lambda text: click.echo(f"warning: {text}", err=True), tablet_disk=tablet_disk,
        config_overrides=settings)
    state.output.cluster_status(local_cluster.status(directory))
    if not state.json_mode:
        click.echo(f"cluster running; use it with: kvlease --cluster {directory} …", err=True)
        if "security" in started:
            sec = started["security"]
            address = local_cluster.bootstrap(directory)[0]
            click.echo(f"security is on: `--cluster {directory}` logs in as {sec['username']} (a super user); "
                       f"its password is in {sec['password_file']}. From elsewhere: kvlease --bootstrap {address} "
                       f"--ca-file {sec['ca_file']} --cert-file {sec['cert_file']} --key-file {sec['key_file']} "
                       f"--user {sec['username']} --password-file {sec['password_file']} …; add users with "
                       f"`kvlease --cluster {directory} user add NAME` and grant them with `kvlease acl add`.",
                       err=True)


def _settings(values: tuple[str, ...]) -> dict[str, str]:
    """``--set KEY=VALUE`` (repeated) as config settings; a usage error naming the first bad one."""
    try:
        return local_cluster.check_settings(dict(local_cluster.parse_setting(text) for text in values))
    except local_cluster.ClusterError as exc:
        raise click.BadParameter(exc.message, param_hint="'--set'") from None


def _disk_size(value: str | None) -> int | None:
    try:
        return None if value is None else local_cluster.tablet_disks.parse_size(value)
    except local_cluster.ClusterError as exc:
        raise click.BadParameter(exc.message, param_hint="'--tablet-disk'") from None


@cluster_group.command("stop")
@click.option("--dir", "directory", metavar="D", help="Cluster directory.")
@cluster_dir_options
@pass_state
@catch_errors
def cluster_stop(state: State, directory: str | None) -> None:
    """Stop every process of the cluster (tablet servers, coordinators, then ZooKeeper)."""
    directory = cluster_dir(state, directory)
    result = local_cluster.stop(directory)
    text = (f"stopped {len(result['stopped'])} process(es) in {directory}" if result["stopped"]
            else f"the cluster in {directory} was already stopped")
    state.output.message(text, result)


@cluster_group.command("status")
@click.option("--dir", "directory", metavar="D", help="Cluster directory.")
@cluster_dir_options
@pass_state
@catch_errors
def cluster_status(state: State, directory: str | None) -> None:
    """Which processes run, which coordinator is active, how many buckets each tablet server leads,
    and whether it can serve them all (healthy) or why not."""
    state.output.cluster_status(local_cluster.status(cluster_dir(state, directory)))


@cluster_group.command("restart")
@click.option("--dir", "directory", metavar="D", help="Cluster directory.")
@click.option("--tablet", metavar="N", help="Restart tablet server N.")
@click.option("--coordinator", metavar="N", help="Restart coordinator N.")
@click.option("--zookeeper", metavar="N", help="Restart ZooKeeper node N.")
@click.option("--timeout", "timeout_ms", type=POSITIVE_DURATION, default="60s", show_default=True,
              help="How long to wait until it serves again.")
@cluster_dir_options
@pass_state
@catch_errors
def cluster_restart(state: State, directory: str | None, tablet: str | None, coordinator: str | None,
                    zookeeper: str | None, timeout_ms: int) -> None:
    """Restart one process (stopped with SIGTERM first if it runs) with its own config, port and data;
    returns once it serves: a tablet server once it is registered and every bucket answers, but those
    that wait on another tablet server that is down or on `kvlease bucket restore` (each named: "waiting:
    …"), a coordinator once it answers, a ZooKeeper node once it serves."""
    chosen = [(role, node_id) for role, node_id in (("tablets", tablet), ("coordinators", coordinator),
                                                    ("zookeeper", zookeeper)) if node_id is not None]
    if len(chosen) != 1:
        raise click.UsageError("name exactly one process to restart: --tablet N, --coordinator N or --zookeeper N")
    (role, node_id), = chosen
    directory = cluster_dir(state, directory)
    local_cluster.member(local_cluster.load(directory), role, node_id)  # a process it has: before any progress
    what = f"{local_cluster.ROLES[role]} {node_id}"
    if not state.json_mode:
        click.echo(f"restarting {what} …", err=True)
    entry = local_cluster.restart(directory, role, node_id, ready_timeout_s=timeout_ms / 1000.0, graceful=True)
    doc = {"restarted": {"role": role, "id": int(entry["id"]), "pid": entry["pid"], "address": entry["address"]}}
    lines = [f"restarted {what} (pid {entry['pid']}, {entry['address']})"]
    if "waiting" in entry:
        doc["waiting"] = entry["waiting"]
        lines += [local_cluster.waiting_line(bucket) for bucket in entry["waiting"]]
    state.output.message("\n".join(lines), doc)
