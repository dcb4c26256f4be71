"""The ``authorized_operations`` bit fields of Metadata, DescribeCluster and DescribeGroups:
which operations the requesting principal may perform on a resource, one bit per Kafka
operation code, or "not provided" when the request did not ask."""

from __future__ import annotations

from typing import Final

from icefloe.broker.server import RequestContext
from icefloe.security.acls import CLUSTER_NAME, Operation, ResourceType

NOT_PROVIDED: Final = -(2**31)

_OPERATIONS: Final[dict[ResourceType, tuple[Operation, ...]]] = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALTER,
        Operation.DESCRIBE,
    ),
}
"""The operations that apply to each resource type (Kafka's ``supportedOperations``)."""


def authorized_operations(
    ctx: RequestContext, asked: bool, resource_type: ResourceType, name: str = CLUSTER_NAME
) -> int:
    if not asked:
        return NOT_PROVIDED
    bits = 0
    for operation in _OPERATIONS[resource_type]:
        if ctx.allows(operation, resource_type, name):
            bits |= 1 << operation
    return bits
