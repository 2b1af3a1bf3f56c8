"""The wire form of ACL bindings (security.proto's AclEntryPb), for the SecurityService and its client."""

from __future__ import annotations

from kvlease.common.errors import InvalidRequestError, show
from kvlease.common.proto import security_pb2 as pb
from kvlease.common.security.acl import AclBinding, Operation, Resource, ResourceType, check_principal


def resource_of(resource_type: str, name: str) -> Resource:
    """The validated resource named by a type and name; InvalidRequestError for an unknown type or a bad name."""
    try:
        kind = ResourceType(str(resource_type).lower())
    except ValueError:
        raise InvalidRequestError(f"unknown resource type {show(resource_type)}: cluster, database or table",
                                  resource_type=str(resource_type)) from None
    return Resource.of(kind, name)


def resource_fields(resource: Resource) -> dict[str, str]:
    """``resource_type`` and ``resource_name`` of a message (the cluster's name is left empty)."""
    return {"resource_type": resource.type.value,
            "resource_name": "" if resource.type is ResourceType.CLUSTER else resource.name}


def binding_to_pb(binding: AclBinding) -> pb.AclEntryPb:
    return pb.AclEntryPb(**resource_fields(binding.resource), principal=binding.principal,
                         operation=binding.operation.value)


def binding_from_pb(msg: pb.AclEntryPb) -> AclBinding:
    """The binding a message names, validated (InvalidRequestError naming what is wrong)."""
    return AclBinding(resource_of(msg.resource_type, msg.resource_name), check_principal(msg.principal),
                      Operation.parse(msg.operation))
