"""Replicated buckets on a tablet server (docs/replication.md; docs/bucket-store.md, "Replication").

Two kinds of module, and only the first kind is pure:

- **pure state machines**, no I/O, no clock, no threads (time is passed in), tested apart:
  :mod:`~tablet.replication.epochs` (a replica's leader-epoch cache and the truncation a follower needs
  after a leader change, KIP-101 / KIP-279), :mod:`~tablet.replication.isr` (the leader's view of its
  followers: the high watermark, who leaves or joins the ISR, writes waiting for the HW),
  :mod:`~tablet.replication.sequences` (the idempotent writers' sequence table),
  :mod:`~tablet.replication.roles` (what the coordinator's push says of a bucket).
- **the shell** that runs them with locks, threads, gRPC and storage:
  :mod:`~tablet.replication.leader` (one leadership: a lock around the ISR view and the bucket store),
  :mod:`~tablet.replication.fetch_service` (the leader answering followers' fetches),
  :mod:`~tablet.replication.fetcher` (the follower's fetch threads and the applier),
  :mod:`~tablet.replication.isr_changes` (the leader's ISR upkeep, AlterIsr to the coordinator),
  :mod:`~tablet.replication.rebuild`, :mod:`~tablet.replication.snapshot_download` and
  :mod:`~tablet.replication.throttle` (rebuilding a follower from a remote snapshot),
  :mod:`~tablet.replication.worker` (a per-replica work queue on a thread of its own).
"""
