"""Leases as persisted, read from the documented layout (docs/architecture.md), not with the coordinator's code.

``/leases/kv_snapshot/{lease_id}`` holds ``{version, expiration_time, tables:
[{table_id, metadata_path}]}``; each metadata file (on remote storage, under
``lease/kv-snapshot/``) holds ``{version: 2, table_id, leases: {lease_id:
[{partition_id, bucket, snapshot_id}]}}`` for the leases a batch wrote (format
1, one lease per file: ``{version: 1, lease_id, table_id, buckets: [...]}``).
The drills read them here so that what they check does not depend on the
loader they check (``ops`` does not import ``leases``).
"""

from __future__ import annotations

import json
from typing import Callable, Mapping

from kazoo.exceptions import NoNodeError

from kvlease.common import zkpaths
from kvlease.common.model import TableBucket
from kvlease.common.storage import StorageNotFound
from kvlease.common.zk import loads
from kvlease.ops.drills.checks import LeaseView, PointerSample

LEASE_FILES = "lease/kv-snapshot"  # docs/architecture.md, "Remote storage layout"


def lease_nodes(zk, prefix: str = "") -> dict[str, tuple[int, dict]]:
    """``lease id -> (node version, node)`` of the lease nodes whose id starts with ``prefix``."""
    try:
        names = [n for n in zk.get_children(zkpaths.LEASES) if n.startswith(prefix)]
    except NoNodeError:
        return {}
    nodes = {}
    for name in names:
        try:
            data, stat = zk.get(zkpaths.lease(name))
        except NoNodeError:
            continue
        nodes[name] = (stat.version, loads(data))
    return nodes


def pointers(nodes: Mapping[str, tuple[int, dict]]) -> dict[str, list[str]]:
    return {name: [t["metadata_path"] for t in node["tables"]] for name, (_v, node) in nodes.items()}


def persisted_views(nodes: Mapping[str, tuple[int, dict]], read: Callable[[str], bytes]) -> dict[str, LeaseView]:
    """Each lease as its node and files say (a missing file adds nothing: pointers_resolve reports it)."""
    views = {}
    for name, (_version, node) in nodes.items():
        buckets: dict[TableBucket, int] = {}
        for table in node["tables"]:
            try:
                doc = json.loads(read(table["metadata_path"]))
            except StorageNotFound:
                continue
            rows = doc["buckets"] if doc.get("version") == 1 else doc["leases"].get(name, [])
            for row in rows:
                buckets[TableBucket(int(doc["table_id"]), int(row["bucket"]), row.get("partition_id"))] = \
                    int(row["snapshot_id"])
        views[name] = (int(node["expiration_time"]), buckets)
    return views


def pointer_sample(zk, list_files: Callable[[], list[str]], when: str, prefix: str = "") -> PointerSample:
    """Lease pointers and files read so that they fit: the nodes, the files, the nodes again; a lease
    whose node changed meanwhile is left out (its old file may have gone with the change)."""
    before = lease_nodes(zk, prefix)
    existing = frozenset(list_files())
    after = lease_nodes(zk, prefix)
    stable = {name: entry for name, entry in before.items() if after.get(name, (None,))[0] == entry[0]}
    return PointerSample(when, pointers(stable), existing)


def view_of(lease) -> LeaseView:
    return lease.expiration_time, dict(lease.buckets)
