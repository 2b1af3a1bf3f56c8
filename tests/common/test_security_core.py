"""Pure parts of security: password hashes, the authenticator, the ACL model and the Authorizer."""

from __future__ import annotations

import pytest

from kvlease.common.errors import AuthenticationFailedError, AuthorizationFailedError, InvalidRequestError
from kvlease.common.security import passwords
from kvlease.common.security.acl import AclEntry, Authorizer, Operation, Resource, ResourceType, check_principal
from kvlease.common.security.authn import Authenticator, check_user_name

pytestmark = pytest.mark.unit

CHEAP = {"n": 2 ** 4, "r": 1, "p": 1}  # scrypt parameters that keep the tests fast


# --- passwords -----------------------------------------------------------------------

def test_a_hash_verifies_its_password_only():
    record = passwords.hash_password("s3cret", **CHEAP)
    assert passwords.verify(record, "s3cret")
    assert not passwords.verify(record, "s3cret ")
    assert not passwords.verify(record, "S3cret")
    assert not passwords.verify(record, "")


def test_each_hash_has_its_own_salt_and_keeps_its_parameters():
    a, b = passwords.hash_password("pw", **CHEAP), passwords.hash_password("pw", **CHEAP)
    assert a.salt != b.salt and a.digest != b.digest and len(a.salt) == 16
    assert (a.n, a.r, a.p) == (16, 1, 1)
    default = passwords.hash_password("pw", salt=b"x" * 16)
    assert (default.n, default.r, default.p) == (passwords.DEFAULT_N, passwords.DEFAULT_R, passwords.DEFAULT_P)


def test_the_record_round_trips_through_json_and_still_verifies():
    # the password has a space and a "!", which base64 never produces, so the check
    # cannot be fooled by a random salt or digest that happens to contain it
    password = "plain text!"
    record = passwords.hash_password(password, **CHEAP)
    clone = passwords.PasswordHash.from_json(record.to_json())
    assert clone == record and passwords.verify(clone, password)
    assert password not in str(record.to_json())


def test_an_unknown_algorithm_or_an_empty_password_is_refused():
    with pytest.raises(ValueError, match="algorithm"):
        passwords.PasswordHash.from_json({**passwords.hash_password("pw", **CHEAP).to_json(), "algorithm": "md5"})
    with pytest.raises(ValueError):
        passwords.hash_password("")


# --- authenticator ---------------------------------------------------------------------

def _authenticator():
    users = {"alice": passwords.hash_password("wonderland", **CHEAP)}
    return users, Authenticator(users.get)


def test_the_right_password_gives_the_principal_twice():
    _, authn = _authenticator()
    assert authn.authenticate("alice", "wonderland") == "User:alice"
    assert authn.authenticate("alice", "wonderland") == "User:alice"  # the remembered check


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("bob", "wonderland"), ("alice", None),
                                            (None, "wonderland"), ("", ""), ("alice\n", "wonderland"),
                                            ("../alice", "wonderland")])
def test_wrong_unknown_or_missing_credentials_fail(user, password):
    _, authn = _authenticator()
    with pytest.raises(AuthenticationFailedError):
        authn.authenticate(user, password)


def test_a_remembered_check_does_not_survive_a_password_change_or_removal():
    users, authn = _authenticator()
    assert authn.authenticate("alice", "wonderland") == "User:alice"
    users["alice"] = passwords.hash_password("looking-glass", **CHEAP)
    with pytest.raises(AuthenticationFailedError):
        authn.authenticate("alice", "wonderland")
    assert authn.authenticate("alice", "looking-glass") == "User:alice"
    del users["alice"]
    with pytest.raises(AuthenticationFailedError):
        authn.authenticate("alice", "looking-glass")


@pytest.mark.parametrize("name", ["alice", "_svc", "a.b-c@d", "A" * 128])
def test_valid_user_names(name):
    assert check_user_name(name) == name


@pytest.mark.parametrize("name", ["", "1abc", "alice\n", "a/b", "a b", "A" * 129, "..", "*"])
def test_invalid_user_names(name):
    with pytest.raises(InvalidRequestError):
        check_user_name(name)


# --- ACL model -----------------------------------------------------------------------

def test_resources_parse_and_validate_with_full_matches():
    assert Resource.of("table", "db.t") == Resource(ResourceType.TABLE, "db.t")
    assert Resource.of("DATABASE", "db") == Resource.database("db")
    assert Resource.of("cluster") == Resource.cluster()
    for bad in ("db", "db.t.x", "db.t\n", ".t", "db."):
        with pytest.raises(InvalidRequestError):
            Resource.table(bad)
    with pytest.raises(InvalidRequestError):
        Resource.database("db\n")
    with pytest.raises(ValueError):
        Resource.of("topic", "x")


def test_a_table_is_covered_by_its_database_and_the_cluster():
    assert Resource.table("db.t").covering() == (Resource.table("db.t"), Resource.database("db"), Resource.cluster())
    assert Resource.database("db").covering() == (Resource.database("db"), Resource.cluster())
    assert Resource.cluster().covering() == (Resource.cluster(),)


def test_entries_of_one_principal_sort_and_encode_whatever_their_operations():
    from kvlease.common.security.acl_store import decode, encode
    entries = {AclEntry("User:a", Operation.WRITE), AclEntry("User:a", Operation.READ),
               AclEntry("User:*", Operation.ALL)}
    assert [(e.principal, e.operation) for e in sorted(entries)] == [
        ("User:*", Operation.ALL), ("User:a", Operation.READ), ("User:a", Operation.WRITE)]
    assert decode(encode(entries)) == entries


def test_principals_and_operations_are_validated():
    assert check_principal("User:*") == "User:*"
    for bad in ("alice", "User:", "Group:x", "User:a\n", "user:alice"):
        with pytest.raises(InvalidRequestError):
            check_principal(bad)
    with pytest.raises(InvalidRequestError):
        check_principal("User:*", wildcard=False)
    assert Operation.parse("read") is Operation.READ
    with pytest.raises(InvalidRequestError, match="unknown operation"):
        Operation.parse("EXECUTE")
    assert AclEntry.from_json(AclEntry("User:a", Operation.ALL).to_json()) == AclEntry("User:a", Operation.ALL)


# --- Authorizer --------------------------------------------------------------------------

T, T2, OTHER_DB_T = Resource.table("db.t"), Resource.table("db.t2"), Resource.table("other.t")
DB, CLUSTER = Resource.database("db"), Resource.cluster()


def _authorizer(**acls) -> Authorizer:
    return Authorizer({
        T: {AclEntry("User:reader", Operation.READ)},
        DB: {AclEntry("User:dbwriter", Operation.WRITE), AclEntry("User:dbadmin", Operation.ALL)},
        CLUSTER: {AclEntry("User:creator", Operation.CREATE)},
        OTHER_DB_T: {AclEntry("User:*", Operation.READ)},
    }, super_users=["User:root"])


@pytest.mark.parametrize("principal, operation, resource", [
    ("User:reader", Operation.READ, T),
    ("User:reader", Operation.DESCRIBE, T),          # implied by READ
    ("User:dbwriter", Operation.WRITE, T),           # database grant covers its tables
    ("User:dbwriter", Operation.WRITE, T2),
    ("User:dbwriter", Operation.DESCRIBE, DB),
    ("User:dbadmin", Operation.DROP, T),             # ALL
    ("User:dbadmin", Operation.ALTER, DB),
    ("User:creator", Operation.CREATE, T),           # cluster grant covers everything
    ("User:creator", Operation.CREATE, DB),
    ("User:creator", Operation.DESCRIBE, OTHER_DB_T),
    ("User:anyone", Operation.READ, OTHER_DB_T),     # wildcard principal
    ("User:root", Operation.ALTER, CLUSTER),         # super user
    ("User:root", Operation.WRITE, Resource.table("x.y")),
])
def test_allowed(principal, operation, resource):
    assert _authorizer().check(principal, operation, resource) is None


@pytest.mark.parametrize("principal, operation, resource", [
    ("User:reader", Operation.WRITE, T),             # READ does not give WRITE
    ("User:reader", Operation.READ, T2),             # a table grant covers only that table
    ("User:reader", Operation.DESCRIBE, DB),         # ... and not its database (no upward grant)
    ("User:dbwriter", Operation.READ, T),            # WRITE does not give READ
    ("User:dbwriter", Operation.WRITE, OTHER_DB_T),  # another database
    ("User:dbwriter", Operation.CREATE, DB),
    ("User:dbadmin", Operation.CREATE, CLUSTER),     # ALL on a database is not on the cluster
    ("User:dbadmin", Operation.READ, OTHER_DB_T.__class__.database("other")),
    ("User:anyone", Operation.WRITE, OTHER_DB_T),
    ("User:anyone", Operation.READ, T),
    ("User:Reader", Operation.READ, T),              # principals are case-sensitive
    ("User:root2", Operation.READ, T),
])
def test_denied_with_operation_and_resource_named(principal, operation, resource):
    with pytest.raises(AuthorizationFailedError) as info:
        _authorizer().check(principal, operation, resource)
    error = info.value
    assert error.details == {"principal": principal, "operation": operation.value, "resource": str(resource)}
    assert operation.value in error.message and str(resource) in error.message


def test_nothing_is_allowed_without_acls_and_all_is_not_a_checkable_operation():
    with pytest.raises(AuthorizationFailedError):
        Authorizer().check("User:alice", Operation.DESCRIBE, CLUSTER)
    with pytest.raises(ValueError):
        Authorizer().check("User:alice", Operation.ALL, CLUSTER)


def test_super_users_must_be_concrete_principals():
    with pytest.raises(InvalidRequestError):
        Authorizer(super_users=["User:*"])


def test_a_new_users_password_is_not_sent_in_the_clear_beyond_loopback():
    """Refused before anything is sent (nothing listens at these addresses)."""
    from kvlease.client.admin import AdminClient
    from kvlease.client.bootstrap import is_loopback as _loopback

    assert [_loopback(a) for a in ("127.0.0.1:1", "127.3.4.5:1", "localhost:1", "[::1]:1", "10.0.0.1:1",
                                   "db.example.com:1")] == [True, True, True, True, False, False]
    with AdminClient(["127.0.0.1:1", "10.0.0.1:9123"], retry_total_s=0) as admin:
        with pytest.raises(InvalidRequestError, match="a password is only sent over TLS"):
            admin.add_user("bob", "bob-Secret-42")


def test_a_refused_describe_says_that_any_grant_allows_it():
    """Most commands find their table first: a user without READ was told 'may not DESCRIBE', and an
    operator who granted DESCRIBE met a second refusal."""
    authorizer = Authorizer({}, ())
    table = Resource.table("db.t")
    with pytest.raises(AuthorizationFailedError) as info:
        authorizer.check("User:bob", Operation.DESCRIBE, table)
    assert info.value.message == "User:bob may not DESCRIBE table db.t (any grant on it allows DESCRIBE)"
    with pytest.raises(AuthorizationFailedError) as info:
        authorizer.check("User:bob", Operation.READ, table)
    assert info.value.message == "User:bob may not READ table db.t"
