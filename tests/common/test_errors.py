"""The error-code registry is a wire contract: every number is pinned here."""

from __future__ import annotations

import pickle

import pytest

from kvlease.common import errors
from kvlease.common.errors import ErrorCode, KvLeaseError, error_for

pytestmark = pytest.mark.unit

#: Append-only. Never change a number, never remove or reuse a name: clients in
#: the field decode these. A new code gets the next number and a line here.
PINNED = {
    "NONE": 0,
    "UNKNOWN": 1,
    "NETWORK_ERROR": 2,
    "NOT_COORDINATOR": 3,
    "INVALID_REQUEST": 4,
    "TABLE_NOT_EXIST": 5,
    "TABLE_ALREADY_EXIST": 6,
    "INVALID_TABLE": 7,
    "INVALID_LEASE_ID": 8,
    "INVALID_LEASE_DURATION": 9,
    "BUCKET_OUT_OF_RANGE": 10,
    "LEASE_NOT_FOUND": 11,
    "SNAPSHOT_NOT_FOUND": 12,
    "STORAGE_ERROR": 13,
    "COORDINATOR_FENCED": 14,
    "REQUEST_TIMED_OUT": 15,
    "NOT_LEADER": 16,
    "LEADER_NOT_AVAILABLE": 17,
    "INVALID_SCAN_REQUEST": 18,
    "TOO_MANY_SCANNERS": 19,
    "SCANNER_EXPIRED": 20,
    "UNKNOWN_SCANNER_ID": 21,
    "INVALID_ROW": 22,
    "INVALID_SNAPSHOT": 23,
    "COORDINATOR_NOT_READY": 24,
    "RECORD_TOO_LARGE": 25,
    "PARTITION_NOT_EXISTS": 26,
    "AUTHORIZATION_FAILED": 27,
    "AUTHENTICATION_FAILED": 28,
    "USER_ALREADY_EXISTS": 29,
    "ZOOKEEPER_UNAVAILABLE": 30,
    "LEASE_OWNED": 31,
    "OUT_OF_ORDER_SEQUENCE": 32,
    "NOT_ENOUGH_REPLICAS": 33,
    "FENCED_LEADER_EPOCH": 34,
    "DATA_LOST": 35,
    "PARTITION_ALREADY_EXISTS": 36,
    "TOO_MANY_PARTITIONS": 37,
}

#: The exception class each code decodes to.
CLASSES = {
    ErrorCode.UNKNOWN: errors.UnknownServerError,
    ErrorCode.NETWORK_ERROR: errors.NetworkError,
    ErrorCode.NOT_COORDINATOR: errors.NotCoordinatorError,
    ErrorCode.INVALID_REQUEST: errors.InvalidRequestError,
    ErrorCode.TABLE_NOT_EXIST: errors.TableNotExistError,
    ErrorCode.TABLE_ALREADY_EXIST: errors.TableAlreadyExistError,
    ErrorCode.INVALID_TABLE: errors.InvalidTableError,
    ErrorCode.INVALID_LEASE_ID: errors.InvalidLeaseIdError,
    ErrorCode.INVALID_LEASE_DURATION: errors.InvalidLeaseDurationError,
    ErrorCode.BUCKET_OUT_OF_RANGE: errors.BucketOutOfRangeError,
    ErrorCode.LEASE_NOT_FOUND: errors.LeaseNotFoundError,
    ErrorCode.SNAPSHOT_NOT_FOUND: errors.SnapshotNotFoundError,
    ErrorCode.STORAGE_ERROR: errors.StorageError,
    ErrorCode.COORDINATOR_FENCED: errors.CoordinatorFencedError,
    ErrorCode.REQUEST_TIMED_OUT: errors.OutcomeUnknownError,
    ErrorCode.NOT_LEADER: errors.NotLeaderError,
    ErrorCode.LEADER_NOT_AVAILABLE: errors.LeaderNotAvailableError,
    ErrorCode.INVALID_SCAN_REQUEST: errors.InvalidScanRequestError,
    ErrorCode.TOO_MANY_SCANNERS: errors.TooManyScannersError,
    ErrorCode.SCANNER_EXPIRED: errors.ScannerExpiredError,
    ErrorCode.UNKNOWN_SCANNER_ID: errors.UnknownScannerIdError,
    ErrorCode.INVALID_ROW: errors.InvalidRowError,
    ErrorCode.INVALID_SNAPSHOT: errors.InvalidSnapshotError,
    ErrorCode.COORDINATOR_NOT_READY: errors.CoordinatorNotReadyError,
    ErrorCode.RECORD_TOO_LARGE: errors.RecordTooLargeError,
    ErrorCode.PARTITION_NOT_EXISTS: errors.PartitionNotExistsError,
    ErrorCode.AUTHORIZATION_FAILED: errors.AuthorizationFailedError,
    ErrorCode.AUTHENTICATION_FAILED: errors.AuthenticationFailedError,
    ErrorCode.USER_ALREADY_EXISTS: errors.UserAlreadyExistsError,
    ErrorCode.ZOOKEEPER_UNAVAILABLE: errors.ZooKeeperUnavailableError,
    ErrorCode.LEASE_OWNED: errors.LeaseOwnedError,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: errors.OutOfOrderSequenceError,
    ErrorCode.NOT_ENOUGH_REPLICAS: errors.NotEnoughReplicasError,
    ErrorCode.FENCED_LEADER_EPOCH: errors.FencedLeaderEpochError,
    ErrorCode.DATA_LOST: errors.DataLostError,
    ErrorCode.PARTITION_ALREADY_EXISTS: errors.PartitionAlreadyExistsError,
    ErrorCode.TOO_MANY_PARTITIONS: errors.TooManyPartitionsError,
}


@pytest.mark.parametrize("name, number", sorted(PINNED.items(), key=lambda item: item[1]))
def test_pinned_code_keeps_its_name_and_number(name, number):
    assert name in ErrorCode.__members__, f"error code {name} was removed: codes are append-only"
    assert ErrorCode[name] == number, f"error code {name} was renumbered: codes are append-only"


def test_every_code_is_pinned_and_no_number_is_shared():
    new = {code.name: int(code) for code in ErrorCode if code.name not in PINNED}
    assert not new, f"pin the new error codes in tests/common/test_errors.py::PINNED: {new}"
    assert len(ErrorCode.__members__) == len(list(ErrorCode)), "two names share one number (an enum alias)"


def test_every_error_code_has_a_class():
    assert set(CLASSES) == set(ErrorCode) - {ErrorCode.NONE}


@pytest.mark.parametrize("code", sorted(CLASSES), ids=lambda code: code.name)
def test_error_for_maps_each_code_to_its_class(code):
    error = error_for(int(code), "boom", bucket=3)
    assert type(error) is CLASSES[code]
    assert error.code == code
    assert error.message == "boom" and str(error) == "boom"
    assert error.details == {"bucket": 3}


def test_error_for_an_unknown_number_is_an_unknown_server_error():
    error = error_for(9999, "from the future")
    assert type(error) is errors.UnknownServerError
    assert "[code 9999]" in error.message and "from the future" in error.message


def test_error_for_none_is_not_an_error():
    with pytest.raises(ValueError):
        error_for(0)


def test_no_two_classes_claim_one_code():
    owners: dict[ErrorCode, list[str]] = {}
    for obj in vars(errors).values():
        if isinstance(obj, type) and issubclass(obj, KvLeaseError) and obj.code != ErrorCode.UNKNOWN:
            if obj.__dict__.get("code") is not None:  # declared here, not inherited
                owners.setdefault(obj.code, []).append(obj.__name__)
    assert {code: names for code, names in owners.items() if len(names) > 1} == {}


def test_the_message_defaults_to_the_code_name():
    assert errors.LeaseNotFoundError().message == "LEASE_NOT_FOUND"


@pytest.mark.parametrize("cls", sorted({*CLASSES.values(), errors.NotFoundError, errors.AlreadyExistsError,
                                        errors.RetriableError, KvLeaseError}, key=lambda c: c.__name__))
def test_pickle_round_trip_keeps_type_message_and_details(cls):
    error = cls("lease L expired", lease_id="L", buckets=[1, 2], nested={"a": (1, "x")})
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is cls
    assert clone.message == "lease L expired" and str(clone) == str(error)
    assert clone.details == error.details
    assert clone.code == error.code


def test_not_coordinator_keeps_the_active_address_across_pickling():
    error = errors.NotCoordinatorError("standby", active_address="127.0.0.1:9123")
    assert pickle.loads(pickle.dumps(error)).active_address == "127.0.0.1:9123"
    assert errors.NotCoordinatorError("standby").active_address == ""


def test_what_callers_retry():
    assert errors.RETRIABLE == (errors.RetriableError,)
    retriable = {errors.NetworkError, errors.StorageError, errors.NotCoordinatorError, errors.NotLeaderError,
                 errors.LeaderNotAvailableError, errors.CoordinatorNotReadyError, errors.TooManyScannersError,
                 errors.ZooKeeperUnavailableError, errors.NotEnoughReplicasError, errors.FencedLeaderEpochError}
    for cls in set(CLASSES.values()) | {errors.UnknownServerError}:
        assert issubclass(cls, errors.RETRIABLE) == (cls in retriable), cls.__name__
    for cls in (errors.InvalidTableError, errors.InvalidScanRequestError, errors.InvalidRowError):
        assert issubclass(cls, errors.InvalidRequestError)
    for cls in (errors.TableNotExistError, errors.LeaseNotFoundError, errors.SnapshotNotFoundError,
                errors.ScannerExpiredError, errors.UnknownScannerIdError):
        assert issubclass(cls, errors.NotFoundError)
    assert not issubclass(errors.CoordinatorFencedError, errors.RETRIABLE)
    assert not issubclass(errors.OutcomeUnknownError, errors.RETRIABLE)
