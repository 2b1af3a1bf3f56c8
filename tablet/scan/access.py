"""Who may open, continue and close a live scan (:mod:`kvlease.tablet.authz` decides READ on a table).

Opening a scan needs READ on the table. A session belongs to the principal
that opened it: a continuation or close from another principal is
``AUTHORIZATION_FAILED`` and changes nothing (also for the replay of a
finished session's last batch), and every continuation checks READ again, so
an ACL revoked mid-scan stops the scan (the session stays for its owner's
close, or until it expires). Every refusal is counted in the scan metrics.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import Counter

from kvlease.common import errors
from kvlease.tablet.authz import READ, TableAccess
from kvlease.tablet.scan.session import ScanSession


class ScanAccess:
    """The checks :class:`~kvlease.tablet.scan.service.ScanService` makes before it opens or touches a session."""

    def __init__(self, access: TableAccess, refused: Counter,
                 session_of: Callable[[bytes], ScanSession | None]) -> None:
        self.access = access
        self.refused = refused  # the refusals counter, by error code
        self.session_of = session_of  # the open (or kept finished) session of an id

    def check_open(self, physical_id: int) -> None:
        """READ on the table (of the partition ``physical_id`` names), or AuthorizationFailedError (nothing
        opened)."""
        try:
            self.access.check(READ, physical_id)
        except errors.AuthorizationFailedError as exc:
            self.refused.labels(exc.code.name).inc()
            raise

    def check_call(self, sid: bytes, *, read: bool) -> None:
        """Before a continuation (``read``) or close of ``sid``: AuthorizationFailedError unless the caller
        opened the session and (``read``) may still READ its table. Nothing changes either way. An id
        not open here (nor kept finished) is left to the manager's answer (unknown, expired, not leader)."""
        if not self.access.enabled:
            return
        session = self.session_of(sid)
        if session is None:
            return
        try:
            principal = self.access.principal()
            if session.owner != principal:
                resource = self.access.resource(session.bucket.physical_id)
                what = str(resource) if resource is not None else f"table id {session.bucket.table_id}"
                raise errors.AuthorizationFailedError(
                    f"{principal} may not {'continue' if read else 'close'} scanner {sid.hex()} of {what}: "
                    "another principal opened it", principal=principal, operation=READ.value, resource=what)
            if read:
                self.access.check(READ, session.bucket.physical_id)
        except errors.AuthorizationFailedError as exc:
            self.refused.labels(exc.code.name).inc()
            raise
