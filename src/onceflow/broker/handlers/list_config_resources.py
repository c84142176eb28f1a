"""ListConfigResources (API 74): v0 is Kafka 3.7's ListClientMetricsResources (the
client-metrics subscriptions); v1 (KIP-1142, Kafka 4.1) lists every config resource of
the requested types, all supported types when none is named."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.handlers.configs import (
    RESOURCE_BROKER,
    RESOURCE_BROKER_LOGGER,
    RESOURCE_CLIENT_METRICS,
    RESOURCE_GROUP,
    RESOURCE_TOPIC,
)
from onceflow.security.acl import Operation

# ListConfigResources v1 with no type filter lists these (Kafka's supported types).
LISTED_RESOURCE_TYPES = (RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER,
                         RESOURCE_GROUP, RESOURCE_CLIENT_METRICS)


def _resource_names(ctx: RequestContext, resource_type: int) -> list[str]:
    """The names ListConfigResources reports for one resource type."""
    stored = ctx.broker.resource_configs.names(resource_type)
    if resource_type == RESOURCE_TOPIC:
        return sorted(ctx.broker.topics())
    if resource_type == RESOURCE_BROKER:
        return [str(node.node_id) for node in ctx.broker.cluster.nodes]
    if resource_type == RESOURCE_BROKER_LOGGER:
        return [str(ctx.node_id)]
    if resource_type == RESOURCE_GROUP:
        listed = ctx.groups.coordinator.list_groups((), ()).groups
        return sorted(set(stored) | {g.group_id for g in listed})
    return stored


@handles(ApiKey.LIST_CONFIG_RESOURCES)
async def list_config_resources(ctx: RequestContext, body) -> dict:
    """v0 (ListClientMetricsResources): the client-metrics subscriptions; v1: every config
    resource of the requested types (all of them when none is named). Needs
    DESCRIBE_CONFIGS on the cluster, as Kafka checks it."""
    response = {"throttle_time": 0, "error_code": ErrorCode.none, "config_resources": []}
    if not ctx.authorized_cluster(Operation.DESCRIBE_CONFIGS):
        return {**response, "error_code": ErrorCode.cluster_authorization_failed}
    requested = getattr(body, "resource_types", None)
    if requested is None:  # v0
        names = ctx.broker.resource_configs.names(RESOURCE_CLIENT_METRICS)
        return {**response, "config_resources": [{"resource_name": n} for n in names]}
    types = [int(t) for t in requested] or list(LISTED_RESOURCE_TYPES)
    if any(t not in LISTED_RESOURCE_TYPES for t in types):
        return {**response, "error_code": ErrorCode.unsupported_version}
    return {**response, "config_resources": [
        {"resource_name": name, "resource_type": t}
        for t in dict.fromkeys(types) for name in _resource_names(ctx, t)]}
