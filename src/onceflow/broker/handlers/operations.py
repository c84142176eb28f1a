"""The authorized-operations bit fields of Metadata, DescribeCluster, DescribeGroups and
DescribeTopicPartitions: bit `op` (Kafka's AclOperation code) is set for each operation the
resource type supports (Kafka's AclEntry.supportedOperations) that the connection's principal
may perform; without an authorizer that is all of them."""

from __future__ import annotations

from onceflow.broker.handlers import RequestContext
from onceflow.security.acl import CLUSTER_NAME, Operation, ResourceType

# Kafka's "not requested" sentinel.
OMITTED = -(2**31)
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE,
                         Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE,
                         Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER,
                           Operation.DESCRIBE),
}


def authorized_operations(ctx: RequestContext, resource_type: ResourceType, name: str) -> int:
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if ctx.authorized(operation, resource_type, name):
            bits |= 1 << int(operation)
    return bits


def cluster_operations(ctx: RequestContext) -> int:
    return authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
