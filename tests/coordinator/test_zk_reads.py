"""multiRead (coordinator/zk_reads.py) on a real ZooKeeper: each operation answered on its own, in order,
under the client's chroot, across batches; what a whole request fails with is raised."""

from __future__ import annotations

import pytest
from kazoo.exceptions import ConnectionClosedError, NoNodeError

from kvlease.coordinator.zk_reads import CHILDREN, DATA, Reads, read_many


def test_reads_answer_each_operation_in_order(zk_client):
    zk_client.create("/r/a", b"one", makepath=True)
    zk_client.create("/r/a/x", b"")
    zk_client.create("/r/b", b"")
    zk_client.set("/r/a", b"two")
    answers = read_many(zk_client, [(DATA, "/r/a"), (CHILDREN, "/r"), (DATA, "/r/missing"), (CHILDREN, "/r/b"),
                                    (CHILDREN, "/r/missing"), (DATA, "/r/b")])
    data, stat = answers[0]
    assert (data, stat.version) == (b"two", 1) and stat == zk_client.get("/r/a")[1]
    assert sorted(answers[1]) == ["a", "b"] and answers[3] == []
    assert isinstance(answers[2], NoNodeError) and isinstance(answers[4], NoNodeError)
    assert answers[5][0] == b""
    assert read_many(zk_client, []) == []


def test_many_reads_in_several_batches_keep_their_order(zk_client):
    zk_client.ensure_path("/many")
    for i in range(50):
        zk_client.create(f"/many/{i}", str(i).encode())
    ops = [(DATA, f"/many/{i}") for i in range(50)] + [(CHILDREN, "/many")]
    answers = Reads(zk_client, ops, batch=7).results()
    assert [a[0] for a in answers[:50]] == [str(i).encode() for i in range(50)]
    assert sorted(answers[50], key=int) == [str(i) for i in range(50)]


def test_a_closed_client_raises(zk_client):
    zk_client.stop()
    zk_client.close()
    with pytest.raises(ConnectionClosedError):
        read_many(zk_client, [(DATA, "/")])
