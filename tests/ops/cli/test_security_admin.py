"""Users and ACLs administered over gRPC (the coordinator's SecurityService) and the `kvlease user|acl` commands,
on a real SecureCluster (TLS, the cluster principal, the super user admin).

A denied change is AUTHORIZATION_FAILED naming the operation and resource and leaves ZooKeeper as it was;
resent calls have the same outcome; bad input is INVALID_REQUEST (the CLI: one `error:` line, exit 2); no
password shows up in the CLI's output or the servers' logs.
"""

from __future__ import annotations

import json
import logging

import pytest

from kvlease.client.transport import Channels
from kvlease.common import errors
from kvlease.common.proto import security_pb2 as pb
from kvlease.common.proto import security_pb2_grpc as pb_grpc
from kvlease.common.security.acl import AclBinding, AclEntry, Operation, Resource
from kvlease.common.tls import TlsFiles
from kvlease.coordinator.security_service import SecurityService
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.support.local_cluster import LocalCluster
from tests.support.secure_cluster import ACL_WAIT_S, ADMIN, ADMIN_PASSWORD, NOT_YET_GRANTED, SecureCluster

pytestmark = pytest.mark.timeout(120)

BOB_PASSWORD = "bob-Secret-42"
T = Resource.table("db.t")
DB = Resource.database("db")


@pytest.fixture
def secure(make_config, tmp_path):
    with SecureCluster(make_config, tmp_path, tablets=0) as cluster:
        cluster.add_user("bob", BOB_PASSWORD)
        yield cluster


def assert_denied(call, operation: str, resource: str) -> None:
    with pytest.raises(errors.AuthorizationFailedError) as denied:
        call()
    assert f"may not {operation} {resource}" in denied.value.message, denied.value.message


# -- over gRPC -------------------------------------------------------------------------------------


def test_users_need_alter_on_the_cluster(secure):
    bob = secure.admin_as("bob", BOB_PASSWORD)
    assert_denied(lambda: bob.add_user("carol", "pw"), "ALTER", "cluster")
    assert_denied(lambda: bob.remove_user(ADMIN), "ALTER", "cluster")
    assert_denied(bob.list_users, "ALTER", "cluster")
    assert secure.users.list() == [ADMIN, "bob"]  # nothing changed

    assert secure.admin.add_acl(Resource.cluster(), "User:bob", Operation.ALTER) is True
    assert wait_until(lambda: bob.add_user("carol", "carol-pw"), ACL_WAIT_S, "bob adds carol",
                      retry_on=NOT_YET_GRANTED) is True
    assert bob.list_users() == [ADMIN, "bob", "carol"]
    carol = secure.admin_as("carol", "carol-pw")
    assert carol.list_acls() == []  # carol may authenticate; she sees no entries
    assert bob.remove_user("carol") is True
    assert secure.users.list() == [ADMIN, "bob"]


def test_only_a_super_user_may_add_or_remove_a_super_user(secure):
    """ALTER on the cluster let a QA walkthrough's user remove the super user admin, add it again with a
    password of its own and log in as it (the operator locked out, the user a super user)."""
    assert secure.admin.add_acl(Resource.cluster(), "User:bob", Operation.ALTER) is True
    bob = secure.admin_as("bob", BOB_PASSWORD)
    wait_until(bob.list_users, ACL_WAIT_S, "bob lists the users", retry_on=NOT_YET_GRANTED)
    with pytest.raises(errors.AuthorizationFailedError, match=f"User:bob may not add or remove user '{ADMIN}': it "
                                                              f"is a super user"):
        bob.remove_user(ADMIN)
    with pytest.raises(errors.AuthorizationFailedError, match="it is a super user"):
        bob.add_user(ADMIN, ADMIN_PASSWORD)  # also when it exists: the answer must not depend on the password
    assert secure.users.list() == [ADMIN, "bob"]
    assert secure.admin.list_users() == [ADMIN, "bob"]  # the super user itself still may, and still logs in


def test_acl_changes_need_alter_on_their_resource(secure):
    bob = secure.admin_as("bob", BOB_PASSWORD)
    assert_denied(lambda: bob.add_acl(T, "User:bob", "READ"), "ALTER", "table db.t")
    assert secure.acls.list() == {}  # nothing changed

    secure.admin.add_acl(DB, "User:bob", Operation.ALTER)  # administers db and its tables
    assert wait_until(lambda: bob.add_acl(T, "User:carol", "READ"), ACL_WAIT_S, "bob grants carol READ on db.t",
                      retry_on=NOT_YET_GRANTED) is True
    assert bob.add_acl(DB, "User:*", "DESCRIBE") is True
    assert_denied(lambda: bob.add_acl(Resource.table("other.t"), "User:bob", "READ"), "ALTER", "table other.t")
    assert_denied(lambda: bob.add_acl(Resource.cluster(), "User:bob", "ALL"), "ALTER", "cluster")
    assert_denied(lambda: bob.remove_acl(Resource.cluster(), "User:ops", "ALL"), "ALTER", "cluster")
    secure.admin.add_acl(Resource.table("other.t"), "User:dave", Operation.WRITE)
    assert secure.acls.list() == {
        T: {AclEntry("User:carol", Operation.READ)},
        DB: {AclEntry("User:bob", Operation.ALTER), AclEntry("User:*", Operation.DESCRIBE)},
        Resource.table("other.t"): {AclEntry("User:dave", Operation.WRITE)},
    }

    # what each sees: the admin everything; bob what he administers; carol her own and User:* entries
    everything = secure.admin.list_acls()
    assert len(everything) == 4 and everything == sorted(everything)
    assert bob.list_acls() == [AclBinding(DB, "User:*", Operation.DESCRIBE), AclBinding(DB, "User:bob", Operation.ALTER),
                               AclBinding(T, "User:carol", Operation.READ)]
    secure.add_user("carol", "carol-pw")
    carol = secure.admin_as("carol", "carol-pw")
    assert wait_until(carol.list_acls, ACL_WAIT_S, "carol lists her entries", retry_on=NOT_YET_GRANTED) == [
        AclBinding(DB, "User:*", Operation.DESCRIBE), AclBinding(T, "User:carol", Operation.READ)]
    assert carol.list_acls(T) == [AclBinding(T, "User:carol", Operation.READ)]
    assert_denied(lambda: carol.list_acls(Resource.table("other.t")), "DESCRIBE", "table other.t")
    assert bob.remove_acl(T, "User:carol", "READ") is True
    assert T not in secure.acls.list()


def test_resent_calls_have_the_same_outcome(secure):
    admin = secure.admin
    assert admin.add_user("erin", "erin-pw") is True
    assert admin.add_user("erin", "erin-pw") is False  # the answer to the first was lost: no error
    with pytest.raises(errors.UserAlreadyExistsError) as exists:
        admin.add_user("erin", "another-pw")
    assert "another-pw" not in exists.value.message and "erin" in exists.value.message
    assert secure.admin_as("erin", "erin-pw").list_acls() == []  # the first password still counts
    assert admin.remove_user("erin") is True
    assert admin.remove_user("erin") is False
    assert admin.add_acl(T, "User:bob", "READ") is True
    assert admin.add_acl(T, "User:bob", Operation.READ) is False
    assert admin.add_acl(T, "User:bob", "WRITE") is True  # a second operation of one principal
    assert admin.remove_acl(T, "User:bob", "READ") is True
    assert admin.remove_acl(T, "User:bob", "READ") is False
    assert secure.acls.get(T) == {AclEntry("User:bob", Operation.WRITE)}


def test_a_password_that_is_not_printable_ascii_logs_in_and_one_with_control_characters_is_refused(secure):
    """gRPC metadata values are printable ASCII: a QA walkthrough added a user with 'Pässwörd-Geheim-1' that
    then could never log in (gRPC refused the header)."""
    assert secure.admin.add_user("uni", "Pässwörd-Geheim-1") is True
    assert secure.admin_as("uni", "Pässwörd-Geheim-1").list_acls() == []
    with pytest.raises(errors.AuthenticationFailedError):
        secure.admin_as("uni", "Passworte-Geheim-1").list_acls()
    for bad in ("Line1-Secret\nLine2-Secret", "tab\tin-Secret", "del\x7f-Secret"):
        with pytest.raises(errors.InvalidRequestError, match="must not contain control characters"):
            secure.admin.add_user("zed", bad)
    assert secure.users.list() == [ADMIN, "bob", "uni"]


def test_invalid_requests_are_refused(secure):
    channels = Channels(tls=TlsFiles.from_config(secure.client_config()), credentials=(ADMIN, ADMIN_PASSWORD))
    try:
        stub = channels.stub(secure.cluster.coordinator.address, pb_grpc.SecurityServiceStub)
        entry = dict(resource_type="table", resource_name="db.t", principal="User:bob", operation="READ")
        answers = [
            stub.AddUser(pb.AddUserRequest(name="no spaces", password="x")),
            stub.AddUser(pb.AddUserRequest(name="nopassword", password="")),
            stub.AddUser(pb.AddUserRequest(name="kvlease", password="x")),  # the cluster's own principal
            stub.RemoveUser(pb.RemoveUserRequest(name="")),
            stub.AddAcl(pb.AddAclRequest(entry=pb.AclEntryPb(**{**entry, "principal": "bob"}))),
            stub.AddAcl(pb.AddAclRequest(entry=pb.AclEntryPb(**{**entry, "operation": "FLY"}))),
            stub.AddAcl(pb.AddAclRequest(entry=pb.AclEntryPb(**{**entry, "resource_type": "galaxy"}))),
            stub.RemoveAcl(pb.RemoveAclRequest(entry=pb.AclEntryPb(**{**entry, "resource_name": "nodot"}))),
            stub.ListAcls(pb.ListAclsRequest(resource_type="database", resource_name="bad-name")),
        ]
        for answer in answers:
            assert answer.error.code == errors.ErrorCode.INVALID_REQUEST, answer
    finally:
        channels.close()
    assert secure.users.list() == [ADMIN, "bob"] and secure.acls.list() == {}


def test_without_security_everyone_may_and_a_standby_points_to_the_active(make_config, tmp_path):
    cluster = LocalCluster(make_config, tmp_path, 0)
    try:
        admin = cluster.admin
        assert admin.add_user("bob", "pw") is True
        assert admin.list_users() == ["bob"]
        assert admin.add_acl(T, "User:bob", "READ") is True
        assert admin.list_acls() == [AclBinding(T, "User:bob", Operation.READ)]
    finally:
        cluster.close()

    class Standby:
        def serving_loop(self):
            raise errors.NotCoordinatorError("a standby", active_address="127.0.0.1:4242")

    answer = SecurityService(Standby()).AddUser(pb.AddUserRequest(name="bob", password="pw"), None)
    assert answer.error.code == errors.ErrorCode.NOT_COORDINATOR and answer.error.active_address == "127.0.0.1:4242"


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_users_and_acls(secure, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    admin_file = tmp_path / "admin.password"
    admin_file.write_text(ADMIN_PASSWORD + "\n")
    target = ("--bootstrap", secure.cluster.coordinator.address, "--ca-file", str(secure.paths.ca),
              "--retry-timeout", "2s")
    as_admin = (*target, "--user", ADMIN, "--password-file", str(admin_file))
    as_bob = (*target, "--user", "bob")
    bob_env = {"KVLEASE_SECURITY_PASSWORD": BOB_PASSWORD}
    ok = _Succeeds()

    _cli_users(ok, as_admin)
    denied = _cli_acls(ok, as_admin, as_bob, bob_env)
    _cli_bad_input(as_admin)
    wrong = _cli_credentials(secure, as_bob, bob_env)

    assert "user carol added by User:admin" in caplog.text  # the server's log: who changed what, never a password
    outputs = ok.outputs + [denied.output, wrong.output]
    for secret in (ADMIN_PASSWORD, BOB_PASSWORD, "carol-Secret-7", "dave-Secret-9", "wrong-Password-1"):
        assert not any(secret in output for output in outputs), secret
        assert secret not in caplog.text, secret


class _Succeeds:
    """Runs a kvlease command that must succeed; keeps every output (none may show a password)."""

    def __init__(self) -> None:
        self.outputs: list[str] = []

    def __call__(self, *args, env=None, input=None):
        result = run(*args, env=env) if input is None else _run_with_input(args, env, input)
        self.outputs.append(result.output)
        assert result.exit_code == 0, result.output
        return result


def _cli_users(ok, as_admin) -> None:
    ok(*as_admin, "user", "add", "carol", "--password-stdin", input="carol-Secret-7\n")
    assert "already exists" in ok(*as_admin, "user", "add", "carol", "--password-stdin",
                                  input="carol-Secret-7\n").output
    ok(*as_admin, "user", "add", "dave", env={"KVLEASE_NEW_USER_PASSWORD": "dave-Secret-9"})
    assert json.loads(ok(*as_admin, "user", "list", "--json").stdout) == {"users": [ADMIN, "bob", "carol", "dave"]}
    assert json.loads(ok(*as_admin, "user", "remove", "dave", "--json").stdout) == {"user": "dave", "removed": True}
    assert "nothing to remove" in ok(*as_admin, "user", "remove", "dave").output


def _cli_acls(ok, as_admin, as_bob, bob_env):
    """Grants, a delegated grant, refusals, listing and revoking; returns bob's refused cluster grant."""
    doc = json.loads(ok(*as_admin, "acl", "add", "--principal", "User:bob", "--operation", "alter", "--database", "db",
                        "--json").stdout)
    assert doc == {"resource_type": "database", "resource": "db", "principal": "User:bob", "operation": "ALTER",
                   "added": True}
    ok(*as_admin, "acl", "add", "--principal", "User:*", "--operation", "DESCRIBE", "--cluster-wide")
    # bob administers db: he grants carol READ on db.t, and is denied on the cluster
    wait_until(lambda: ok(*as_bob, "acl", "add", "--principal", "User:carol", "--operation", "READ", "--table", "db.t",
                          env=bob_env), ACL_WAIT_S, "bob's grant of READ on db.t to carol",
               retry_on=(AssertionError,))  # ok() asserts exit code 0: refused until bob's ALTER reached the caches
    denied = run(*as_bob, "acl", "add", "--principal", "User:bob", "--operation", "ALL", "--cluster-wide", env=bob_env)
    line = assert_one_line_error(denied)
    assert "User:bob may not ALTER cluster" in line
    line = assert_one_line_error(run(*as_bob, "user", "list", env=bob_env))
    assert "may not ALTER cluster" in line
    listed = json.loads(ok(*as_admin, "acl", "list", "--json").stdout)["acls"]
    assert {(a["resource"], a["principal"], a["operation"]) for a in listed} == {
        ("", "User:*", "DESCRIBE"), ("db", "User:bob", "ALTER"), ("db.t", "User:carol", "READ")}
    text = ok(*as_admin, "acl", "list", "--table", "db.t").stdout
    assert "User:carol" in text and "User:bob" not in text
    assert "revoked" in ok(*as_admin, "acl", "remove", "--principal", "User:carol", "--operation", "READ",
                           "--table", "db.t").output
    assert "nothing to revoke" in ok(*as_admin, "acl", "remove", "--principal", "User:carol", "--operation", "READ",
                                     "--table", "db.t").output
    return denied


def _cli_bad_input(as_admin) -> None:
    """Bad input: one line, exit 2, before any call."""
    for args, expected in [
        (("acl", "add", "--principal", "bob", "--operation", "READ", "--table", "db.t"), "--principal"),
        (("acl", "add", "--principal", "User:bob", "--operation", "FLY", "--table", "db.t"), "--operation"),
        (("acl", "add", "--principal", "User:bob", "--operation", "READ"), "which resource"),
        (("acl", "add", "--principal", "User:bob", "--operation", "READ", "--table", "t", "--database", "d"),
         "give one resource"),
        (("acl", "list", "--table", "nodot"), "--table"),
        (("user", "add", "no spaces", "--password-stdin"), "NAME"),
        (("user", "add", "erin"), "no password given"),
        (("acl", "add", "--principal", "User:bob"), "Missing option"),
    ]:
        assert expected in assert_one_line_error(run(*as_admin, *args), code=2), args
    result = _run_with_input((*as_admin, "user", "add", "erin", "--password-stdin"), None, "\n")
    assert "must not be empty" in assert_one_line_error(result, code=2)
    result = _run_with_input((*as_admin, "user", "add", "erin", "--password-stdin"), None, b"\x80secret\n")
    assert "the password on stdin is not UTF-8 text" in assert_one_line_error(result, code=2)  # found by the fuzz test


def _cli_credentials(secure, as_bob, bob_env):
    """A wrong password, no password at all, --user without TLS; returns the wrong password's result."""
    wrong = run(*as_bob, "user", "list", env={"KVLEASE_SECURITY_PASSWORD": "wrong-Password-1"})
    assert "authentication failed" in assert_one_line_error(wrong)
    assert "no password for --user bob" in assert_one_line_error(run(*as_bob, "acl", "list"))
    plain = run("--bootstrap", secure.cluster.coordinator.address, "--user", "bob", "acl", "list", env=bob_env)
    assert "need TLS" in assert_one_line_error(plain, code=2)  # refused before anything is sent
    return wrong


def _run_with_input(args, env, text):
    from click.testing import CliRunner

    from kvlease.ops.cli import kvlease
    from tests.support.cli_runner import NO_ENV

    return CliRunner().invoke(kvlease, list(args), env={**NO_ENV, **(env or {})}, prog_name="kvlease", input=text)
