"""Failure drills: traffic through the public clients, one kind of fault, then invariants checked.

The public module of ``ops/drills/``: the CLI imports from here.

- :mod:`~kvlease.ops.drills.registry`: the drill names and their modules (``kvlease drill NAME``);
- :mod:`~kvlease.ops.drills.report`: a drill's report of its checks (:class:`kvlease.ops.check.Check`), how it is printed
  and its exit code;
- :mod:`~kvlease.ops.drills.checks`, :mod:`~kvlease.ops.drills.row_checks`, :mod:`~kvlease.ops.drills.read_checks`: the checkers (pure
  functions);
- :mod:`~kvlease.ops.drills.cluster`: the cluster as a drill sees it (clients, shape requirements, its timeouts);
- :mod:`~kvlease.ops.drills.workload`: the row writers and the scan read on after a fault that several drills share;
  :mod:`~kvlease.ops.drills.faults`: the faults several drills make and undo (the remote storage taken away, a
  process paused);
- :mod:`~kvlease.ops.drills.leases`: the lease workload; :mod:`~kvlease.ops.drills.lease_layout`,
  :mod:`~kvlease.ops.drills.zk_txnlog`: reading leases and ZooKeeper's transaction logs back;
- :mod:`~kvlease.ops.drills.replica_drill`, :mod:`~kvlease.ops.drills.replica_traffic`: what the replica drills share (a
  replicated table under load, every replica's changelog and table judged); their pure checkers in
  :mod:`~kvlease.ops.drills.service_checks`, :mod:`~kvlease.ops.drills.disk_loss_checks`, :mod:`~kvlease.ops.drills.decommission_checks`;
- one module per drill (``coordinator_failover``, ``zk_leader_loss``, ``tablet_restart``, ``tablet_failover``,
  ``rolling_restart``, ``disk_loss``, ``decommission``, ``remote_outage``, ``spark_failover``, ``chaos`` with
  ``chaos_plan``, ``chaos_faults`` and ``chaos_readers``, ``all``).
"""

from __future__ import annotations

from kvlease.ops.drills.registry import DRILLS, SkipError, check_skip, drill_module, drill_names, drill_summary
from kvlease.ops.check import MAX_SHOWN, Check
from kvlease.ops.drills.report import EXIT_OK, EXIT_VIOLATED, Report, finish, render

__all__ = ["DRILLS", "EXIT_OK", "EXIT_VIOLATED", "MAX_SHOWN", "Check", "Report", "SkipError", "check_skip",
           "drill_module", "drill_names", "drill_summary", "finish", "render"]
