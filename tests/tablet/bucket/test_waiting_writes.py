"""A leader's write that waits inside the store (for an earlier write of the same keys, the lock released)
is checked again before it is appended: not at all if a push deposed the leader meanwhile, and only once if
a resend of its idempotent batch was appended meanwhile. Real RocksDB and changelog in a temp dir, the
earlier write held in its fsync so that the later ones wait."""

from __future__ import annotations

import threading

import pytest

from kvlease.common.errors import NotLeaderError
from kvlease.ops.wait import wait_until
from kvlease.tablet.log.changelog import Changelog
from kvlease.tablet.log.epochs import EpochCache
from tests.tablet.bucket.test_bucket import bucket_dir, rows  # noqa: F401
from tests.tablet.bucket.test_bucket_replicated import open_store

pytestmark = pytest.mark.unit


def hold_sync_of(thread_name: str, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The fsync of writes made by the thread ``thread_name`` waits for ``release`` (``syncing`` is set once
    one waits): that write stays in flight, written but not published. ``(syncing, release)``."""
    syncing, release = threading.Event(), threading.Event()
    real_sync = Changelog.sync

    def held_sync(changelog, pending):
        if threading.current_thread().name == thread_name:
            syncing.set()
            release.wait(10)
        return real_sync(changelog, pending)

    monkeypatch.setattr(Changelog, "sync", held_sync)
    return syncing, release


def recording_write(store, outcomes: dict):
    """``write(name, row, writer=None)``: ``store.write`` of one row, its answer or error kept in ``outcomes[name]``."""
    def write(name: str, row: tuple, writer=None) -> None:
        try:
            outcomes[name] = store.write(rows(row), writer=writer)
        except Exception as exc:  # noqa: BLE001 - the outcome is the test's
            outcomes[name] = exc
    return write


@pytest.mark.parametrize("after", ["follower", "leader again"])
def test_a_write_that_waited_through_a_push_is_not_appended(bucket_dir, monkeypatch, after):
    """Seen in the rolling-restart drill: the deposed leader appended the waiting write stamped with its
    SUCCESSOR's epoch; restarted, its log then ended in that epoch, so its new leader found no divergence,
    took it into the ISR with entries the others never had, and once it led again acknowledged writes were
    missing from its log. Deposed, then leading again under a newer epoch, is refused the same way: the
    write was let in under the old leadership."""
    with open_store(bucket_dir) as store:
        store.become_leader(1)
        assert store.write(rows((1, "a", 0.0))) == (0, 1)
        syncing, release = hold_sync_of("first", monkeypatch)
        outcomes: dict[str, object] = {}
        write = recording_write(store, outcomes)

        threads = {name: threading.Thread(target=write, args=(name, (2, name, 0.0)), name=name)
                   for name in ("first", "second")}  # the same key: the second waits for the first
        try:
            threads["first"].start()
            assert syncing.wait(10), "the first write did not reach its fsync"
            threads["second"].start()
            settled = store.writes._settled
            wait_until(lambda: len(settled._waiters) == 1, 10, "the second write to wait for the first")
            # The push: become_follower (and become_leader) first wait for the write in flight, so which of them
            # and the waiting write takes the lock first once it is published is the scheduler's choice. The
            # role is set here as the push sets it, to take the order that lost the write: the push first.
            with store.write_lock:
                role = store.role
                role.following, role.leader_epoch = (True, 2) if after == "follower" else (False, 3)
        finally:
            release.set()
            for thread in threads.values():
                thread.join(10)
        assert outcomes["first"] == (1, 2)
        assert isinstance(outcomes["second"], NotLeaderError), outcomes["second"]
        assert store.log_end_offset == 2
        assert store.epochs == EpochCache([(1, 0)])  # no entry under an epoch the write was not let in by


def test_a_batch_resent_while_the_first_send_waits_inside_the_store_is_appended_once(bucket_dir, monkeypatch):
    """Both sends of one idempotent batch pass the duplicate check, then wait for an earlier write of the same
    keys (the lock released): the one that goes second must find the batch appended by the first and answer its
    offsets, not append it again."""
    with open_store(bucket_dir) as store:
        store.become_leader(1)
        syncing, release = hold_sync_of("earlier", monkeypatch)
        outcomes: dict[str, object] = {}
        write = recording_write(store, outcomes)
        earlier = threading.Thread(target=write, args=("earlier", (1, "earlier", 0.0)), name="earlier")
        sends = [threading.Thread(target=write, args=(name, (1, "sent", 0.0), (7, 0)), name=name)
                 for name in ("send", "resend")]
        try:
            earlier.start()
            assert syncing.wait(10), "the earlier write did not reach its fsync"
            settled = store.writes._settled
            for n, thread in enumerate(sends, 1):
                thread.start()
                wait_until(lambda n=n: len(settled._waiters) == n, 10, "the send to wait for the earlier write")
        finally:
            release.set()
            for thread in (earlier, *sends):
                thread.join(10)
        assert outcomes["earlier"] == (0, 1)
        assert outcomes["send"] == outcomes["resend"] == (1, 3), outcomes  # one entry (-U, +U), both answered with it
        assert store.log_end_offset == 3
