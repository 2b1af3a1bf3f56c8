"""Read a table's latest KV snapshots under a lease, so that nothing deletes them while you read.

    python examples/lease_guarded_read.py --cluster DIR --table shop.orders
    KVLEASE_CLUSTER=DIR python examples/lease_guarded_read.py --table shop.orders   # the CLI's variables work too

Prints each row as one JSON line, then a summary on stderr. A snapshot is a bucket's rows as of one
changelog offset (``handle.log_offset``); changes after it are in the changelog (see change_feed_replay.py).
Make snapshots first if the table has none: ``kvlease snapshot trigger shop.orders --wait``.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

import kvlease  # import kvlease first: it sets gRPC up before anything else imports grpc


def read_under_lease(kv: kvlease.Connection, table_path: str, duration_ms: int = 60_000) -> list[dict]:
    """Lease the latest snapshot of every bucket, read each, release it; returns the rows."""
    table = kv.admin.get_table(table_path)
    lease_id = f"example-read-{uuid.uuid4().hex[:8]}"  # any name: 1-128 of A-Z a-z 0-9 . _ -
    owner = uuid.uuid4().hex  # our owner token: no other reader can take this lease over
    latest = kv.admin.get_latest_kv_snapshots(table.table_id)  # {TableBucket: SnapshotInfo}
    if not latest:
        print(f"{table_path} has no snapshots yet: kvlease snapshot trigger {table_path} --wait", file=sys.stderr)
        return []
    rows: list[dict] = []
    try:
        for _ in range(5):  # a newer snapshot may replace one between "latest" and "acquire": ask again for those
            wanted = {bucket: info.snapshot_id for bucket, info in latest.items()}
            result = kv.admin.acquire_lease(lease_id, wanted, duration_ms, owner=owner)
            if not result.unavailable:
                break
            newest = kv.admin.get_latest_kv_snapshots(table.table_id)
            latest.update({bucket: newest[bucket] for bucket in result.unavailable if bucket in newest})
        else:
            raise SystemExit(f"error: the snapshots of {table_path} kept changing; try again")
        # The lease now holds every snapshot: read them at leisure (within duration_ms, or renew_lease).
        for bucket in sorted(latest, key=lambda b: b.bucket):
            snapshot = kvlease.read_snapshot(kv.admin, latest[bucket].handle, table=table)  # an Arrow table
            rows.extend(snapshot.to_pylist())
            kv.admin.release_lease(lease_id, [bucket], owner=owner)  # done with this bucket: give it back
            print(f"bucket {bucket.bucket}: {snapshot.num_rows} rows of snapshot {latest[bucket].snapshot_id} "
                  f"(as of changelog offset {latest[bucket].log_offset})", file=sys.stderr)
    finally:
        kv.admin.drop_lease(lease_id, owner=owner)  # whatever is left (a failure half-way): free it now
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", help="a cluster directory (default: KVLEASE_CLUSTER)")
    parser.add_argument("--bootstrap", help="coordinator addresses HOST:PORT,… (default: KVLEASE_BOOTSTRAP)")
    parser.add_argument("--table", required=True, help="DB.NAME")
    args = parser.parse_args()
    try:
        # cluster=None and bootstrap=None: connect() reads KVLEASE_CLUSTER / KVLEASE_BOOTSTRAP, as the CLI does
        with kvlease.connect(cluster=args.cluster, bootstrap=args.bootstrap) as kv:
            rows = read_under_lease(kv, args.table)
    except kvlease.KvLeaseError as exc:  # every kvlease error has a one-line message that says what to do
        raise SystemExit(f"error: {exc.message}") from None
    for row in rows:
        print(json.dumps(row, default=str))
    print(f"{len(rows)} rows read under a lease, lease dropped", file=sys.stderr)


if __name__ == "__main__":
    main()
