"""The ACL model and the Authorizer. Pure: the authorizer is a snapshot of ACLs, rebuilt when they change.

- A **principal** is ``User:<name>``; ``User:*`` in an entry matches every user.
- A **resource** is the cluster, a database (``db``) or a table (``db.t``).
  A grant on the cluster covers every database and table; on a database, its
  tables.
- An **operation** is READ, WRITE, CREATE, DROP, ALTER, DESCRIBE or ALL (every
  operation). Any grant on a resource also allows DESCRIBE of it.
- Super users may do everything. Entries only allow (there is no deny).
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from kvlease.common.errors import AuthorizationFailedError, InvalidRequestError, show
from kvlease.common.security.authn import USER_NAME, USER_PREFIX

_DB_OR_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # common.tables' name rule
WILDCARD_PRINCIPAL = USER_PREFIX + "*"
CLUSTER_NAME = "kvlease-cluster"
_MAX_ANSWERS = 65_536  # an Authorizer's remembered answers


class _OrderedByValue:
    """Enum members ordered by their value, so resources and entries (ordered dataclasses) sort."""

    def __lt__(self, other):
        return self.value < other.value if type(other) is type(self) else NotImplemented

    def __le__(self, other):
        return self.value <= other.value if type(other) is type(self) else NotImplemented

    def __gt__(self, other):
        return self.value > other.value if type(other) is type(self) else NotImplemented

    def __ge__(self, other):
        return self.value >= other.value if type(other) is type(self) else NotImplemented


class Operation(_OrderedByValue, enum.Enum):
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DROP = "DROP"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    ALL = "ALL"

    @classmethod
    def parse(cls, text: "str | Operation") -> "Operation":
        if isinstance(text, cls):
            return text
        try:
            return cls(str(text).upper())
        except ValueError:
            raise InvalidRequestError(f"unknown operation {show(text)}: one of {', '.join(o.value for o in cls)}",
                                      operation=str(text)) from None


class ResourceType(_OrderedByValue, enum.Enum):
    CLUSTER = "cluster"
    DATABASE = "database"
    TABLE = "table"


@dataclass(frozen=True, order=True)
class Resource:
    type: ResourceType
    name: str

    def __str__(self) -> str:
        return "cluster" if self.type is ResourceType.CLUSTER else f"{self.type.value} {self.name}"

    @classmethod
    def cluster(cls) -> "Resource":
        return cls(ResourceType.CLUSTER, CLUSTER_NAME)

    @classmethod
    def database(cls, db: str) -> "Resource":
        if not _DB_OR_TABLE.fullmatch(db or ""):
            raise InvalidRequestError(f"invalid database name {show(db)}", database=str(db))
        return cls(ResourceType.DATABASE, db)

    @classmethod
    @functools.lru_cache(maxsize=4096)  # a resource per request: validate each path once
    def table(cls, path: str) -> "Resource":
        parts = (path or "").split(".")
        if len(parts) != 2 or not all(_DB_OR_TABLE.fullmatch(p) for p in parts):
            raise InvalidRequestError(f"invalid table path {show(path)}: expected db.table", table=str(path))
        return cls(ResourceType.TABLE, path)

    @classmethod
    def of(cls, type_: str | ResourceType, name: str = "") -> "Resource":
        """A validated resource from its type and name (the cluster's name is ignored)."""
        kind = type_ if isinstance(type_, ResourceType) else ResourceType(str(type_).lower())
        return {ResourceType.CLUSTER: lambda _: cls.cluster(), ResourceType.DATABASE: cls.database,
                ResourceType.TABLE: cls.table}[kind](name)

    def covering(self) -> tuple["Resource", ...]:
        """This resource and every resource whose grants cover it, most specific first."""
        if self.type is ResourceType.TABLE:
            return self, Resource.database(self.name.split(".", 1)[0]), Resource.cluster()
        if self.type is ResourceType.DATABASE:
            return self, Resource.cluster()
        return (self,)


def check_principal(principal: str, *, wildcard: bool = True) -> str:
    """``principal`` if it is ``User:<name>`` (or ``User:*`` when ``wildcard``), else InvalidRequestError."""
    if wildcard and principal == WILDCARD_PRINCIPAL:
        return principal
    if not (isinstance(principal, str) and principal.startswith(USER_PREFIX)
            and USER_NAME.fullmatch(principal[len(USER_PREFIX):])):
        raise InvalidRequestError(f"invalid principal {show(principal)}: expected User:<name>"
                                  + (" or User:*" if wildcard else ""), principal=str(principal))
    return principal


@dataclass(frozen=True, order=True)
class AclEntry:
    """``principal`` may do ``operation`` (on the resource the entry is stored under)."""

    principal: str
    operation: Operation

    def __post_init__(self) -> None:
        check_principal(self.principal)

    def to_json(self) -> dict:
        return {"principal": self.principal, "operation": self.operation.value}

    @classmethod
    def from_json(cls, data: Mapping) -> "AclEntry":
        return cls(str(data["principal"]), Operation.parse(data["operation"]))

    def allows(self, principal: str, operation: Operation) -> bool:
        if self.principal not in (principal, WILDCARD_PRINCIPAL):
            return False
        return operation is Operation.DESCRIBE or self.operation in (operation, Operation.ALL)


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL entry with its resource, as the SecurityService adds, removes and lists them."""

    resource: Resource
    principal: str
    operation: Operation

    def __post_init__(self) -> None:
        check_principal(self.principal)

    @property
    def entry(self) -> AclEntry:
        return AclEntry(self.principal, self.operation)

    def to_json(self) -> dict:
        return {"resource_type": self.resource.type.value,
                "resource": "" if self.resource.type is ResourceType.CLUSTER else self.resource.name,
                "principal": self.principal, "operation": self.operation.value}


class Authorizer:
    """``check(principal, operation, resource)``: None if allowed, else AuthorizationFailedError. No I/O."""

    def __init__(self, acls: Mapping[Resource, Iterable[AclEntry]] | None = None,
                 super_users: Iterable[str] = ()) -> None:
        self._acls = {resource: frozenset(entries) for resource, entries in (acls or {}).items()}
        self._super = frozenset(check_principal(p, wildcard=False) for p in super_users)
        # answers so far: the ACLs never change under this object (a change builds a new one), so a
        # request's check is one dict lookup after the first; bounded, cleared when full
        self._answers: dict[tuple[str, Operation, Resource], bool] = {}

    @property
    def acls(self) -> Mapping[Resource, frozenset[AclEntry]]:
        return dict(self._acls)

    def allowed(self, principal: str, operation: Operation, resource: Resource) -> bool:
        key = (principal, operation, resource)
        answer = self._answers.get(key)
        if answer is None:
            answer = principal in self._super or any(
                entry.allows(principal, operation)
                for covering in resource.covering() for entry in self._acls.get(covering, ()))
            if len(self._answers) >= _MAX_ANSWERS:
                self._answers.clear()
            self._answers[key] = answer
        return answer

    def check(self, principal: str, operation: Operation, resource: Resource) -> None:
        if operation is Operation.ALL:
            raise ValueError("check a concrete operation, not ALL")
        if not self.allowed(principal, operation, resource):
            # finding the table comes first in most commands: say that the grant the command needs covers it
            hint = " (any grant on it allows DESCRIBE)" if operation is Operation.DESCRIBE else ""
            raise AuthorizationFailedError(f"{principal} may not {operation.value} {resource}{hint}",
                                           principal=principal, operation=operation.value, resource=str(resource))
