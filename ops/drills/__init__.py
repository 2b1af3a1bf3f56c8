"""Failure drills: traffic through the public clients, one kind of fault, then invariants checked.

The public module of ``ops/drills/``: the CLI imports from here.

- :mod:`~ops.drills.registry`: the drill names and their modules (``kvlease drill NAME``);
- :mod:`~ops.drills.report`: a drill's report of its checks (:class:`ops.check.Check`), how it is printed
  and its exit code;
- :mod:`~ops.drills.checks`, :mod:`~ops.drills.row_checks`, :mod:`~ops.drills.read_checks`: the checkers (pure
  functions);
- :mod:`~ops.drills.cluster`: the cluster as a drill sees it (clients, shape requirements, its timeouts);
- :mod:`~ops.drills.workload`: the row writers and the scan read on after a fault that several drills share;
  :mod:`~ops.drills.faults`: the faults several drills make and undo (the remote storage taken away, a
  process paused);
- :mod:`~ops.drills.leases`: the lease workload; :mod:`~ops.drills.lease_layout`,
  :mod:`~ops.drills.zk_txnlog`: reading leases and ZooKeeper's transaction logs back;
- :mod:`~ops.drills.replica_drill`, :mod:`~ops.drills.replica_traffic`: what the replica drills share (a
  replicated table under load, every replica's changelog and table judged); their pure checkers in
  :mod:`~ops.drills.service_checks`, :mod:`~ops.drills.disk_loss_checks`, :mod:`~ops.drills.decommission_checks`;
- one module per drill (``coordinator_failover``, ``zk_leader_loss``, ``tablet_restart``, ``tablet_failover``,
  ``rolling_restart``, ``disk_loss``, ``decommission``, ``remote_outage``, ``spark_failover``, ``chaos`` with
  ``chaos_plan``, ``chaos_faults`` and ``chaos_readers``, ``all``).
"""

from __future__ import annotations

from ops.drills.registry import DRILLS, SkipError, check_skip, drill_module, drill_names, drill_summary
from ops.check import MAX_SHOWN, Check
from ops.drills.report import EXIT_OK, EXIT_VIOLATED, Report, finish, render

__all__ = ["DRILLS", "EXIT_OK", "EXIT_VIOLATED", "MAX_SHOWN", "Check", "Report", "SkipError", "check_skip",
           "drill_module", "drill_names", "drill_summary", "finish", "render"]
