"""A call to a bucket's leader that gives up on it as soon as the coordinator names another leader.

A leader that is paused (a GC pause, SIGSTOP) or cut off keeps the calls sent
to it waiting until their deadline, although the coordinator elects another
within the ZooKeeper session timeout; and once it resumes it answers none of
them (its leader lease lapsed: ``tablet/replication/leader_lease.py``). So a call that
has not been answered after ``check_s`` is watched: every ``check_s`` the
bucket's routing is fetched again (shared by the calls of one router, at most
one fetch at a time), and once it names another leader the call is cancelled
and :class:`~kvlease.common.errors.NotLeaderError` raised, which the caller's retry
carries to the new leader. A call answered within ``check_s`` costs nothing
more: it is a plain blocking call (a watched one is sent again, as a future,
only after that first wait ran out; every call watched is idempotent).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import grpc

from kvlease.common import errors

#: How long a call to a leader waits before the routing is checked, and how often it is checked again.
CHECK_S = 1.0


def call_watching(method: Any, request: Any, timeout_s: float, moved: Callable[[], bool], *,
                  check_s: float = CHECK_S, where: str = "the bucket's leader", long_poll: bool = False) -> Any:
    """``method(request)`` within ``timeout_s``, given up (NotLeaderError) once ``moved()`` says the leader it
    was sent to no longer leads. gRPC errors are raised as they are (the caller maps them). ``long_poll``: the
    server may hold the call until near its deadline (a FetchLog long poll), so it is sent once with the whole
    ``timeout_s`` and watched from the start (a first blocking try of ``check_s`` would end its wait there)."""
    if timeout_s <= check_s:
        return method(request, timeout=timeout_s)
    if long_poll:
        return _watched(method.future(request, timeout=timeout_s), moved, check_s, where, 0.0)
    started = time.monotonic()
    try:
        return method(request, timeout=check_s)
    except grpc.RpcError as exc:  # only the first wait running out goes on (not a server's own deadline error)
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() - started < check_s:
            raise
    if moved():
        raise gone(where, check_s)
    return _watched(method.future(request, timeout=timeout_s - check_s), moved, check_s, where, check_s)


def _watched(future: Any, moved: Callable[[], bool], check_s: float, where: str, waited: float) -> Any:
    """``future``'s result, cancelled (NotLeaderError) once ``moved()`` (asked every ``check_s``) is true."""
    while True:
        try:
            return future.result(timeout=check_s)
        except grpc.FutureTimeoutError:
            waited += check_s
            if moved():
                future.cancel()
                raise gone(where, waited) from None


def gone(where: str, waited: float) -> errors.NotLeaderError:
    return errors.NotLeaderError(f"{where} did not answer within {waited:g}s and the coordinator names another "
                                 f"leader now: the call goes there")
