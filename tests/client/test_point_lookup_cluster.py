"""Packed lookups (client/point_lookup.py: encoded keys in, stored values out) answer exactly what plain lookups
(Arrow IPC both ways) and a full scan answer, against a real coordinator and three real tablet servers on
ZooKeeper over gRPC: random, absent, deleted and repeated keys over several buckets, a table whose schema
changed after the client was opened, rows a row TTL expired, and a replication factor 3 table while its
leader fails (each answer then right or a retriable error, never other rows)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from kvlease.client import point_lookup
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.row_ttl import row_ttl
from kvlease.common.tables import parse_schema
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_replicated_buckets import (bucket_state, crash, server_by_id, three_servers,
                                                              wait_in_sync)

COLUMNS = parse_schema("id BIGINT, name STRING, v STRING, n INT")
KEY = ["id", "name"]


def rows(ids, salt: int = 0) -> pa.RecordBatch:
    ids = np.asarray(ids, np.int64)
    return pa.record_batch({"id": pa.array(ids), "name": pa.array([f"k{i % 7}" * (1 + i % 3) for i in ids.tolist()]),
                            "v": pa.array([f"value {i} {salt}" for i in ids.tolist()]),
                            "n": pa.array([(i * 31 + salt) % 1000 if i % 5 else None for i in ids.tolist()],
                                          pa.int32())})


def key_mix(rng, present: np.ndarray, deleted: np.ndarray, count: int) -> pa.RecordBatch:
    """Keys in random order: present ones, deleted ones, ids never written, a key with another name, repeats."""
    picks = np.concatenate([rng.choice(present, count), rng.choice(deleted, count // 4),
                            rng.integers(10_000, 20_000, count // 4), rng.choice(present, count // 8)])
    rng.shuffle(picks)
    keys = rows(picks).select(KEY)
    names = keys.column("name").to_pylist()
    names[0] = "no such name"  # an id that exists, under a name it does not have
    return pa.record_batch({"id": keys.column("id"), "name": pa.array(names)})


def reference(client: TableClient, keys: pa.RecordBatch) -> list[dict | None]:
    """The row of every key from a full scan of the table (None where none)."""
    by_key = {(r["id"], r["name"]): r for r in client.scan().to_table().to_pylist()}
    return [by_key.get((k["id"], k["name"])) for k in keys.to_pylist()]


def as_dicts(batch: pa.RecordBatch) -> list[dict | None]:
    found = batch.column("id").is_valid().to_pylist()
    return [row if hit else None for row, hit in zip(batch.to_pylist(), found)]


def packed_calls(client: TableClient) -> list[bool]:
    """Records, for every Lookup ``client`` sends from now on, whether it went packed."""
    sent: list[bool] = []
    original = client._call_bucket

    def spy(bucket, method, request, **options):
        if method == "Lookup":
            sent.append(bool(request.key_offsets))
        return original(bucket, method, request, **options)

    client._call_bucket = spy
    return sent


def test_packed_lookups_answer_what_plain_lookups_and_a_scan_answer(make_config, tmp_path):
    rng = np.random.default_rng(44)
    with three_servers(make_config, tmp_path) as c:
        c.admin.create_table("db.points", COLUMNS, KEY, 4)
        wait_until(lambda: all(b.leader_address for b in c.admin.get_table_assignment(
            c.admin.get_table("db.points").table_id)[1].values()), 30, "db.points led")
        with TableClient(c.admin, "db.points") as fast, \
                TableClient(c.admin, "db.points", packed_lookups=False) as plain:
            fast.upsert(rows(np.arange(3000)))
            fast.upsert(rows(np.arange(0, 3000, 3), salt=1))  # updated rows: the newest value answers
            deleted = np.arange(1, 3000, 10)
            fast.delete(rows(deleted).select(KEY))
            present = np.setdiff1d(np.arange(3000), deleted)
            sent, sent_plain = packed_calls(fast), packed_calls(plain)
            for _ in range(3):
                keys = key_mix(rng, present, deleted, 500)
                got = fast.lookup_batch(keys)
                assert got.equals(plain.lookup_batch(keys))
                assert as_dicts(got) == reference(fast, keys)
                assert got.schema == fast.codec.schema
            assert sent and all(sent) and sent_plain and not any(sent_plain)
            assert fast.lookup([(5, "no"), (10_000, "k0")]) == [None, None]
            assert fast.lookup([(2, rows([2]).column("name")[0].as_py())])[0]["v"] == "value 2 0"
            assert fast.lookup_batch([]).num_rows == 0
            with pytest.raises(errors.InvalidRowError):
                fast.lookup([(None, "x")])


def test_a_changed_schema_and_a_row_ttl_answer_as_plain_lookups_do(make_config, tmp_path):
    with three_servers(make_config, tmp_path) as c:
        c.admin.create_table("db.evolving", COLUMNS, KEY, 2)
        now_ms = int(time.time() * 1000)
        c.admin.create_table("db.ttl", parse_schema("id BIGINT, name STRING, ts TIMESTAMP, v STRING"), KEY, 2,
                             row_ttl=row_ttl("1h", "ts"))
        for path in ("db.evolving", "db.ttl"):
            table_id = c.admin.get_table(path).table_id
            wait_until(lambda: all(b.leader_address for b in c.admin.get_table_assignment(table_id)[1].values()),
                       30, f"{path} led")
        with TableClient(c.admin, "db.evolving") as before:
            before.upsert(rows(np.arange(200)))
            keys = rows(np.arange(0, 260, 3)).select(KEY)
            c.admin.alter_table("db.evolving", add_column="extra STRING")
            sent = packed_calls(before)
            with TableClient(c.admin, "db.evolving", packed_lookups=False) as plain_before:
                got = before.lookup_batch(keys)  # answered as the new schema id: asked again plain
                assert got.equals(plain_before.lookup_batch(keys))  # (the leader's schema, as plain answers)
            assert sent[0] is True and False in sent
            sent.clear()
            before.lookup_batch(keys)  # the client's schema id is behind for good: plain at once, asked once
            assert sent and not any(sent) and not before.packed_lookups
        with TableClient(c.admin, "db.evolving") as fast, \
                TableClient(c.admin, "db.evolving", packed_lookups=False) as plain:
            fast.upsert([{"id": 1, "name": rows([1]).column("name")[0].as_py(), "v": "new", "extra": "x"}])
            assert fast.lookup_batch(keys).equals(plain.lookup_batch(keys))
            assert "extra" in fast.lookup_batch(keys).schema.names
        with TableClient(c.admin, "db.ttl") as fast, TableClient(c.admin, "db.ttl", packed_lookups=False) as plain:
            old, new = now_ms - 2 * 3600_000, now_ms
            fast.upsert([{"id": i, "name": "a", "ts": (old if i % 2 else new) * 1000, "v": str(i)} for i in range(40)])
            keys = [(i, "a") for i in range(45)]
            got = fast.lookup(keys)
            assert got == plain.lookup(keys)
            assert [r is not None for r in got] == [i < 40 and i % 2 == 0 for i in range(45)]


def check_single(client, key, want, failures: list) -> None:
    """``client.lookup([key])`` is ``[want]`` or a retriable error; anything else goes to ``failures``."""
    try:
        if client.lookup([key]) != [want]:
            failures.append(AssertionError("a single-key lookup during the failover answered another row"))
    except errors.KvLeaseError as exc:
        if not exc.retriable:
            failures.append(exc)


def test_lookups_during_a_leader_failover_are_right_or_a_retriable_error(make_config, tmp_path):
    rng = np.random.default_rng(7)
    with three_servers(make_config, tmp_path) as c:
        table = c.admin.create_table("db.failover", COLUMNS, KEY, 1, replication_factor=3, min_insync_replicas=2)
        wait_in_sync(c, table.table_id)
        with TableClient(c.admin, "db.failover", retry_total_s=0.2) as fast, \
                TableClient(c.admin, "db.failover", packed_lookups=False) as plain:
            fast.upsert(rows(np.arange(1000)))
            deleted = np.arange(0, 1000, 9)
            fast.delete(rows(deleted).select(KEY))
            present = np.setdiff1d(np.arange(1000), deleted)
            batches = [key_mix(rng, present, deleted, 200) for _ in range(4)]
            expected = [reference(plain, keys) for keys in batches]
            singles = [(k["id"], k["name"]) for k in batches[0].to_pylist()[:40]]
            single_rows = expected[0][:40]
            assert any(row is None for row in single_rows) and any(row is not None for row in single_rows)
            answers, failures, stop = {"right": 0, "retriable": 0}, [], threading.Event()

            def reader() -> None:
                i = 0
                while not stop.is_set():
                    keys = batches[i % len(batches)]
                    try:
                        got = as_dicts(fast.lookup_batch(keys))
                    except errors.KvLeaseError as exc:
                        if not exc.retriable:
                            failures.append(exc)
                        answers["retriable"] += 1
                        continue
                    finally:
                        i += 1
                    if got != expected[(i - 1) % len(batches)]:
                        failures.append(AssertionError("a lookup during the failover answered other rows"))
                    j = i % len(singles)  # a single key too: the lean path (client/lean_lookup.py)
                    check_single(fast, singles[j], single_rows[j], failures)
                    answers["right"] += 1

            thread = threading.Thread(target=reader)
            thread.start()
            try:
                wait_until(lambda: answers["right"] >= 5, 20, "lookups answered before the failover")
                old_leader = bucket_state(c, table.table_id).leader_id
                crash(c, server_by_id(c, old_leader))
                wait_until(lambda: bucket_state(c, table.table_id).leader_id not in (None, -1, old_leader), 30,
                           "a new leader")
                right = answers["right"]
                wait_until(lambda: answers["right"] >= right + 5, 30, "lookups answered by the new leader")
            finally:
                stop.set()
                thread.join(30)
            assert not failures, failures[:3]
            for keys, want in zip(batches, expected):
                assert as_dicts(fast.lookup_batch(keys)) == want
                assert fast.lookup_batch(keys).equals(plain.lookup_batch(keys))
            assert point_lookup.lookup_batch(fast, batches[0], packed=False).equals(fast.lookup_batch(batches[0]))
