"""One bucket: its store and the parts the store owns (docs/bucket-store.md).

:class:`~kvlease.tablet.bucket.store.BucketStore` (:mod:`~kvlease.tablet.bucket.store`) owns its parts, each constructed
apart and given what it uses (:mod:`~kvlease.tablet.bucket.state`): the write path (:mod:`~kvlease.tablet.bucket.writes`),
the reads (:mod:`~kvlease.tablet.bucket.reads`) and its side of replication (:mod:`~kvlease.tablet.bucket.replication`: the
high watermark, a follower's log, leader epochs). Its files are opened on demand and reopened after a
failure (:mod:`~kvlease.tablet.bucket.files`), at most so many at once per server
(:mod:`~kvlease.tablet.bucket.open_buckets`); damaged files are moved aside (:mod:`~kvlease.tablet.bucket.damage`); a write
is checked before anything is appended (:mod:`~kvlease.tablet.bucket.write_checks`).

May import ``tablet.log`` and ``tablet.store``.
"""
