"""Schema changes across a ``kill -9`` of the active coordinator (real coordinator processes, a real
ZooKeeper): a client alters a table without pause while the active coordinator is killed; every acknowledged
change is there exactly once, with the schema id it was answered with, and the history has no gap and no
repeat (docs/schemas.md, "Retries and failover")."""

from __future__ import annotations

import threading

import pytest

from kvlease.common import errors, zkpaths
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.support.procs import coordinator_procs  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, pytest.mark.zk, pytest.mark.timeout(180)]

ALTERS = 40


@pytest.fixture
def config(make_config):
    return make_config({"zookeeper.session-timeout": "3s"})


def test_alters_acknowledged_across_a_kill_9_are_each_there_once_with_their_schema_id(config, coordinator_procs,
                                                                                      zk_client):
    procs = coordinator_procs(config)
    procs.spawn(2)
    active, info = procs.wait_active(30)
    admin = procs.client(retry_total_s=40)
    table = admin.create_table("db.t", [Column("id", "BIGINT")], ["id"], 1)
    acked: dict[str, int] = {}  # column -> the schema id its alter answered
    failed: list[str] = []

    def alter_all() -> None:
        for i in range(ALTERS):
            name = f"c{i}"
            try:
                acked[name] = admin.alter_table("db.t", add_column=f"{name} BIGINT").schema_id
            except errors.KvLeaseError as exc:  # allowed, but then it is there once or not at all
                failed.append(f"{name}: {exc}")

    writer = threading.Thread(target=alter_all)
    writer.start()
    wait_until(lambda: len(acked) >= 10, 60, "ten alters acknowledged before the kill")
    active.kill()
    procs.wait_active(30, among=[p for p in procs.procs if p is not active], min_epoch=info.epoch + 1)
    writer.join(120)
    assert not writer.is_alive()
    assert len(acked) > 10 and not failed, failed

    final, history = admin.schema_history("db.t")
    added = [v.change.removeprefix("add column ").removesuffix(" BIGINT") for v in history[1:]]
    assert [v.schema_id for v in history] == list(range(1, len(history) + 1)) == list(range(1, final.schema_id + 1))
    assert len(added) == len(set(added))  # no change made twice
    for name, schema_id in acked.items():
        assert history[schema_id - 1].change == f"add column {name} BIGINT", (name, schema_id)
    assert [c.name for c in final.columns] == ["id", *added]
    assert [c.id for c in final.columns] == list(range(len(final.columns)))
    stored = zk_client.get_children(zkpaths.table_schemas(table.table_id))
    assert sorted(map(int, stored)) == [v.schema_id for v in history]
