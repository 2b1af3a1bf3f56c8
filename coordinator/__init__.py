"""The coordinator: tables, bucket replicas and leaders, KV snapshots and leases, on one event loop.

Its modules come in two kinds, named so a reader can tell them apart:

- **plans** (``*_plan.py``): pure functions from the cluster's state to the changes to make — no
  ZooKeeper, no clock, no threads (``election_plan``: leaders and ISRs as servers come and go;
  ``placement_plan``: where new replicas go; ``reassignment_plan`` and ``rebalance_plan``: moving replicas;
  ``leader_balance_plan``: preferred leaders; ``data_loss_plan``: lost replicas, restores, operator
  elections). Their tests are ``tests/coordinator/test_*_plan.py``.
- **shells**, named for what they run: each takes a plan's changes and carries them out on the event
  loop's thread, fenced in ZooKeeper, and tells the tablet servers (``membership``, ``moves``,
  ``preferred_leaders``, ``data_loss``, ``tables``, ``snapshot_commits``, ``lease_shell``, …).

The design: docs/architecture.md.
"""

import kvlease.common  # noqa: F401  (first: it settles gRPC's fork setting before anything imports grpc)
