"""Replay a table's change feed (its changelog) into another table, bucket by bucket, in order.

    python examples/change_feed_replay.py --cluster DIR --source shop.orders --target shop.orders_copy
    python examples/change_feed_replay.py ... --state replay.json   # run again: only the new changes

The target is created like the source if it does not exist. Each source bucket's changelog is read from
its first kept offset (or from where ``--state`` says the last run stopped) to its end as the run starts:
``+I`` and ``+U`` records are upserted into the target, ``-D`` records deleted, ``-U`` (an update's
before-image) skipped. A key's changes all live in one source bucket, so applying each bucket in order
gives every key its final state. Prints a JSON summary.

Every fetch is fenced by the leader epoch of the last change read (``TableClient.fetch_log_from``; the
state file keeps it with each bucket's next offset): if the source lost data (a bucket restored from an
older snapshot, or an unclean election) and reuses offsets a run already applied for other changes, the
replay stops with one line saying which offsets instead of applying those changes as if they came next.

If the changelog no longer starts at offset 0 (older entries were removed), a replay into an empty table
misses the rows written before: copy the table first (``TableClient.scan()``; its ``log_offsets`` say
where each bucket's changelog continues) and replay from there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import kvlease  # import kvlease first: it sets gRPC up before anything else imports grpc


def replay(source: kvlease.TableClient, target: kvlease.TableClient, start: dict[int, kvlease.LogPosition]) -> dict:
    """Apply ``source``'s changes from ``start`` ({bucket: position}; missing: the first kept) to its end.
    kvlease.errors.DataLostError if the source reuses offsets already applied (see the module docstring)."""
    ends = source.list_offsets()  # {bucket: (first kept offset, next offset to be written)}
    counts = {"records": 0, "upserts": 0, "deletes": 0}  # records applied
    positions = {}
    for bucket, (earliest, end) in ends.items():
        position = start.get(bucket)
        if position is None or position.offset < earliest:  # nothing read below the log's start: no epoch
            position = kvlease.LogPosition(earliest)
        while position.offset < end:
            # at most ~1 MB of records per call; refused if what was read below position.offset was lost
            records, _, position = source.fetch_log_from(bucket, position)
            if not records:
                break
            apply(target, records, counts)
        positions[bucket] = position
    return {**counts, "next_offsets": {b: p.offset for b, p in positions.items()},
            "epochs": {b: p.epoch for b, p in positions.items()}}


def load_state(text: str) -> dict[int, kvlease.LogPosition]:
    """A state file's positions (a file without ``epochs``, from before them: the first fetch unfenced)."""
    state = json.loads(text)
    epochs = state.get("epochs", {})
    return {int(b): kvlease.LogPosition(o, epochs.get(b)) for b, o in state.get("next_offsets", {}).items()}


#: What each change does to the target; "-U" (an update's old row) is skipped: its "+U" follows.
KIND = {"+I": "upserts", "+U": "upserts", "-D": "deletes"}


def apply(target: kvlease.TableClient, records: list[dict], counts: dict) -> None:
    """Upsert or delete the records' rows, in order; a run of records of one kind goes in one call."""
    runs: list[tuple[str, list[dict]]] = []
    for record in records:
        kind = KIND.get(record["change_type"])
        if kind is None:
            continue
        if not runs or runs[-1][0] != kind:
            runs.append((kind, []))
        runs[-1][1].append(record["row"])
    key = target.table.primary_key
    for kind, rows in runs:
        if kind == "upserts":
            target.upsert(rows)
        else:  # a delete's row is the old row (or its key alone): delete by key
            target.delete([{column: row[column] for column in key} for row in rows])
        counts[kind] += len(rows)
        counts["records"] += len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", help="a cluster directory (default: KVLEASE_CLUSTER)")
    parser.add_argument("--bootstrap", help="coordinator addresses HOST:PORT,… (default: KVLEASE_BOOTSTRAP)")
    parser.add_argument("--source", required=True, help="DB.NAME to read the changes of")
    parser.add_argument("--target", required=True, help="DB.NAME to apply them to (created if missing)")
    parser.add_argument("--state", type=Path, help="a JSON file: where to start, and where this run stopped")
    args = parser.parse_args()
    start = load_state(args.state.read_text()) if args.state and args.state.exists() else {}
    try:
        with kvlease.connect(cluster=args.cluster, bootstrap=args.bootstrap) as kv:
            info = kv.admin.get_table(args.source)
            kv.admin.create_table(args.target, info.columns, info.primary_key, info.buckets, ignore_if_exists=True)
            summary = replay(kv.table(args.source), kv.table(args.target), start)
    except kvlease.KvLeaseError as exc:  # every kvlease error has a one-line message that says what to do
        raise SystemExit(f"error: {exc.message}") from None
    if args.state:
        args.state.write_text(json.dumps({"next_offsets": summary["next_offsets"], "epochs": summary["epochs"]}))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
