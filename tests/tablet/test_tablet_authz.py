"""TableAccess (tablet/authz.py) without a server: which table a request's id names, and when it is checked."""

from __future__ import annotations

import pytest

from kvlease.common.errors import AuthorizationFailedError
from kvlease.common.security.acl import AclEntry, Authorizer, Operation, Resource
from kvlease.common.security.server import OPEN
from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.authz import READ, WRITE, TableAccess

pytestmark = pytest.mark.unit

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 2)


class Replicas:
    """Leads the tables it is given (only ``table`` is used)."""

    def __init__(self, *tables: TableInfo) -> None:
        self.tables = {t.table_id: t for t in tables}

    def table(self, table_id: int):
        return self.tables.get(table_id)


class Security:
    """Security on, the caller is ``caller``, ACLs from ``acls``."""

    enabled = True

    def __init__(self, caller: str, acls) -> None:
        self.caller = caller
        self.authorizer = Authorizer(acls)

    def principal(self) -> str:
        return self.caller

    def check(self, operation, resource, principal=None) -> None:
        self.authorizer.check(principal or self.caller, operation, resource)


def test_security_off_checks_nothing_and_never_looks_the_table_up():
    access = TableAccess(object(), OPEN)  # no ``table`` method: a lookup would fail
    access.check(WRITE, 7)
    assert access.principal() is None


def test_a_led_table_is_checked_by_its_path():
    acls = {Resource.table("db.t"): {AclEntry("User:bob", Operation.READ)}}
    access = TableAccess(Replicas(TABLE), Security("User:bob", acls))
    access.check(READ, 7)
    with pytest.raises(AuthorizationFailedError, match="User:bob may not WRITE table db.t") as info:
        access.check(WRITE, 7)
    assert info.value.details == {"principal": "User:bob", "operation": "WRITE", "resource": "table db.t"}
    assert access.resource(7) == Resource.table("db.t") and access.principal() == "User:bob"


def test_a_table_id_not_led_here_is_left_to_the_handler():
    access = TableAccess(Replicas(TABLE), Security("User:eve", {}))
    access.check(WRITE, 8)  # the handler answers NOT_LEADER / TABLE_NOT_EXIST, as for anyone
    assert access.resource(8) is None
    with pytest.raises(AuthorizationFailedError):
        access.check(READ, 7)
