"""What the coordinator tells a tablet server about one of its buckets: lead it, or follow whom.

Parsed from a push (``BucketLeadershipPb``, ``common/proto/tablet.proto``). A
bucket of a table with one replica is always led by the server it is on; a
replicated bucket's push names its leader (``-1``: none, the bucket is
offline), the leader's address, the replicas, the ISR and the two epochs.
A bucket is replicated while it has more than one replica: a table's, or a
one-replica table's bucket while it is being moved (its new replica copies
it from the old one, ``coordinator/reassignment_plan.py``).

A bucket of a partitioned table's partition is pushed with the partition's view of its table
(``TableInfoPb.partition_id`` and ``partition_name`` set, ``table_id`` the table's): a push naming a
partitioned table's own buckets, a partition of an unpartitioned table, or a ``partition_id`` beside the
view that differs from the view's, is refused whole (:func:`check_view`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlease.common import errors
from kvlease.common.data_loss import DataLoss
from kvlease.common.tables import TableInfo
from kvlease.common.wire import table_from_pb

NO_LEADER = -1


@dataclass(frozen=True)
class BucketRole:
    table: TableInfo
    bucket: int
    leader_epoch: int
    leader: int  # the leading tablet server's id (NO_LEADER: offline)
    leader_address: str = ""
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    bucket_epoch: int = 0
    #: this server is no longer a replica (a completed move took it off): it deletes its copy
    removed: bool = False
    offline_reason: str = ""  # no leader because its data is lost: why
    latest_loss: DataLoss | None = None  # the bucket's newest accepted loss (tablet/replicas/lost_data.py)
    #: whether this server still owes ``latest_loss``, a restore (None: the coordinator does not know)
    restore_owed: bool | None = None
    #: told to the leader: how long (ms from receipt) an earlier leader's lease may still last; it serves a
    #: leadership new to it only after that (tablet/replication/leader_lease.py)
    lease_wait_ms: int = 0

    @property
    def key(self) -> tuple[int, int]:
        """``(physical id, bucket)``: a partition's bucket is held by the partition's id (``common/tables.py``)."""
        return self.table.physical_id, self.bucket

    @property
    def replicated(self) -> bool:
        """Whether the bucket has more than one replica: its table's replication factor, or the replicas
        pushed (a one-replica bucket being moved). Its store then keeps a pre-write buffer."""
        return self.table.replication_factor > 1 or len(self.replicas) > 1

    def leads(self, server_id: int) -> bool:
        return self.leader == server_id

    @classmethod
    def led(cls, table: TableInfo, bucket: int, leader_epoch: int, server_id: int) -> "BucketRole":
        """A bucket this server leads alone (a push without replication state)."""
        return cls(table, bucket, leader_epoch, server_id, "", (server_id,), (server_id,), leader_epoch)

    @classmethod
    def from_pb(cls, msg, table: TableInfo, server_id: int) -> "BucketRole":
        """The role a ``BucketLeadershipPb`` pushes, of a bucket of ``table`` (its view, read from ``msg.table``);
        InvalidRequestError if they do not agree (:func:`check_view`)."""
        check_view(msg, table)
        if not msg.HasField("leader"):
            return cls.led(table, msg.bucket, msg.leader_epoch, server_id)
        return cls(table, msg.bucket, msg.leader_epoch, msg.leader, msg.leader_address, tuple(msg.replicas),
                   tuple(msg.isr), msg.bucket_epoch, msg.removed, msg.offline_reason,
                   DataLoss.from_pb(msg.latest_loss) if msg.HasField("latest_loss") else None,
                   msg.restore_owed if msg.HasField("restore_owed") else None, max(0, msg.lease_wait_ms))


def check_view(msg, table: TableInfo) -> None:
    """InvalidRequestError unless ``table`` (read from a ``BucketLeadershipPb``'s ``table``) is an unpartitioned
    table or a partition's view, and the message's own ``partition_id``, if set, is the view's."""
    where = f"bucket {msg.bucket} of {table.path} (table id {table.table_id})"
    if table.partitioned and table.partition_id is None:
        raise errors.InvalidRequestError(f"push names {where}, but a partitioned table has no buckets of its own: "
                                         "a partition's view (partition_id) was expected")
    if not table.partitioned and table.partition_id is not None:
        raise errors.InvalidRequestError(f"push names {where} of partition {table.partition_id}, but the table is "
                                         "not partitioned")
    if msg.HasField("partition_id") and msg.partition_id != table.partition_id:
        view = "is not partitioned" if table.partition_id is None else f"view is of partition {table.partition_id}"
        raise errors.InvalidRequestError(f"push names {where} with partition_id {msg.partition_id}, but its table "
                                         f"{view}")


class PushedRoles:
    """The roles of a push's ``BucketLeadershipPb`` messages, of this server ``server_id``: a message equal byte
    for byte to one of the previous push gives the role parsed from it then (the same object); the others are
    parsed (:meth:`BucketRole.from_pb`), each table view once per push. Thread-safe: pushes taken at once may
    only parse more."""

    def __init__(self, server_id: int) -> None:
        self.server_id = server_id
        self._last: dict[bytes, BucketRole] = {}  # the previous push's roles by their messages' bytes

    def parse(self, msgs) -> list[BucketRole]:
        """The roles of ``msgs``; InvalidRequestError (:func:`check_view`) if one is refused (then nothing
        is remembered)."""
        last, now, views = self._last, {}, {}
        roles = []
        for msg in msgs:
            raw = msg.SerializeToString()
            role = last.get(raw)
            if role is None:
                view_raw = msg.table.SerializeToString()
                table = views.get(view_raw)
                if table is None:
                    table = views[view_raw] = table_from_pb(msg.table)
                role = BucketRole.from_pb(msg, table, self.server_id)
            now[raw] = role
            roles.append(role)
        self._last = now
        return roles
