"""The buckets a tablet server holds a replica of (docs/replication.md; docs/operations.md).

:class:`~tablet.replicas.manager.ReplicaManager` takes the coordinator's pushes and owns its parts:
snapshots and changelog retention (:mod:`~tablet.replicas.snapshots`), replicas whose data was found lost
(:mod:`~tablet.replicas.loss`) and local copies no longer held (:mod:`~tablet.replicas.local_copies`);
one replica's store, role and leadership (:mod:`~tablet.replicas.replica`). Around them: the background
keeper that opens and repairs buckets (:mod:`~tablet.replicas.keeper`), the server's health
(:mod:`~tablet.replicas.health`), its data dir's identity and restores (:mod:`~tablet.replicas.lost_data`),
stray copies (:mod:`~tablet.replicas.stray_copies`) and a leader that cannot write stepping down
(:mod:`~tablet.replicas.step_down`).

May import ``tablet.log``, ``tablet.store``, ``tablet.bucket``, ``tablet.replication`` and
``tablet.periodic``.
"""
