"""Which buckets of a local cluster are served, and which wait on something no server of it brings by itself.

A bucket is served when the tablet server its leader is answers for it
(ListOffsets): what "ready" means to ``cluster start`` and ``cluster restart``.
Of the buckets that are not, some *wait*, as the coordinator's assignment tells
(docs/architecture.md, "Losing and moving replicas"): one whose data was lost is
offline until an operator restores it (``kvlease bucket restore``), and one
whose in-sync replicas' servers are all down is offline until one of them comes
back. A start or a restart names those and returns, instead of waiting them out.
A partitioned table's buckets are its partitions' (docs/partitions.md): each
partition's are asked, and named with their partition.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from kvlease.common.errors import KvLeaseError
from kvlease.ops.local_cluster.cluster_file import client_config


def cluster_admin(doc: Mapping[str, Any], request_timeout_s: float = 2.0):
    """An AdminClient of the cluster of ``doc`` (its cluster.json) that gives up on a coordinator after
    ``request_timeout_s``: what :func:`served_buckets` asks, one for all the polls of a wait."""
    from kvlease.client.admin import AdminClient

    return AdminClient([c["address"] for c in doc["coordinators"]], client_config(doc),
                       request_timeout_s=request_timeout_s, retry_total_s=request_timeout_s)


def serving_now(doc: Mapping[str, Any], admin) -> dict[str, Any]:
    """:func:`served_buckets` (asked through ``admin``, a :func:`cluster_admin`), or, when no coordinator
    answers, the same shape with that as the one unserved line (nothing registered, nothing waiting): one
    poll of a start's or a restart's wait, with :func:`all_served` its verdict."""
    try:
        return served_buckets(doc, admin=admin)
    except KvLeaseError as exc:
        return {"registered": set(), "buckets": 0, "unserved": [exc.message], "waiting": []}


def all_served(state: Mapping[str, Any]) -> bool:
    """Whether every bucket of a :func:`serving_now` state is served, but those that wait."""
    return len(state["unserved"]) == len(state["waiting"])


def served_buckets(doc: Mapping[str, Any], request_timeout_s: float = 2.0, admin=None) -> dict[str, Any]:
    """``{"registered": {tablet ids}, "buckets": n, "unserved": ["db.t/3: why", …], "waiting": [{"table",
    "partition"?, "bucket", "why"}, …]}`` of the cluster of ``doc`` (its cluster.json; a partition's bucket is
    ``db.t/20261127/3``, its waiting entry names its partition): ``waiting`` are the unserved buckets
    that wait on an operator or on a tablet server that is not registered (:func:`waits_for`). Asked through
    ``admin`` (default: a :func:`cluster_admin` of its own). Raises a KvLeaseError when no coordinator
    answers."""
    if admin is None:
        with cluster_admin(doc, request_timeout_s) as own:
            return served_buckets(doc, request_timeout_s, own)
    registered = {s.id for s in admin.list_tablet_servers()}
    unserved: list[str] = []
    waiting: list[dict[str, Any]] = []
    count = 0
    for table in _physical_tables(admin):
        from kvlease.client.table import TableClient  # with a table only: it imports pyarrow (0.5 s of CPU)

        count += table.buckets
        failed: dict[int, str] = {}
        with TableClient(admin, table.table_id, retry_total_s=0, request_timeout_s=request_timeout_s,
                         partition=table if table.partition_id is not None else None) as client:
            for bucket in range(table.buckets):
                try:
                    client.list_offsets([bucket])
                except KvLeaseError as exc:
                    failed[bucket] = exc.message
        where = table.path if table.partition_name is None else f"{table.path}/{table.partition_name}"
        unserved += [f"{where}/{bucket}: {why}" for bucket, why in failed.items()]
        if failed:
            waiting += _waiting(admin, table, failed, registered)
    return {"registered": registered, "buckets": count, "unserved": unserved, "waiting": waiting}


def _physical_tables(admin) -> list:
    """Every unpartitioned table and every partition (its table's view of it): what has buckets."""
    found = []
    for table in admin.list_tables():
        if not table.partitioned:
            found.append(table)
            continue
        try:
            _table, partitions = admin.list_partitions(table_id=table.table_id)
        except KvLeaseError:  # dropped since it was listed
            continue
        found += [table.of_partition(p.partition_id, p.name) for p in partitions]
    return found


def _waiting(admin, table, buckets: Collection[int], live: set[int]) -> list[dict[str, Any]]:
    """Those of ``buckets`` (of ``table``, an unpartitioned table or a partition's view, not served) that wait
    (:func:`waits_for`)."""
    try:
        _info, leaders = admin.get_table_assignment(table.table_id, table.partition_id)
    except KvLeaseError:
        return []  # nothing known: they may yet be served
    found = []
    partition = {} if table.partition_name is None else {"partition": table.partition_name}
    for bucket in sorted(buckets):
        why = waits_for(table.path, bucket, leaders.get(bucket), live, table.partition_name)
        if why:
            found.append({"table": table.path, **partition, "bucket": bucket, "why": why})
    return found


def waits_for(path: str, bucket: int, leader: Any, live: Collection[int], partition: str | None = None) -> str | None:
    """Why bucket ``bucket`` of table ``path`` is offline for longer than a server's start, as its assignment
    ``leader`` (a :class:`kvlease.client.admin_types.BucketLeader`) tells with ``live`` the registered tablet ids: its
    data was lost (an operator restores it) or its last in-sync replicas are down (a one-replica bucket keeps
    its leader's id meanwhile). None: its leader is live (and is to serve it), or one of its in-sync
    replicas is (and is to lead it). ``partition``: the partition whose bucket it is (a partitioned table's)."""
    if leader is None or leader.leader_id in live:
        return None
    if leader.offline_reason:
        named = "" if partition is None else f" --partition {partition}"
        return f"its data was lost: `kvlease bucket restore {path}{named} --bucket {bucket} --accept-data-loss`"
    isr = tuple(leader.isr) or ((leader.leader_id,) if leader.leader_id >= 0 else ())
    if not isr or any(r in live for r in isr):
        return None
    if len(isr) == 1:
        return f"its last in-sync replica, tablet {isr[0]}, is down"
    return f"its last in-sync replicas, tablets {', '.join(map(str, isr))}, are down"
