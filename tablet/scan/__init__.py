"""Live KV scans on a bucket's leader (docs/live-scans.md).

The pure scanner-session state machine (:mod:`~kvlease.tablet.scan.manager`, its scanners' TTLs and budgets) and
the shell that carries it out (:mod:`~kvlease.tablet.scan.service`): sessions holding a RocksDB snapshot
(:mod:`~kvlease.tablet.scan.session`), batches read into Arrow buffers (:mod:`~kvlease.tablet.scan.batch`), answers
serialized by hand (:mod:`~kvlease.tablet.scan.wire`), who may scan (:mod:`~kvlease.tablet.scan.access`) and the metrics
(:mod:`~kvlease.tablet.scan.metrics`).

May import ``tablet.store``, ``tablet.bucket``, ``tablet.replicas`` and ``tablet.authz``.
"""
