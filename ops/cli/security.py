"""``kvlease user add|remove|list`` and ``kvlease acl add|remove|list``: users and ACLs, through the
coordinator's SecurityService (with security on, changing them needs ALTER; see
coordinator/security_service.py).

A new user's password is never needed on the command line: ``--password-stdin``
reads it from the first line of stdin, ``KVLEASE_NEW_USER_PASSWORD`` from the
environment, and on a terminal the command asks (twice). ``--password PW``
exists for scripts that have no other way, but other local users can see it
(``ps``, shell history). Bad input is one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import getpass
import sys

import click

from kvlease.common import errors
from kvlease.common.security.acl import AclBinding, Operation, Resource, check_principal
from kvlease.common.security.authn import check_user_name
from kvlease.ops.cli.app import OneLineUsageError, State, catch_errors, common_options, kvlease, pass_state

NEW_PASSWORD_ENV = "KVLEASE_NEW_USER_PASSWORD"


def _checked(check, value: str, param: str):
    """``check(value)``, its InvalidRequestError as a usage error naming the option."""
    try:
        return check(value)
    except errors.InvalidRequestError as exc:
        raise OneLineUsageError(f"{param}: {exc.message}", click.get_current_context()) from None


# -- users ---------------------------------------------------------------------------------------


@kvlease.group("user")
def user_group() -> None:
    """Add, remove and list users (needs ALTER on the cluster when security is on)."""


def _new_password(name: str, from_stdin: bool, given: str | None) -> str:
    ctx = click.get_current_context()
    if from_stdin and given is not None:
        raise OneLineUsageError("give --password-stdin or --password, not both", ctx)
    if from_stdin:
        try:
            line = sys.stdin.readline()
        except UnicodeDecodeError:
            raise OneLineUsageError("the password on stdin is not UTF-8 text", ctx) from None
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    elif given is not None:
        password = given
    elif sys.stdin is not None and sys.stdin.isatty():
        password = getpass.getpass(f"password of the new user {name}: ")
        if getpass.getpass("again: ") != password:
            raise OneLineUsageError("the two passwords differ", ctx)
    else:
        raise OneLineUsageError(f"no password given: use --password-stdin (or {NEW_PASSWORD_ENV}), "
                                "or run on a terminal to be asked", ctx)
    if not password:
        raise OneLineUsageError("the password must not be empty", ctx)
    return password


@user_group.command("add")
@click.argument("name")
@click.option("--password-stdin", "from_stdin", is_flag=True, help="Read the password from the first line of stdin.")
@click.option("--password", "password", envvar=NEW_PASSWORD_ENV, metavar="PW",
              help=f"The password (visible to other local users in ps and shell history: prefer "
                   f"--password-stdin). Env: {NEW_PASSWORD_ENV}.")
@common_options
@pass_state
@catch_errors
def user_add(state: State, name: str, from_stdin: bool, password: str | None) -> None:
    """Add a user (a super user's name in security.super-users makes it one). Without a password
    option the command asks for it on a terminal."""
    _checked(check_user_name, name, "NAME")
    password = _new_password(name, from_stdin, password)
    created = state.client.add_user(name, password)
    text = f"added user {name}" if created else f"user {name} already exists with this password: nothing changed"
    state.output.message(text, {"user": name, "created": created})


@user_group.command("remove")
@click.argument("name")
@common_options
@pass_state
@catch_errors
def user_remove(state: State, name: str) -> None:
    """Remove a user (its ACL entries stay: remove them with `kvlease acl remove`)."""
    _checked(check_user_name, name, "NAME")
    removed = state.client.remove_user(name)
    state.output.message(f"removed user {name}" if removed else f"no user {name} (nothing to remove)",
                         {"user": name, "removed": removed})


@user_group.command("list")
@common_options
@pass_state
@catch_errors
def user_list(state: State) -> None:
    """List the users (the cluster's own principal and certificate identities are not users)."""
    names = state.client.list_users()
    state.output.users({"users": names})


# -- ACLs ----------------------------------------------------------------------------------------


@kvlease.group("acl")
def acl_group() -> None:
    """Grant, revoke and list ACL entries: a principal may do an operation on a resource."""


def resource_options(func):
    """``--table DB.NAME | --database DB | --cluster-wide`` (``--cluster`` is the cluster directory)."""
    func = click.option("--cluster-wide", "on_cluster", is_flag=True,
                        help="The cluster (a grant there covers every database and table).")(func)
    func = click.option("--database", metavar="DB", help="A database (a grant covers its tables).")(func)
    func = click.option("--table", metavar="DB.NAME", help="A table.")(func)
    return func


def _resource(table: str | None, database: str | None, on_cluster: bool, required: bool) -> Resource | None:
    ctx = click.get_current_context()
    given = [name for name, value in (("--table", table), ("--database", database), ("--cluster-wide", on_cluster))
             if value]
    if len(given) > 1:
        raise OneLineUsageError(f"give one resource, not {' and '.join(given)}", ctx)
    if not given:
        if required:
            raise OneLineUsageError("which resource? give --table DB.NAME, --database DB or --cluster-wide", ctx)
        return None
    if on_cluster:
        return Resource.cluster()
    if table is not None:
        return _checked(Resource.table, table, "--table")
    return _checked(Resource.database, database, "--database")


def _binding(principal: str, operation: str, resource: Resource) -> AclBinding:
    return AclBinding(resource, _checked(check_principal, principal, "--principal"),
                      _checked(Operation.parse, operation, "--operation"))


def _describe(binding: AclBinding) -> str:
    return f"{binding.principal} {binding.operation.value} on {binding.resource}"


def entry_options(func):
    func = resource_options(func)
    func = click.option("--operation", required=True,
                        metavar="|".join(o.value for o in Operation), help="What the principal may do.")(func)
    func = click.option("--principal", required=True, metavar="User:NAME",
                        help="User:NAME, or User:* for every user.")(func)
    return func


@acl_group.command("add")
@entry_options
@common_options
@pass_state
@catch_errors
def acl_add(state: State, principal: str, operation: str, table: str | None, database: str | None,
            on_cluster: bool) -> None:
    """Grant PRINCIPAL OPERATION on a resource (needs ALTER on it, its database or the cluster)."""
    binding = _binding(principal, operation, _resource(table, database, on_cluster, required=True))
    added = state.client.add_acl(binding.resource, binding.principal, binding.operation)
    text = f"granted {_describe(binding)}" if added else f"{_describe(binding)} was granted already: nothing changed"
    state.output.message(text, {**binding.to_json(), "added": added})


@acl_group.command("remove")
@entry_options
@common_options
@pass_state
@catch_errors
def acl_remove(state: State, principal: str, operation: str, table: str | None, database: str | None,
               on_cluster: bool) -> None:
    """Revoke an entry (needs ALTER on its resource, its database or the cluster)."""
    binding = _binding(principal, operation, _resource(table, database, on_cluster, required=True))
    removed = state.client.remove_acl(binding.resource, binding.principal, binding.operation)
    text = f"revoked {_describe(binding)}" if removed else f"no entry {_describe(binding)} (nothing to revoke)"
    state.output.message(text, {**binding.to_json(), "removed": removed})


@acl_group.command("list")
@resource_options
@common_options
@pass_state
@catch_errors
def acl_list(state: State, table: str | None, database: str | None, on_cluster: bool) -> None:
    """The entries you may see: those of the resources you may ALTER, and those naming you or User:*
    (only those stored on one resource, with --table/--database/--cluster-wide)."""
    resource = _resource(table, database, on_cluster, required=False)
    state.output.acls({"acls": [binding.to_json() for binding in state.client.list_acls(resource)]})
