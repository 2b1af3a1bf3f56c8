"""Local clusters: start, stop and control ZooKeeper, coordinators and tablet servers on this machine.

The public module of ``ops/local_cluster/``: other parts of ``ops`` (the CLI,
drills, benchmarks, the demo) and the tests import from here, never from the
modules behind it:

- :mod:`~kvlease.ops.local_cluster.processes`: the one way to spawn and stop a server
  process, ``free_ports``, ``holds_port``, ``log_tail``;
- :mod:`~kvlease.ops.local_cluster.cluster_file`: ``cluster.json`` (what runs where), changed under a lock
  (``updating``), and the record of a start under way;
- :mod:`~kvlease.ops.local_cluster.launch`: ``start`` and ``stop`` of a whole cluster, and ``running`` (both, around a
  ``with`` block); :mod:`~kvlease.ops.local_cluster.shape`: the shape a start runs (a stopped cluster's own);
  :mod:`~kvlease.ops.local_cluster.settings`: the config settings every server gets (``--set``), checked, kept;
  :mod:`~kvlease.ops.local_cluster.start_waits`: what a start waits for;
- :mod:`~kvlease.ops.local_cluster.control`: status, one process at a time (kill, restart), who leads;
- :mod:`~kvlease.ops.local_cluster.serving`: which buckets are served, and which wait on an operator or a server
  that is down;
- :mod:`~kvlease.ops.local_cluster.zookeeper`: real ZooKeeper servers on loopback;
- :mod:`~kvlease.ops.local_cluster.certs`, :mod:`~kvlease.ops.local_cluster.security`: a throwaway CA and the one
  builder of security settings (servers and clients);
- :mod:`~kvlease.ops.local_cluster.tablet_health`: what a tablet server's health endpoint says;
- :mod:`~kvlease.ops.local_cluster.tablet_disks` (the module itself, as ``tablet_disks``): tablet servers' small disks
  of their own (``cluster start --tablet-disk``), where they are, how full.
"""

from __future__ import annotations

from kvlease.client.cluster_dir import security_settings
from kvlease.ops.local_cluster.certs import CertPaths
from kvlease.ops.local_cluster.certs import generate as generate_certs
from kvlease.ops.local_cluster.cluster_file import (CLUSTER_FILE, STARTING_FILE, ZK_ROOT, bootstrap, client_config,
                                                    cluster_file, load, running_pids, save, updating)
from kvlease.ops.local_cluster.control import ROLES, active_coordinator, kill, member, restart, status, zk_leader
from kvlease.ops.local_cluster.serving import served_buckets
from kvlease.ops.local_cluster.settings import check_settings, parse_setting
from kvlease.ops.local_cluster.start_waits import waiting_line
from kvlease.ops.local_cluster.launch import running, start, stop
from kvlease.ops.local_cluster.processes import (ClusterError, ServerProcess, child_env, dying_with_parent,
                                                 free_ports, holds_port, kept_ports, log_tail, pid_alive, proc_start,
                                                 spawn_server, stop_pids, terminate)
from kvlease.ops.local_cluster.security import client_settings, server_settings, write_private
from kvlease.ops.local_cluster import tablet_disks
from kvlease.ops.local_cluster.tablet_health import read_health, status_fields
from kvlease.ops.local_cluster.zookeeper import (MAIN_CLASSES, ZooKeeperCluster, ZooKeeperError, four_letter,
                                                 is_serving, node_command, server_mode)

__all__ = [
    "CLUSTER_FILE", "STARTING_FILE", "ClusterError", "check_settings", "child_env", "MAIN_CLASSES", "ROLES",
    "ServerProcess", "ZK_ROOT", "ZooKeeperCluster", "ZooKeeperError", "active_coordinator", "bootstrap", "CertPaths",
    "client_config", "client_settings", "cluster_file",
    "dying_with_parent", "four_letter", "free_ports", "generate_certs", "holds_port", "is_serving", "kept_ports", "kill", "load", "log_tail",
    "member", "node_command", "parse_setting", "pid_alive", "proc_start", "read_health", "restart", "running",
    "running_pids", "save",
    "security_settings", "served_buckets", "server_mode", "server_settings", "spawn_server", "start", "status",
    "status_fields", "stop", "stop_pids", "tablet_disks", "terminate", "updating", "waiting_line",
    "write_private", "zk_leader",
]
