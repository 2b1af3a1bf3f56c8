"""The buckets a tablet server holds a replica of (docs/replication.md; docs/operations.md).

:class:`~kvlease.tablet.replicas.manager.ReplicaManager` takes the coordinator's pushes and owns its parts:
the views of the tables and partitions held, by physical id, and which one a request names
(:mod:`~kvlease.tablet.replicas.held_tables`), snapshots and changelog retention
(:mod:`~kvlease.tablet.replicas.snapshots`), replicas whose data was found lost
(:mod:`~kvlease.tablet.replicas.loss`) and local copies no longer held (:mod:`~kvlease.tablet.replicas.local_copies`);
one replica's store, role and leadership (:mod:`~kvlease.tablet.replicas.replica`). Around them: the background
keeper that opens and repairs buckets (:mod:`~kvlease.tablet.replicas.keeper`), the server's health
(:mod:`~kvlease.tablet.replicas.health`), its data dir's identity and restores (:mod:`~kvlease.tablet.replicas.lost_data`),
stray copies (:mod:`~kvlease.tablet.replicas.stray_copies`) and a leader that cannot write stepping down
(:mod:`~kvlease.tablet.replicas.step_down`).

May import ``tablet.log``, ``tablet.store``, ``tablet.bucket``, ``tablet.replication`` and
``tablet.periodic``.
"""
