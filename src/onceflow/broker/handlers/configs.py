"""DescribeConfigs and IncrementalAlterConfigs for topics (and a read-only broker view).

Topic configs are Kafka's names with Kafka's defaults (storage.config). A value set
on the topic reports source DYNAMIC_TOPIC_CONFIG, a broker log.* default from --config
STATIC_BROKER_CONFIG, anything else DEFAULT_CONFIG.
"""

from __future__ import annotations

from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from onceflow.broker.config_file import effective_broker_configs
from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage import config as topic_config
from onceflow.storage.store import TopicInfo

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

# Kafka's ConfigSource values.
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

# IncrementalAlterConfigs operations.
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


def topic_config_error(configs: dict[str, str]) -> str | None:
    """Why these topic configs are invalid, or None."""
    try:
        topic_config.validate_topic_configs(configs)
    except topic_config.InvalidConfig as exc:
        return str(exc)
    return None


def _entry(name: str, value: str | None, source: int) -> dict:
    return {
        "name": name, "value": value, "read_only": False, "config_source": source,
        "is_sensitive": False, "synonyms": [],
        "config_type": 0, "documentation": None,
    }


def describe_topic_configs(info: TopicInfo, keys,
                           broker_defaults: Mapping[str, str] | None = None) -> list[dict]:
    """Each topic config: the topic's own (DYNAMIC_TOPIC_CONFIG), else the broker's log.*
    default from --config (STATIC_BROKER_CONFIG), else Kafka's (DEFAULT_CONFIG)."""
    entries = []
    broker_defaults = broker_defaults or {}
    for name, default in topic_config.TOPIC_CONFIG_DEFAULTS.items():
        if keys and name not in keys:
            continue
        if name in info.configs:
            entries.append(_entry(name, info.configs[name], SOURCE_DYNAMIC_TOPIC))
        elif name in broker_defaults:
            entries.append(_entry(name, broker_defaults[name], SOURCE_STATIC_BROKER))
        else:
            entries.append(_entry(name, default, SOURCE_DEFAULT))
    return entries


def _broker_configs(ctx: RequestContext, keys) -> list[dict]:
    """The effective broker configs: STATIC_BROKER_CONFIG when set by --config (or the
    broker id), DEFAULT_CONFIG otherwise."""
    values = {"broker.id": (str(ctx.node_id), True)} | effective_broker_configs(ctx.broker.config)
    return [_entry(k, v, SOURCE_STATIC_BROKER if static else SOURCE_DEFAULT)
            for k, (v, static) in values.items() if not keys or k in keys]


def _denied(ctx: RequestContext, resource, operation: Operation) -> ErrorCode | None:
    """Kafka's check: the topic's or the cluster's (broker resources) DescribeConfigs or
    AlterConfigs (issue 13)."""
    if resource.resource_type == RESOURCE_TOPIC:
        if not ctx.authorized(operation, ResourceType.TOPIC, resource.resource_name):
            return ErrorCode.topic_authorization_failed
    elif not ctx.authorized_cluster(operation):
        return ErrorCode.cluster_authorization_failed
    return None


def _describe_one(ctx: RequestContext, resource) -> dict:
    result = {"error_code": ErrorCode.none, "error_message": None,
              "resource_type": resource.resource_type, "resource_name": resource.resource_name,
              "configs": []}
    keys = resource.configuration_keys
    denied = _denied(ctx, resource, Operation.DESCRIBE_CONFIGS)
    if denied is not None:
        return {**result, "error_code": denied}
    if resource.resource_type == RESOURCE_TOPIC:
        info = ctx.broker.topic(resource.resource_name)
        if info is None:
            return {**result, "error_code": ErrorCode.unknown_topic_or_partition,
                    "error_message": f"Topic {resource.resource_name} does not exist"}
        return {**result, "configs": describe_topic_configs(
            info, keys, dict(ctx.broker.config.log_defaults))}
    if resource.resource_type == RESOURCE_BROKER:
        return {**result, "configs": _broker_configs(ctx, keys)}
    return {**result, "error_code": ErrorCode.invalid_request,
            "error_message": f"unsupported resource type {resource.resource_type}"}


@handles(ApiKey.DESCRIBE_CONFIGS)
async def describe_configs(ctx: RequestContext, body) -> dict:
    return {"throttle_time": 0, "results": [_describe_one(ctx, r) for r in body.resources]}


def _apply_ops(current: dict[str, str], ops) -> dict[str, str]:
    updated = dict(current)
    for op in ops:
        if op.config_operation == OP_SET:
            updated[op.name] = op.value
        elif op.config_operation == OP_DELETE:
            updated.pop(op.name, None)
        elif op.config_operation in (OP_APPEND, OP_SUBTRACT):
            base = updated.get(op.name, topic_config.TOPIC_CONFIG_DEFAULTS.get(op.name, ""))
            items = [i for i in base.split(",") if i]
            change = [i for i in (op.value or "").split(",") if i]
            if op.config_operation == OP_APPEND:
                items += [i for i in change if i not in items]
            else:
                items = [i for i in items if i not in change]
            updated[op.name] = ",".join(items)
        else:
            raise topic_config.InvalidConfig(f"unknown config operation {op.config_operation}")
    return updated


def _alter_one(ctx: RequestContext, resource, validate_only: bool) -> dict:
    result = {"error_code": ErrorCode.none, "error_message": None,
              "resource_type": resource.resource_type, "resource_name": resource.resource_name}
    denied = _denied(ctx, resource, Operation.ALTER_CONFIGS)
    if denied is not None:
        return {**result, "error_code": denied}
    if resource.resource_type != RESOURCE_TOPIC:
        return {**result, "error_code": ErrorCode.invalid_request,
                "error_message": "only topic configs can be altered"}
    info = ctx.broker.topic(resource.resource_name)
    if info is None:
        return {**result, "error_code": ErrorCode.unknown_topic_or_partition}
    try:
        updated = _apply_ops(info.configs, resource.configs)
        topic_config.validate_topic_configs(updated)
    except topic_config.InvalidConfig as exc:
        return {**result, "error_code": ErrorCode.invalid_config, "error_message": str(exc)}
    if not validate_only:
        ctx.broker.store.alter_topic_configs(info.name, updated)
    return result


@handles(ApiKey.INCREMENTAL_ALTER_CONFIGS)
async def incremental_alter_configs(ctx: RequestContext, body) -> dict:
    return {"throttle_time": 0,
            "responses": [_alter_one(ctx, r, body.validate_only) for r in body.resources]}
