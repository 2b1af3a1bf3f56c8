"""Live KV scans on a bucket's leader (docs/live-scans.md).

The pure scanner-session state machine (:mod:`~tablet.scan.manager`, its scanners' TTLs and budgets) and
the shell that carries it out (:mod:`~tablet.scan.service`): sessions holding a RocksDB snapshot
(:mod:`~tablet.scan.session`), batches read into Arrow buffers (:mod:`~tablet.scan.batch`), answers
serialized by hand (:mod:`~tablet.scan.wire`), who may scan (:mod:`~tablet.scan.access`) and the metrics
(:mod:`~tablet.scan.metrics`).

May import ``tablet.store``, ``tablet.bucket``, ``tablet.replicas`` and ``tablet.authz``.
"""
