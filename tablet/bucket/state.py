"""What a bucket store shares with its parts (``tablet/bucket/store.py``): which bucket it holds, and its role.

:class:`~kvlease.tablet.bucket.store.BucketStore` owns its parts (writes, reads,
replication) and gives each what it uses: the files, the write lock, the
leader-epoch cache (``tablet/log/epoch_file.py``), and these two small objects, together one
:class:`BucketShared`: what a part holds as ``self.bucket``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlease.common.codec import RowCodec

if TYPE_CHECKING:  # the parts import this module; these only annotate
    from kvlease.tablet.bucket.files import BucketFiles
    from kvlease.tablet.log.epoch_file import EpochFile
    from kvlease.tablet.log.writer_sequences import WriterSequences
    from kvlease.tablet.store.prewrite_buffer import PrewriteBuffer


@dataclass
class BucketSpec:
    """The bucket a store holds: its ``dir`` (named in errors), its ``bucket`` (every key written or looked
    up must hash to it; None: not checked), its table's ``codec``, the largest row a write may carry
    (``max_row_bytes``, ``table.max-row-size``) and whether it is ``replicated`` (writes wait for the high
    watermark before RocksDB applies them). Only ``codec`` changes: the store replaces it, under its write
    lock, when its table's schema changes (docs/schemas.md); the parts read it at each use."""

    dir: str
    bucket: int | None
    codec: RowCodec
    max_row_bytes: int
    replicated: bool


@dataclass
class WriteRole:
    """The role a bucket's writes are appended under; changed under the store's write lock."""

    #: The epoch of this bucket's leadership that its writes are appended under (stamped on each
    #: changelog entry; -1: not known, e.g. a store opened outside a tablet server).
    leader_epoch: int = -1
    #: Replicated: this replica follows (``become_follower``) and appends only what its leader sent. A
    #: write that passed its leadership's check before the role changed is refused under the write lock
    #: (it would be stamped with the new leader's epoch, so no divergence check could find it).
    following: bool = False


@dataclass(frozen=True)
class BucketShared:
    """What a bucket store's parts share, one object each part holds (as ``self.bucket``): what the store
    holds (``spec``), its ``files``, the ``write_lock`` that serializes writes and role changes, the ``role``
    its writes are stamped with, the idempotent ``writers``, the replicated leader's pre-write ``buffer`` and
    the leader-epoch cache (``epoch_file``). The store makes it once; no part replaces any of them."""

    spec: BucketSpec
    files: BucketFiles
    write_lock: threading.RLock
    role: WriteRole
    writers: WriterSequences
    buffer: PrewriteBuffer
    epoch_file: EpochFile
