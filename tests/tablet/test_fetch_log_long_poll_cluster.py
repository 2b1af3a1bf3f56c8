"""FetchLog long polls (``max_wait_ms``, tablet/log/waits.py) on real servers: a coordinator and three tablet
servers in this process, real ZooKeeper, RocksDB and gRPC. A long poll answers exactly what a plain FetchLog
answers (every offset of a history of upserts, updates and deletes, out of range, at the end), at once when
there is something to answer, as soon as a write is committed when there is not (at replication factor 1 and
3, where only what the in-sync replicas hold is answered), and after its wait with nothing new."""

from __future__ import annotations

import threading
import time

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from tests.tablet.replication.test_replicated_buckets import SCHEMA, three_servers, wait_in_sync

pytestmark = pytest.mark.zk

WAIT_MS = 5_000  # a long poll that ends long before this was woken


def history(client: TableClient) -> None:
    client.upsert([{"id": i, "v": f"v{i}"} for i in range(20)])
    client.upsert([{"id": i, "v": "updated"} for i in range(0, 20, 3)])
    client.delete([(i,) for i in range(0, 20, 5)])


def fetch_or_error(client: TableClient, offset: int, wait_ms: int):
    try:
        return client.fetch_log(0, offset, max_wait_ms=wait_ms)
    except errors.KvLeaseError as exc:
        return type(exc)


def check_same_answers(client: TableClient) -> None:
    """Every offset of the log, and past its end: the long poll's answer (or error) is the plain one's, at once."""
    end = client.list_offsets([0])[0][1]
    for offset in [*range(0, end), end + 3]:
        t0 = time.monotonic()
        long_poll = fetch_or_error(client, offset, WAIT_MS)
        assert time.monotonic() - t0 < WAIT_MS / 2000, f"offset {offset}: it waited with something to answer"
        assert long_poll == fetch_or_error(client, offset, 0), f"offset {offset}"
    assert fetch_or_error(client, end + 3, 0) is errors.InvalidRequestError  # past the end: out of range


def raw_fetch(client: TableClient, offset: int, wait_ms: int) -> tuple[list[bytes], int]:
    """FetchLog straight to the leader with a deadline past the wait (the table client's first deadline is 1 s)."""
    router = client.physical
    request = pb.FetchLogRequest(table_id=client.table.table_id, bucket=0, from_offset=offset, max_bytes=1 << 20,
                                 max_wait_ms=wait_ms)
    response = router.stub(router.leader(router.routing(), 0)).FetchLog(request, timeout=wait_ms / 1000 + 10)
    assert not response.HasField("error"), response.error
    return list(response.entries), response.log_end_offset


def check_woken_by_a_write(client: TableClient, writer: TableClient) -> None:
    end = client.list_offsets([0])[0][1]
    answer: list = []
    poll = threading.Thread(target=lambda: answer.append((raw_fetch(client, end, WAIT_MS), time.monotonic())))
    poll.start()
    time.sleep(0.3)  # the poll waits at the end
    assert not answer
    writer.upsert([{"id": 100, "v": "new"}])
    written = time.monotonic()
    poll.join(WAIT_MS / 1000 + 15)
    (((entries, log_end), answered),) = answer
    assert answered - written < WAIT_MS / 2000, "the long poll was not woken by the commit"
    assert (entries, log_end) == raw_fetch(client, end, 0)  # committed: as a plain fetch answers it now
    records, plain_end = client.fetch_log(0, end, max_wait_ms=WAIT_MS)
    assert [(r["change_type"], r["row"]) for r in records] == [("+I", {"id": 100, "v": "new"})]
    assert plain_end == log_end

    t0 = time.monotonic()
    assert client.fetch_log(0, log_end, max_wait_ms=300) == ([], log_end)  # nothing new: empty after its wait
    assert time.monotonic() - t0 >= 0.25
    t0 = time.monotonic()
    assert raw_fetch(client, log_end, 1_500) == ([], log_end)
    assert time.monotonic() - t0 >= 1.4
    t0 = time.monotonic()  # the table client's call too waits past its first second (client/leader_watch.py)
    assert client.fetch_log(0, log_end, max_wait_ms=1_500) == ([], log_end)
    assert time.monotonic() - t0 >= 1.4


def test_a_long_poll_answers_what_a_plain_fetch_does_as_soon_as_it_is_committed(make_config, tmp_path):
    with three_servers(make_config, tmp_path) as c:
        c.admin.create_table("db.rf1", SCHEMA, ["id"], 1)
        rf3 = c.admin.create_table("db.rf3", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
        wait_in_sync(c, rf3.table_id)
        for name in ("db.rf1", "db.rf3"):
            with TableClient(c.admin, name) as client, TableClient(c.admin, name) as writer:
                history(writer)
                check_same_answers(client)
                check_woken_by_a_write(client, writer)
                request = pb.FetchLogRequest(table_id=client.table.table_id, bucket=0, from_offset=0, max_bytes=1 << 20,
                                             max_wait_ms=-1)
                with pytest.raises(errors.InvalidRequestError, match="max_wait_ms must be >= 0, got -1"):
                    client._call_bucket(0, "FetchLog", request, idempotent=True)
                with pytest.raises(errors.InvalidRequestError, match="max_wait_ms must be >= 0, got -5"):
                    client.fetch_log(0, 0, max_wait_ms=-5)
