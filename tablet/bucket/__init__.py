"""One bucket: its store and the parts the store owns (docs/bucket-store.md).

:class:`~tablet.bucket.store.BucketStore` (:mod:`~tablet.bucket.store`) owns its parts, each constructed
apart and given what it uses (:mod:`~tablet.bucket.state`): the write path (:mod:`~tablet.bucket.writes`),
the reads (:mod:`~tablet.bucket.reads`) and its side of replication (:mod:`~tablet.bucket.replication`: the
high watermark, a follower's log, leader epochs). Its files are opened on demand and reopened after a
failure (:mod:`~tablet.bucket.files`), at most so many at once per server
(:mod:`~tablet.bucket.open_buckets`); damaged files are moved aside (:mod:`~tablet.bucket.damage`); a write
is checked before anything is appended (:mod:`~tablet.bucket.write_checks`).

May import ``tablet.log`` and ``tablet.store``.
"""
