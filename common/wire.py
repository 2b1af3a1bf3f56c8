"""Error codes on the wire: one place turns exceptions into ``ErrorPb`` and back.

Every response of every service carries an ``ErrorPb`` (code 0 = success);
servers build it with :func:`error_pb`, clients read it with
:func:`error_from_pb` / :func:`raise_for`.
"""

from __future__ import annotations

from common import errors
from common.proto import coordinator_pb2 as pb


def error_pb(exc: errors.KvLeaseError) -> pb.ErrorPb:
    """The wire form of ``exc`` (with the active coordinator's address, if it names one)."""
    return pb.ErrorPb(code=int(exc.code), message=exc.message,
                      active_address=str(exc.details.get("active_address", "") or ""))


def error_from_pb(error: pb.ErrorPb) -> errors.KvLeaseError | None:
    """The typed exception for a response's error; None for success."""
    if not error.code:
        return None
    if error.active_address:
        return errors.error_for(error.code, error.message, active_address=error.active_address)
    return errors.error_for(error.code, error.message)


def raise_for(error: pb.ErrorPb) -> None:
    """Raise the typed exception for a response's error, if any."""
    exc = error_from_pb(error)
    if exc is not None:
        raise exc
