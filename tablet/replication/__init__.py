"""Replicated buckets (docs/bucket-store.md, "Replication"): the pure building blocks.

Each module here is pure — no I/O, no clock, no threads; time is passed in —
so the tablet server's replication shell can be tested apart from them:

- :mod:`tablet.replication.epochs`: a replica's leader-epoch cache and the
  truncation a follower needs after a leader change (KIP-101 / KIP-279).
- :mod:`tablet.replication.isr`: the leader's view of its followers — the high
  watermark, who leaves or joins the ISR, and the writes waiting for the HW.
- :mod:`tablet.replication.sequences`: the writer sequence table of idempotent
  writes (append, duplicate or out of order).
"""
