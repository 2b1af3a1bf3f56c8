"""Replication between a bucket's replicas (docs/replication.md; docs/bucket-store.md, "Replication").

Two kinds of module, and only the first kind is pure:

- **pure state machines**, no I/O, no clock, no threads (time is passed in), tested apart:
  :mod:`~kvlease.tablet.replication.isr` (the leader's view of its followers: the high watermark, who leaves or
  joins the ISR, writes waiting for the HW), :mod:`~kvlease.tablet.replication.roles` (what the coordinator's push
  says of a bucket). (The leader-epoch cache and the writers' sequence table, pure too, are the log's:
  :mod:`kvlease.tablet.log.epochs`, :mod:`kvlease.tablet.log.sequences`.)
- **the shell** that runs them with locks, threads, gRPC and storage:
  :mod:`~kvlease.tablet.replication.leader` (one leadership: a lock around the ISR view and the bucket store),
  :mod:`~kvlease.tablet.replication.leader_lease` (whether the buckets this server leads may answer now),
  :mod:`~kvlease.tablet.replication.fetch_service` (the leader answering followers' fetches),
  :mod:`~kvlease.tablet.replication.fetcher` (the follower's fetch threads and the applier),
  :mod:`~kvlease.tablet.replication.isr_changes` (the leader's ISR upkeep, AlterIsr to the coordinator),
  :mod:`~kvlease.tablet.replication.rebuild`, :mod:`~kvlease.tablet.replication.snapshot_download`,
  :mod:`~kvlease.tablet.replication.throttle` and :mod:`~kvlease.tablet.replication.rebuild_progress` (rebuilding a
  follower from a remote snapshot, and its metrics), :mod:`~kvlease.tablet.replication.worker` (a per-replica
  work queue on a thread of its own).

May import ``tablet.log``, ``tablet.store``, ``tablet.bucket`` and ``tablet.periodic``.
"""
