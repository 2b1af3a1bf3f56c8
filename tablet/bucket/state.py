"""What a bucket store shares with its parts (``tablet/bucket/store.py``): which bucket it holds, and its role.

:class:`~tablet.bucket.store.BucketStore` owns its parts (writes, reads,
replication) and gives each what it uses: the files, the write lock, the
leader-epoch cache (``tablet/log/epoch_file.py``), and these two small objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.codec import RowCodec


@dataclass(frozen=True)
class BucketSpec:
    """The bucket a store holds: its ``dir`` (named in errors), its ``bucket`` (every key written or looked
    up must hash to it; None: not checked), its table's ``codec``, the largest row a write may carry
    (``max_row_bytes``, ``table.max-row-size``) and whether it is ``replicated`` (writes wait for the high
    watermark before RocksDB applies them)."""

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
