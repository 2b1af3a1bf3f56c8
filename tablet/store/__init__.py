"""A bucket's RocksDB and its remote snapshots (docs/bucket-store.md; docs/snapshots.md).

:mod:`~kvlease.tablet.store.kvstore` (current rows, the applied offset, checkpoints), the key ranges it may hold
(:mod:`~kvlease.tablet.store.key_ranges`), the change records of a write (:mod:`~kvlease.tablet.store.change_records`,
pure), the leader's pre-write buffer of entries not yet committed (:mod:`~kvlease.tablet.store.prewrite_buffer`),
memtable Bloom filters (:mod:`~kvlease.tablet.store.memtable_filter`); incremental snapshot upload
(:mod:`~kvlease.tablet.store.snapshot`) and a snapshot's crash-safe install as a bucket's files
(:mod:`~kvlease.tablet.store.snapshot_install`).

May import ``tablet.log``.
"""
