"""A bucket's changelog: what was written, in order, and under which leader (docs/changelog.md).

:mod:`~kvlease.tablet.log.changelog` (framed entries, one per write batch, numbered records) in segment files
(:mod:`~kvlease.tablet.log.segment_files`: names, recovery at open, bytes in and out) with an in-memory
:mod:`~kvlease.tablet.log.index` per segment; the leader-epoch cache (:mod:`~kvlease.tablet.log.epochs`, pure: which
epoch wrote which stretch, and where a follower's log diverges) and its file (:mod:`~kvlease.tablet.log.epoch_file`);
the idempotent writers' sequence table (:mod:`~kvlease.tablet.log.sequences`, pure) and its store
(:mod:`~kvlease.tablet.log.writer_sequences`); the long polls of log readers at the log's committed end
(:mod:`~kvlease.tablet.log.waits`: clients' FetchLog, followers' ReplicaFetch).

Imports nothing else of ``tablet``: the log is the floor the rest stands on.
"""
