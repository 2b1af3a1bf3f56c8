"""The project's one exception root and the wire error-code registry.

Error codes are a wire contract: numbers are append-only and never reused
(``tests/common/test_errors.py`` pins every one). gRPC, ZooKeeper and S3 errors are
mapped to these classes at the process boundaries only.

Classes are grouped by what a caller does about them:

- :class:`RetriableError`: try the same request again (after a backoff);
- :class:`NotCoordinatorError` / :class:`NotLeaderError`: refresh where the
  request goes, then retry there;
- :class:`InvalidRequestError`: fix the request, retrying will not help;
- :class:`NotFoundError` / :class:`AlreadyExistsError`: the named thing is
  (not) there;
- :class:`OutcomeUnknownError`: the request may or may not have taken effect;
- :class:`AuthenticationFailedError` / :class:`AuthorizationFailedError`: the
  caller's credentials or rights must change; retrying will not help.

A message that quotes a caller's value (a key, a name, an argument) quotes it
through :func:`show`, which caps it: a 5 MB key never makes a 5 MB message.
A message about a name that is not one of a known few (an option, a mode)
ends with :func:`did_you_mean`'s hint when one of them is close.
"""

from __future__ import annotations

import difflib
import enum
import reprlib
from typing import Iterable


class ErrorCode(enum.IntEnum):
    """Wire error codes. Append only; never renumber, never reuse."""

    NONE = 0
    UNKNOWN = 1
    NETWORK_ERROR = 2
    NOT_COORDINATOR = 3
    INVALID_REQUEST = 4
    TABLE_NOT_EXIST = 5
    TABLE_ALREADY_EXIST = 6
    INVALID_TABLE = 7
    INVALID_LEASE_ID = 8
    INVALID_LEASE_DURATION = 9
    BUCKET_OUT_OF_RANGE = 10
    LEASE_NOT_FOUND = 11
    SNAPSHOT_NOT_FOUND = 12
    STORAGE_ERROR = 13
    COORDINATOR_FENCED = 14
    REQUEST_TIMED_OUT = 15
    NOT_LEADER = 16
    LEADER_NOT_AVAILABLE = 17
    INVALID_SCAN_REQUEST = 18
    TOO_MANY_SCANNERS = 19
    SCANNER_EXPIRED = 20
    UNKNOWN_SCANNER_ID = 21
    INVALID_ROW = 22
    INVALID_SNAPSHOT = 23
    COORDINATOR_NOT_READY = 24
    RECORD_TOO_LARGE = 25
    PARTITION_NOT_EXISTS = 26
    AUTHORIZATION_FAILED = 27
    AUTHENTICATION_FAILED = 28
    USER_ALREADY_EXISTS = 29
    ZOOKEEPER_UNAVAILABLE = 30
    LEASE_OWNED = 31
    OUT_OF_ORDER_SEQUENCE = 32
    NOT_ENOUGH_REPLICAS = 33
    FENCED_LEADER_EPOCH = 34
    DATA_LOST = 35
    PARTITION_ALREADY_EXISTS = 36
    TOO_MANY_PARTITIONS = 37


class KvLeaseError(Exception):
    """Root of every error kvlease raises on purpose."""

    code: ErrorCode = ErrorCode.UNKNOWN

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.code.name)
        self.message = message or self.code.name
        self.details = details

    def __reduce__(self):  # keep details across pickling (Spark, processes)
        return (_rebuild, (type(self), self.message, self.details))


def _rebuild(cls, message, details):
    return cls(message, **details)


class RetriableError(KvLeaseError):
    """The same request may succeed if sent again after a backoff."""


class NetworkError(RetriableError):
    code = ErrorCode.NETWORK_ERROR


class StorageError(RetriableError):
    """A remote-storage or ZooKeeper write failed; nothing was changed."""

    code = ErrorCode.STORAGE_ERROR


class CoordinatorNotReadyError(RetriableError):
    """The active coordinator is still reinitializing."""

    code = ErrorCode.COORDINATOR_NOT_READY


class ZooKeeperUnavailableError(RetriableError):
    """The coordinator asked cannot reach its ZooKeeper: it refused the request before doing anything.

    It serves again once its connection is back (or another coordinator takes over): a client retries,
    on another coordinator of its bootstrap list too.
    """

    code = ErrorCode.ZOOKEEPER_UNAVAILABLE


class LeaderNotAvailableError(RetriableError):
    code = ErrorCode.LEADER_NOT_AVAILABLE


class NotCoordinatorError(RetriableError):
    """Sent to a standby; ``details['active_address']`` names the active one (may be '')."""

    code = ErrorCode.NOT_COORDINATOR

    @property
    def active_address(self) -> str:
        return str(self.details.get("active_address") or "")


class CoordinatorFencedError(KvLeaseError):
    """This coordinator was deposed: its epoch is no longer the current one."""

    code = ErrorCode.COORDINATOR_FENCED


class NotLeaderError(RetriableError):
    code = ErrorCode.NOT_LEADER


class NotEnoughReplicasError(RetriableError):
    """The bucket's in-sync replicas are fewer than its table's ``min.insync-replicas``: the write was
    refused before anything was appended. It succeeds once enough followers caught up again."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS


class FencedLeaderEpochError(RetriableError):
    """The request names a leader epoch older than the bucket's current one (a deposed leader, or a
    caller with stale routing): refused; refresh the bucket's leader and retry.
    ``details['leader_epoch']``: the current epoch, when known."""

    code = ErrorCode.FENCED_LEADER_EPOCH


class InvalidRequestError(KvLeaseError):
    code = ErrorCode.INVALID_REQUEST


class ClusterNotRunningError(InvalidRequestError):
    """A local cluster directory (``kvlease cluster start``) whose processes all stopped: start it again. Raised
    by the client before anything is sent; never on the wire."""


class DataLostError(KvLeaseError):
    """Offsets a reader (a streaming query) already read from were lost: the bucket was restored from an
    older snapshot or took an unclean leader election, and its offsets from there on are reused for
    different changes. Retrying does not help: start the reader again from a new position.
    ``details``: ``table``, ``bucket``, ``from_offset``, ``position``, ``kind``."""

    code = ErrorCode.DATA_LOST


class InvalidTableError(InvalidRequestError):
    code = ErrorCode.INVALID_TABLE


class InvalidLeaseIdError(InvalidRequestError):
    code = ErrorCode.INVALID_LEASE_ID


class InvalidLeaseDurationError(InvalidRequestError):
    code = ErrorCode.INVALID_LEASE_DURATION


class BucketOutOfRangeError(InvalidRequestError):
    code = ErrorCode.BUCKET_OUT_OF_RANGE


class InvalidScanRequestError(InvalidRequestError):
    code = ErrorCode.INVALID_SCAN_REQUEST


class InvalidRowError(InvalidRequestError):
    code = ErrorCode.INVALID_ROW


class RecordTooLargeError(InvalidRequestError):
    """A row (or one write's changelog entry) is over its size limit (``table.max-row-size``)."""

    code = ErrorCode.RECORD_TOO_LARGE


class InvalidSnapshotError(InvalidRequestError):
    code = ErrorCode.INVALID_SNAPSHOT


class TooManyScannersError(RetriableError):
    code = ErrorCode.TOO_MANY_SCANNERS


class NotFoundError(KvLeaseError):
    code = ErrorCode.UNKNOWN


class TableNotExistError(NotFoundError):
    code = ErrorCode.TABLE_NOT_EXIST


class LeaseNotFoundError(NotFoundError):
    code = ErrorCode.LEASE_NOT_FOUND


class LeaseOwnedError(KvLeaseError):
    """The lease belongs to another reader (it carries another owner token): nothing was changed.

    ``details['lease_id']`` names it. A lease id names one reader at a time; pick another id,
    or drop the lease if its reader is gone.
    """

    code = ErrorCode.LEASE_OWNED


class OutOfOrderSequenceError(InvalidRequestError):
    """An idempotent write's batch number is not the next one of its writer (a gap, or a writer the
    bucket does not know): nothing was appended. The writer takes a new id and numbers from 0 again."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE


class SnapshotNotFoundError(NotFoundError):
    code = ErrorCode.SNAPSHOT_NOT_FOUND


class ScannerExpiredError(NotFoundError):
    code = ErrorCode.SCANNER_EXPIRED


class UnknownScannerIdError(NotFoundError):
    code = ErrorCode.UNKNOWN_SCANNER_ID


class PartitionNotExistsError(NotFoundError):
    """A request named a partition that does not exist (never made, or dropped), or named none of a
    partitioned table."""

    code = ErrorCode.PARTITION_NOT_EXISTS


class TooManyPartitionsError(KvLeaseError):
    """A new partition would take a table past its ``table.partition.max``."""

    code = ErrorCode.TOO_MANY_PARTITIONS


class AlreadyExistsError(KvLeaseError):
    code = ErrorCode.UNKNOWN


class TableAlreadyExistError(AlreadyExistsError):
    code = ErrorCode.TABLE_ALREADY_EXIST


class PartitionAlreadyExistsError(AlreadyExistsError):
    code = ErrorCode.PARTITION_ALREADY_EXISTS


class UserAlreadyExistsError(AlreadyExistsError):
    """AddUser of a user that exists with another password (the same password is a resent request: no error)."""

    code = ErrorCode.USER_ALREADY_EXISTS


class OutcomeUnknownError(KvLeaseError):
    """The request may or may not have taken effect (e.g. it timed out)."""

    code = ErrorCode.REQUEST_TIMED_OUT


class AuthorizationFailedError(KvLeaseError):
    """The authenticated principal may not do this operation on this resource; nothing was changed.

    ``details`` carry ``principal``, ``operation`` and ``resource``.
    """

    code = ErrorCode.AUTHORIZATION_FAILED


class AuthenticationFailedError(KvLeaseError):
    """The call carried no credentials, or ones that do not match a user (which of the two is not said)."""

    code = ErrorCode.AUTHENTICATION_FAILED


class UnknownServerError(KvLeaseError):
    code = ErrorCode.UNKNOWN


#: Errors a client retries (with bounded backoff) without asking the user.
RETRIABLE: tuple[type[KvLeaseError], ...] = (RetriableError,)

_BY_CODE: dict[ErrorCode, type[KvLeaseError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, KvLeaseError) and _cls.code != ErrorCode.UNKNOWN:
        _BY_CODE.setdefault(_cls.code, _cls)
_BY_CODE[ErrorCode.UNKNOWN] = UnknownServerError


def error_for(code: int, message: str = "", **details: object) -> KvLeaseError:
    """The exception for a wire error code (an unknown code gives UnknownServerError).

    Raises ValueError for ``NONE`` (0): a successful response carries no error.
    """
    if code == ErrorCode.NONE:
        raise ValueError("error code NONE (0) is not an error")
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except ValueError:
        cls = UnknownServerError
        message = f"[code {code}] {message}"
    return cls(message, **details)


#: Characters of a caller's value an error message quotes (:func:`show`).
SHOW_LIMIT = 200


def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, SHOW_LIMIT, SHOW_LIMIT, SHOW_LIMIT
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 8
    return r


_REPR = _bounded_repr()


def show(value: object, limit: int = SHOW_LIMIT) -> str:
    """``repr(value)`` as an error message quotes a caller's value: a string or bytes longer than ``limit``
    as its start, ``…`` and its length (``'kkkk…' (5,242,880 characters)``); anything else cut after
    ``limit`` characters, containers and numbers without building the whole repr first. Always one line."""
    if isinstance(value, (str, bytes, bytearray)):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}… ({len(value):,} {unit})"
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # too long to print (and to read)
        return f"<an integer of {value.bit_length():,} bits>"
    try:
        text = _REPR.repr(value).replace("\n", "\\n")  # an object's own repr may hold a line break
    except Exception:  # a repr that fails: the type names the value
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "…"


def single_line(text: str) -> str:
    """``text`` on one line: line breaks (from arguments or values quoted in a message) as ``\\n``."""
    return "".join(ch if ch.isprintable() or ch == "\t" else ascii(ch)[1:-1] for ch in text)


#: How alike (``difflib`` ratio) a name must be to a known one for :func:`did_you_mean` to offer it. Stricter than
#: difflib's 0.6: kvlease's names share parts (``startup.``, ``ending.``, ``lease.``), and at 0.6 Kafka's
#: ``startingOffsets`` was offered ``ending.offsets``.
SUGGEST_CUTOFF = 0.75


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``did you mean 'table'?`` naming the one of ``choices`` closest to ``word`` (case-insensitive, as the
    choice is spelled), or ``''`` when none is close enough (:data:`SUGGEST_CUTOFF`)."""
    spelled = {choice.lower(): choice for choice in choices}
    if len(word) > SHOW_LIMIT:  # no name is that long; and difflib's time grows with it
        return ""
    close = difflib.get_close_matches(word.lower(), spelled, n=1, cutoff=SUGGEST_CUTOFF)
    return f"did you mean {show(spelled[close[0]])}?" if close else ""
