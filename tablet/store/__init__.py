"""A bucket's RocksDB and its remote snapshots (docs/bucket-store.md; docs/snapshots.md).

:mod:`~tablet.store.kvstore` (current rows, the applied offset, checkpoints), the key ranges it may hold
(:mod:`~tablet.store.key_ranges`), the change records of a write (:mod:`~tablet.store.change_records`,
pure), the leader's pre-write buffer of entries not yet committed (:mod:`~tablet.store.prewrite_buffer`),
memtable Bloom filters (:mod:`~tablet.store.memtable_filter`); incremental snapshot upload
(:mod:`~tablet.store.snapshot`) and a snapshot's crash-safe install as a bucket's files
(:mod:`~tablet.store.snapshot_install`).

May import ``tablet.log``.
"""
