"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics (and a read-only
broker view).

Topic configs are Kafka's names with Kafka's defaults and types (storage.config). A value set
on the topic reports source DYNAMIC_TOPIC_CONFIG, a broker log.* default from --config
STATIC_BROKER_CONFIG, anything else DEFAULT_CONFIG; with include_synonyms each entry lists
the layers below it as Kafka does (topic value, broker log.* key, default). Broker configs are
static (read_only, not alterable here); keys naming a password are sensitive and their value
is never sent. AlterConfigs (legacy) replaces all of a topic's configs with the given set.
"""

from __future__ import annotations

from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from onceflow.broker.config_file import LOG_DEFAULT_KEYS, effective_broker_configs
from onceflow.broker.handlers import ApiKey, RequestContext, handles, loggers
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage import config as topic_config
from onceflow.storage.store import TopicInfo

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8

# Kafka's ConfigSource values.
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
SOURCE_DYNAMIC_BROKER_LOGGER = 6

# Kafka's DescribeConfigs config_type ids (storage.config.ConfigType, plus the ones only
# broker configs use).
TYPE_PASSWORD = 9
_SENSITIVE_MARKS = ("password", "secret", "sasl.jaas.config")

# IncrementalAlterConfigs operations.
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


def topic_config_error(configs: dict[str, str]) -> str | None:
    """Why these topic configs are invalid, or None."""
    try:
        topic_config.validate_topic_configs(configs)
    except topic_config.InvalidConfig as exc:
        return str(exc)
    return None


def _entry(name: str, value: str | None, source: int, config_type: int = 0,
           synonyms: list[dict] | None = None, read_only: bool = False) -> dict:
    sensitive = config_type == TYPE_PASSWORD
    return {
        "name": name, "value": None if sensitive else value, "read_only": read_only,
        "config_source": source, "is_sensitive": sensitive, "synonyms": synonyms or [],
        "config_type": config_type, "documentation": None,
    }


def _synonym(name: str, value: str | None, source: int) -> dict:
    return {"name": name, "value": value, "source": source}


# Topic config -> the broker keys that default it, in precedence order (log.retention.ms
# before .minutes before .hours), with each key's unit in milliseconds (0: same text).
_BROKER_SYNONYMS: dict[str, list[tuple[str, int]]] = {}
for _key, (_topic_key, _unit) in LOG_DEFAULT_KEYS.items():
    _BROKER_SYNONYMS.setdefault(_topic_key, []).append((_key, _unit))


def _in_unit(value: str, unit: int) -> str:
    return value if unit in (0, 1) else str(int(value) // unit)


def _topic_synonyms(name: str, own: str | None, broker_value: str | None,
                    static_keys: frozenset[str]) -> list[dict]:
    """Kafka's synonyms of a topic config, highest precedence first: the topic's value, the
    broker key set in server.properties that won, and the default under the broker key that
    carries it (the last of its group, as log.retention.hours=168)."""
    synonyms = []
    if own is not None:
        synonyms.append(_synonym(name, own, SOURCE_DYNAMIC_TOPIC))
    group = _BROKER_SYNONYMS.get(name, [])
    if broker_value is not None:
        winner = next(((k, u) for k, u in group if k in static_keys), None)
        if winner is not None:
            synonyms.append(_synonym(winner[0], _in_unit(broker_value, winner[1]),
                                     SOURCE_STATIC_BROKER))
    default = topic_config.TOPIC_CONFIG_DEFAULTS[name]
    if group:
        key, unit = group[-1]
        synonyms.append(_synonym(key, _in_unit(default, unit), SOURCE_DEFAULT))
    return synonyms


def describe_topic_configs(info: TopicInfo, keys,
                           broker_defaults: Mapping[str, str] | None = None,
                           include_synonyms: bool = False,
                           static_keys: frozenset[str] = frozenset()) -> list[dict]:
    """Each topic config: the topic's own (DYNAMIC_TOPIC_CONFIG), else the broker's log.*
    default from --config (STATIC_BROKER_CONFIG), else Kafka's (DEFAULT_CONFIG)."""
    entries = []
    broker_defaults = broker_defaults or {}
    for name, default in topic_config.TOPIC_CONFIG_DEFAULTS.items():
        if keys and name not in keys:
            continue
        config_type = int(topic_config.TOPIC_CONFIGS[name].type)
        synonyms = (_topic_synonyms(name, info.configs.get(name), broker_defaults.get(name),
                                    static_keys) if include_synonyms else [])
        if name in info.configs:
            value, source = info.configs[name], SOURCE_DYNAMIC_TOPIC
        elif name in broker_defaults:
            value, source = broker_defaults[name], SOURCE_STATIC_BROKER
        else:
            value, source = default, SOURCE_DEFAULT
        entries.append(_entry(name, value, source, config_type, synonyms))
    return entries


def broker_config_type(key: str, value: str | None) -> int:
    """The config_type of a broker key: the topic config's type for the log.* keys that
    default one; passwords PASSWORD; otherwise from the key's kind (lists, *.ms longs) and
    the value's form."""
    if any(mark in key for mark in _SENSITIVE_MARKS):
        return TYPE_PASSWORD
    if key in LOG_DEFAULT_KEYS:
        return int(topic_config.TOPIC_CONFIGS[LOG_DEFAULT_KEYS[key][0]].type)
    if key.endswith(("listeners", ".map", "listener.names", "log.dirs", ".list")):
        return int(topic_config.ConfigType.LIST)
    text = value or ""
    if text in ("true", "false"):
        return int(topic_config.ConfigType.BOOLEAN)
    if text.lstrip("-").isdigit():
        if key.endswith((".ms", ".bytes.per.second")) or not -(2**31) <= int(text) < 2**31:
            return int(topic_config.ConfigType.LONG)
        return int(topic_config.ConfigType.INT)
    try:
        float(text)
    except ValueError:
        return int(topic_config.ConfigType.STRING)
    return int(topic_config.ConfigType.DOUBLE)


def _broker_configs(ctx: RequestContext, keys, include_synonyms: bool) -> list[dict]:
    """The effective broker configs: STATIC_BROKER_CONFIG when set by --config (or the
    broker id), DEFAULT_CONFIG otherwise; read-only (no dynamic broker configs)."""
    values = {"broker.id": (str(ctx.node_id), True)} | effective_broker_configs(ctx.broker.config)
    entries = []
    for key, (value, static) in values.items():
        if keys and key not in keys:
            continue
        source = SOURCE_STATIC_BROKER if static else SOURCE_DEFAULT
        synonyms = [_synonym(key, value, source)] if include_synonyms else []
        entries.append(_entry(key, value, source, broker_config_type(key, value), synonyms,
                              read_only=True))
    return entries


def _denied(ctx: RequestContext, resource, operation: Operation) -> ErrorCode | None:
    """Kafka's check: the topic's or the cluster's (broker resources) DescribeConfigs or
    AlterConfigs (issue 13)."""
    if resource.resource_type == RESOURCE_TOPIC:
        if not ctx.authorized(operation, ResourceType.TOPIC, resource.resource_name):
            return ErrorCode.topic_authorization_failed
    elif not ctx.authorized_cluster(operation):
        return ErrorCode.cluster_authorization_failed
    return None


def _describe_one(ctx: RequestContext, resource, include_synonyms: bool) -> dict:
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
            return _unknown_topic(result, resource.resource_name)
        return {**result, "configs": describe_topic_configs(
            info, keys, dict(ctx.broker.config.log_defaults), include_synonyms,
            ctx.broker.config.static_keys)}
    if resource.resource_type == RESOURCE_BROKER:
        return {**result, "configs": _broker_configs(ctx, keys, include_synonyms)}
    if resource.resource_type == RESOURCE_BROKER_LOGGER:
        try:
            loggers.check_node(resource.resource_name, ctx.node_id)
        except loggers.LoggerError as exc:
            return {**result, "error_code": ErrorCode.invalid_request, "error_message": str(exc)}
        return {**result, "configs": [
            _entry(name, level, SOURCE_DYNAMIC_BROKER_LOGGER, int(topic_config.ConfigType.STRING))
            for name, level in loggers.loggers().items() if not keys or name in keys]}
    return {**result, "error_code": ErrorCode.invalid_request,
            "error_message": f"unsupported resource type {resource.resource_type}"}


@handles(ApiKey.DESCRIBE_CONFIGS)
async def describe_configs(ctx: RequestContext, body) -> dict:
    synonyms = bool(getattr(body, "include_synonyms", False))
    return {"throttle_time": 0,
            "results": [_describe_one(ctx, r, synonyms) for r in body.resources]}


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
    names = [op.name for op in resource.configs]
    if len(set(names)) != len(names):
        # Kafka rejects the whole resource before applying anything.
        return {**result, "error_code": ErrorCode.invalid_request,
                "error_message": "Error due to duplicate config keys"}
    nulls = [op.name for op in resource.configs
             if op.config_operation != OP_DELETE and op.value is None]
    if nulls:
        return {**result, "error_code": ErrorCode.invalid_request,
                "error_message": "Null value not supported for : " + ", ".join(nulls)}
    if resource.resource_type == RESOURCE_BROKER_LOGGER:
        try:
            loggers.check_node(resource.resource_name, ctx.node_id)
            loggers.validate(resource.configs)
        except loggers.LoggerError as exc:
            code = ErrorCode.invalid_config if exc.invalid_config else ErrorCode.invalid_request
            return {**result, "error_code": code, "error_message": str(exc)}
        if not validate_only:
            loggers.apply(resource.configs)
        return result
    if resource.resource_type != RESOURCE_TOPIC:
        return {**result, "error_code": ErrorCode.invalid_request,
                "error_message": "only topic configs can be altered"}
    info = ctx.broker.topic(resource.resource_name)
    if info is None:
        return _unknown_topic(result, resource.resource_name)
    try:
        updated = _apply_ops(info.configs, resource.configs)
    except topic_config.InvalidConfig as exc:
        return {**result, "error_code": ErrorCode.invalid_config, "error_message": str(exc)}
    return _replace_topic_configs(ctx, info.name, updated, result, validate_only)


def _unknown_topic(result: dict, name: str) -> dict:
    return {**result, "error_code": ErrorCode.unknown_topic_or_partition,
            "error_message": f"Topic {name} does not exist"}


def _replace_topic_configs(ctx: RequestContext, name: str, configs: dict[str, str | None],
                           result: dict, validate_only: bool) -> dict:
    """`configs` become all of the topic's overrides once valid (INVALID_CONFIG naming the
    key otherwise); nothing is stored with `validate_only`."""
    try:
        updated = topic_config.validate_topic_configs(configs)
    except topic_config.InvalidConfig as exc:
        return {**result, "error_code": ErrorCode.invalid_config, "error_message": str(exc)}
    if not validate_only:
        ctx.broker.store.alter_topic_configs(name, updated)
    return result


@handles(ApiKey.INCREMENTAL_ALTER_CONFIGS)
async def incremental_alter_configs(ctx: RequestContext, body) -> dict:
    return {"throttle_time": 0,
            "responses": [_alter_one(ctx, r, body.validate_only) for r in body.resources]}


def _alter_legacy_one(ctx: RequestContext, resource, validate_only: bool) -> dict:
    """AlterConfigs v0-2: the given set replaces all of the topic's configs (keys left out
    return to their defaults), as Kafka's legacy API does."""
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
        return _unknown_topic(result, resource.resource_name)
    names = [c.name for c in resource.configs]
    if len(set(names)) != len(names):
        return {**result, "error_code": ErrorCode.invalid_request,
                "error_message": "Error due to duplicate config keys"}
    return _replace_topic_configs(ctx, info.name, {c.name: c.value for c in resource.configs},
                                  result, validate_only)


@handles(ApiKey.ALTER_CONFIGS)
async def alter_configs(ctx: RequestContext, body) -> dict:
    return {"throttle_time": 0,
            "responses": [_alter_legacy_one(ctx, r, body.validate_only) for r in body.resources]}
