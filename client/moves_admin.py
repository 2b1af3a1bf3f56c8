"""The replica-moving part of the admin client (issue 31): reassign a bucket, decommission a tablet server (and
recommission it), rebalance, list the moves in progress.

:class:`MovesAdmin` is a part of :class:`kvlease.client.admin.AdminClient`, built on a
coordinator call (:meth:`kvlease.client.coordinator_caller.CoordinatorCaller.call`) and
the admin client's ``get_table``. These are admin operations (with security on: ``ALTER``
on the cluster; listing: ``DESCRIBE``). Every call is safe to resend after a
lost answer: a reassign with the same target answers the move in progress (or
``done``), a decommission answers the moves off the server whenever started, a
rebalance of a balanced cluster starts nothing, a recommission of a server not
marked answers False.

A move's document: ``{"table", "table_id", "partition"?, "partition_id"?, "bucket", "replicas", "target",
"isr", "leader", "state", "waiting", "removing"}`` (``partition``: a partition's bucket only) —
``state`` ``moving`` (``waiting``: target replicas not in the ISR yet; ``removing``: replicas the move
takes the bucket off) or ``done``.
"""

from __future__ import annotations

from typing import Callable, Sequence

from kvlease.client.coordinator_caller import CoordinatorCall
from kvlease.client.transport import arguments, is_int
from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.tables import TableInfo, parse_table_path


def move_doc(move) -> dict:
    """A ``BucketMovePb`` as a document (see the module docstring); a partition's bucket also has ``partition``
    (its name) and ``partition_id``."""
    partition = ({"partition": move.partition, "partition_id": move.partition_id}
                 if move.HasField("partition_id") else {})
    return {"table": move.table, "table_id": move.table_id, **partition, "bucket": move.bucket,
            "replicas": list(move.replicas), "target": list(move.target), "isr": list(move.isr), "leader": move.leader,
            "state": move.state, "waiting": list(move.waiting), "removing": list(move.removing)}


class MovesAdmin:
    """Replica moves; a part of :class:`kvlease.client.admin.AdminClient` (``admin.reassign_bucket(...)``)."""

    def __init__(self, call: CoordinatorCall, get_table: Callable[[str], TableInfo]) -> None:
        """``call``: sends a coordinator call; ``get_table``: the table ``DB.NAME`` (TableNotExistError if
        none)."""
        self._call = call
        self._get_table = get_table

    def reassign_bucket(self, path: str, bucket: int, replicas: Sequence[int], partition: str | None = None) -> dict:
        """Move bucket ``bucket`` of table ``path`` (``DB.NAME``) to the tablet servers ``replicas`` (as many as
        the table's replication factor, live, the preferred leader first); returns the bucket's move (see the
        module docstring). The new replicas copy the bucket and join the ISR, then the old ones leave it
        (:meth:`list_reassignments` shows the progress; a one-replica table's bucket moves through a second
        replica). ``partition``: the name of the partition whose bucket moves (a partitioned table's).
        InvalidRequestError (one line) for a bad list, a bucket none of whose replicas is live, another move
        of the bucket in progress, or ``partition`` on a table that is not partitioned; TableNotExistError,
        BucketOutOfRangeError, PartitionNotExistsError (a partitioned table: the partition named, or none)."""
        db, name = parse_table_path(path)
        if partition is not None and not self._get_table(path).partitioned:  # TableNotExistError first
            raise errors.InvalidRequestError(f"table {path} is not partitioned", table=path)
        if not is_int(bucket) or isinstance(replicas, (str, bytes)) or not all(is_int(r) for r in replicas):
            raise errors.InvalidRequestError(f"reassign_bucket: bucket an int and replicas a list of tablet ids, got "
                                             f"{errors.show(bucket)} and {errors.show(replicas)}")
        with arguments("reassign_bucket"):
            request = pb.ReassignBucketRequest(database=db, name=name, bucket=int(bucket),
                                               replicas=[int(r) for r in replicas], partition=partition or "")
        return move_doc(self._call("ReassignBucket", request).move)

    def decommission_tablet(self, tablet_id: int) -> list[dict]:
        """Move every bucket replica off tablet server ``tablet_id`` (live or gone for good) to the least loaded
        live servers and mark it decommissioned (it takes no new replicas until :meth:`recommission_tablet`);
        returns every move taking a replica off it (started now or by an earlier call; empty once it holds
        nothing). InvalidRequestError, nothing started or marked, if a bucket cannot move (no other live server
        with room, or none of its replicas live) or no tablet server of that id is registered or holds a
        replica."""
        if not is_int(tablet_id):
            raise errors.InvalidRequestError(f"decommission_tablet: a tablet id, got {errors.show(tablet_id)}")
        with arguments("decommission_tablet"):
            request = pb.DecommissionTabletRequest(tablet_id=int(tablet_id))
        return [move_doc(m) for m in self._call("DecommissionTablet", request).moves]

    def recommission_tablet(self, tablet_id: int) -> bool:
        """Clear tablet server ``tablet_id``'s decommission mark: new tables, rebalances and moves may place
        replicas on it again (moves already started off it go on). Returns whether it was decommissioned
        (a resent call: False). InvalidRequestError if no tablet server of that id is known."""
        if not is_int(tablet_id):
            raise errors.InvalidRequestError(f"recommission_tablet: a tablet id, got {errors.show(tablet_id)}")
        with arguments("recommission_tablet"):
            request = pb.RecommissionTabletRequest(tablet_id=int(tablet_id))
        return self._call("RecommissionTablet", request).was_decommissioned

    def rebalance(self, leaders_only: bool = False) -> list[dict]:
        """Even out the replicas over the live tablet servers (moves), spread the preferred leaders (first
        replicas; reordering replica lists, no data moves) and move leaders back to them when they are live and
        in sync; ``leaders_only``: only the leaders, no moves. Returns what was started: moves (``"kind":
        "move"``, a move's document) and leader changes (``"kind": "leader"``: ``table``, ``bucket``,
        ``old_leader``, ``new_leader`` (the bucket's preferred replica now), ``leader_epoch``). Safe to resend:
        a balanced cluster starts nothing."""
        request = pb.RebalanceRequest(leaders_only=leaders_only)
        response = self._call("Rebalance", request)
        return ([{"kind": "move", **move_doc(m)} for m in response.moves]
                + [{"kind": "leader", "table": m.table, "table_id": m.table_id, "bucket": m.bucket,
                    "old_leader": m.old_leader, "new_leader": m.new_leader, "leader_epoch": m.leader_epoch}
                   for m in response.leaders])

    def list_reassignments(self) -> list[dict]:
        """Every move in progress (empty when all are done)."""
        response = self._call("ListReassignments", pb.ListReassignmentsRequest())
        return [move_doc(m) for m in response.moves]
