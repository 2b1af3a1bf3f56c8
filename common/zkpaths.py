"""ZooKeeper paths (relative to the configured chroot ``zookeeper.path.root``).

See docs/architecture.md, "ZooKeeper layout".
"""

from __future__ import annotations

COORDINATORS = "/coordinators"
ELECTION = "/coordinators/election"
ACTIVE = "/coordinators/active"
EPOCH = "/coordinators/epoch"
TABLET_SERVERS = "/tabletservers/ids"
#: Persistent, written by the active coordinator: the data dir id it last saw each tablet server id register with.
TABLET_DIRS = "/tabletservers/dirs"
#: Persistent, written by the active coordinator: the incarnation of each tablet server it last saw registered
#: (coordinator/seen_servers.py), so a new active coordinator knows which servers restarted meanwhile.
TABLET_SEEN = "/tabletservers/seen"
#: Persistent, made by each tablet server before it registers; the active coordinator bumps a server's node (its
#: version) before a write that takes a leadership from it: the server's leader lease rests on that version
#: (tablet/replication/leader_lease.py).
TABLET_DEMOTIONS = "/tabletservers/demotions"
DATABASES = "/databases"
TABLES = "/tables"
TABLE_ID_COUNTER = "/tables/id_counter"
SNAPSHOTS = "/snapshots"
LEASES = "/leases/kv_snapshot"
#: Persistent, written by the active coordinator: the bucket leaders' last reported log ends, per table.
LOG_ENDS = "/log-ends"
#: Persistent, written by the active coordinator: the tablet servers being retired (``cluster decommission``), one
#: node per server id; they take no new replicas until ``cluster recommission`` deletes the node.
DECOMMISSIONED = "/decommissioned"

SECURITY = "/security"
USERS = "/security/users"
ACLS = "/security/acls"
#: Created by the security stores themselves (not at bootstrap), so a cluster without security has none.
SECURITY_ROOTS = (SECURITY, USERS, ACLS)

ROOTS = (COORDINATORS, ELECTION, TABLET_SERVERS, DATABASES, TABLES, SNAPSHOTS, LEASES)


def tablet_server(server_id: int | str) -> str:
    return f"{TABLET_SERVERS}/{server_id}"


def log_ends(table_id: int | str) -> str:
    return f"{LOG_ENDS}/{table_id}"


def decommissioned(server_id: int | str) -> str:
    return f"{DECOMMISSIONED}/{server_id}"


def tablet_demotions(server_id: int | str) -> str:
    return f"{TABLET_DEMOTIONS}/{server_id}"


def tablet_dir(server_id: int | str) -> str:
    return f"{TABLET_DIRS}/{server_id}"


def database(db: str) -> str:
    return f"{DATABASES}/{db}"


def database_tables(db: str) -> str:
    return f"{DATABASES}/{db}/tables"


def table_name(db: str, name: str) -> str:
    return f"{DATABASES}/{db}/tables/{name}"


def table(table_id: int) -> str:
    return f"{TABLES}/{table_id}"


def table_assignment(table_id: int) -> str:
    return f"{TABLES}/{table_id}/assignment"


def table_schemas(table_id: int) -> str:
    """A table's schema versions (docs/schemas.md, "Schema evolution"): one child per version."""
    return f"{TABLES}/{table_id}/schemas"


def table_schema(table_id: int, schema_id: int) -> str:
    return f"{TABLES}/{table_id}/schemas/{schema_id}"


def table_snapshots(table_id: int) -> str:
    return f"{SNAPSHOTS}/{table_id}"


def bucket_snapshots(table_id: int, bucket: int, partition_id: int | None = None) -> str:
    return f"{SNAPSHOTS}/{table_id}/{bucket_dir(bucket, partition_id)}"


def snapshot(table_id: int, bucket: int, snapshot_id: int, partition_id: int | None = None) -> str:
    return f"{bucket_snapshots(table_id, bucket, partition_id)}/{snapshot_id}"


def lease(lease_id: str) -> str:
    return f"{LEASES}/{lease_id}"


def bucket_dir(bucket: int, partition_id: int | None = None) -> str:
    """``3`` for a bucket of a non-partitioned table, ``p7-3`` for partition 7."""
    return str(bucket) if partition_id is None else f"p{partition_id}-{bucket}"


def parse_bucket_dir(name: str) -> tuple[int | None, int]:
    """Inverse of :func:`bucket_dir`: ``(partition_id, bucket)``."""
    if name.startswith("p"):
        partition, bucket = name[1:].split("-", 1)
        return int(partition), int(bucket)
    return None, int(name)


def user(name: str) -> str:
    """A user's node; its data is the password-hash record (``common.security.passwords``)."""
    return f"{USERS}/{name}"


def acl_type(resource_type: str) -> str:
    """The parent of every ACL node of one resource type (``cluster``, ``database``, ``table``)."""
    return f"{ACLS}/{resource_type}"


def acl(resource_type: str, name: str) -> str:
    """The ACL entries (a JSON list) of one resource, e.g. ``/security/acls/table/db.t``."""
    return f"{ACLS}/{resource_type}/{name}"
