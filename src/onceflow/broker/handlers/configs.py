"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: TOPIC, BROKER and
BROKER_LOGGER resources.

Topic configs are Kafka's names with Kafka's defaults and types (storage.config). A value set
on the topic reports source DYNAMIC_TOPIC_CONFIG; otherwise the broker's log.* default
from the highest layer that sets it (the node's dynamic config, the cluster-wide dynamic
default, --config: DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
STATIC_BROKER_CONFIG), else DEFAULT_CONFIG; with include_synonyms each entry lists the
layers below it as Kafka does. BROKER resources: broker_configs.py (dynamic keys alterable,
the rest read_only); keys naming a password are sensitive and their value is never sent.
AlterConfigs (legacy) replaces all of a resource's configs with the given set.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.config_file import (
    DYNAMIC_BROKER_KEYS,
    LOG_DEFAULT_KEYS,
    effective_broker_configs,
    log_defaults_of,
)
from onceflow.broker.handlers import (
    ApiKey,
    RequestContext,
    broker_configs,
    config_docs,
    handles,
    loggers,
    resource_configs,
)
from onceflow.broker.handlers.broker_configs import BrokerConfigError, Layers
from onceflow.broker.handlers.resource_configs import (
    RESOURCE_CLIENT_METRICS,
    RESOURCE_GROUP,
    ResourceConfigError,
)
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage import config as topic_config
from onceflow.storage.resource_configs import TooManyConfigs
from onceflow.storage.store import TopicInfo

RESOURCE_TOPIC = 2
RESOURCE_BROKER = broker_configs.RESOURCE_BROKER
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


def layers_of(ctx: RequestContext) -> Layers:
    """The broker config layers the connection's node sees."""
    configs = ctx.broker.resource_configs
    return Layers(configs.get(RESOURCE_BROKER, str(ctx.node_id)),
                  configs.get(RESOURCE_BROKER, ""), ctx.broker.config)


def _broker_default_of(layers: Layers, name: str) -> tuple[str, int] | None:
    """A topic config's default from the broker layers: (value in the topic's unit, source)."""
    for values, source in ((layers.node, broker_configs.SOURCE_DYNAMIC_BROKER),
                           (layers.default, broker_configs.SOURCE_DYNAMIC_DEFAULT_BROKER)):
        value = log_defaults_of(values).get(name)
        if value is not None:
            return value, source
    value = dict(layers.config.log_defaults).get(name)
    return None if value is None else (value, SOURCE_STATIC_BROKER)


def describe_topic_configs(info: TopicInfo, keys, layers: Layers,
                           include_synonyms: bool = False) -> list[dict]:
    """Each topic config: the topic's own (DYNAMIC_TOPIC_CONFIG), else the broker layers'
    default (DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG),
    else Kafka's (DEFAULT_CONFIG); synonyms: the topic's value, then the broker layers."""
    entries = []
    for name, default in topic_config.TOPIC_CONFIG_DEFAULTS.items():
        if keys and name not in keys:
            continue
        config_type = int(topic_config.TOPIC_CONFIGS[name].type)
        own = info.configs.get(name)
        synonyms = []
        if include_synonyms:
            if own is not None:
                synonyms.append(_synonym(name, own, SOURCE_DYNAMIC_TOPIC))
            synonyms += [_synonym(*s) for s in layers.topic_synonyms(name)]
        inherited = _broker_default_of(layers, name)
        if own is not None:
            value, source = own, SOURCE_DYNAMIC_TOPIC
        elif inherited is not None:
            value, source = inherited
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


def _broker_configs(ctx: RequestContext, name: str, keys, include_synonyms: bool) -> list[dict]:
    """A BROKER resource: every key of this node ("<id>") with its highest layer, or the
    cluster-wide dynamic default's keys only (""), as Kafka describes them."""
    broker_configs.check_describe_name(name, ctx.node_id)
    layers = layers_of(ctx)
    per_broker = name != ""
    effective = effective_broker_configs(ctx.broker.config)
    own = _node_identity(ctx) if per_broker else {}
    names = broker_configs.broker_keys(ctx.broker.config) if per_broker else list(layers.default)
    names[1:1] = [key for key in own if key not in names]
    entries = []
    for key in names:
        if keys and key not in keys:
            continue
        found = layers.synonyms(key, per_broker)
        if key in own:
            found = [(key, own[key], SOURCE_STATIC_BROKER)]
        elif not found and key in effective:  # a broker key without a layer: its default
            found = [(key, effective[key][0], SOURCE_DEFAULT)]
        value, source = (found[0][1], found[0][2]) if found else (None, SOURCE_DEFAULT)
        synonyms = [_synonym(*s) for s in found] if include_synonyms else []
        entries.append(_entry(key, value, source, broker_config_type(key, value), synonyms,
                              read_only=key not in DYNAMIC_BROKER_KEYS))
    return entries


def _node_identity(ctx: RequestContext) -> dict[str, str]:
    """The read-only keys that say who and where this node is, as a Kafka 4.x (KRaft) broker
    lists them: its id, roles, listeners (bound) and advertised listeners (what Metadata
    answers), the protocol map and the log directory."""
    config = ctx.broker.config
    node = ctx.broker.cluster.nodes[ctx.node_id]
    listeners = config.listener_list()

    def bound(listener) -> int:
        return listener.port + ctx.node_id if listener.port else node.endpoint(listener.name)[1]
    return {
        "broker.id": str(ctx.node_id),
        "node.id": str(ctx.node_id),
        "process.roles": "broker",
        "listeners": ",".join(f"{lsn.name}://{lsn.host}:{bound(lsn)}" for lsn in listeners),
        "advertised.listeners": ",".join(
            "{}://{}:{}".format(lsn.name, *node.endpoint(lsn.name)) for lsn in listeners),
        "listener.security.protocol.map": ",".join(
            f"{lsn.name}:{lsn.protocol}" for lsn in listeners),
        "log.dirs": str(config.data_dir),
    }


def _denied(ctx: RequestContext, resource, operation: Operation) -> ErrorCode | None:
    """Kafka's check: the topic's or the cluster's (broker resources) DescribeConfigs or
    AlterConfigs (issue 13)."""
    if resource.resource_type == RESOURCE_TOPIC:
        if not ctx.authorized(operation, ResourceType.TOPIC, resource.resource_name):
            return ErrorCode.topic_authorization_failed
    elif resource.resource_type == RESOURCE_GROUP:
        if not ctx.authorized(operation, ResourceType.GROUP, resource.resource_name):
            return ErrorCode.group_authorization_failed
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
            info, keys, layers_of(ctx), include_synonyms)}
    if resource.resource_type == RESOURCE_BROKER:
        try:
            configs = _broker_configs(ctx, resource.resource_name, keys, include_synonyms)
        except BrokerConfigError as exc:
            return {**result, "error_code": ErrorCode.invalid_request, "error_message": str(exc)}
        return {**result, "configs": configs}
    if resource.resource_type == RESOURCE_BROKER_LOGGER:
        try:
            loggers.check_node(resource.resource_name, ctx.node_id)
        except loggers.LoggerError as exc:
            return {**result, "error_code": ErrorCode.invalid_request, "error_message": str(exc)}
        return {**result, "configs": [
            _entry(name, level, SOURCE_DYNAMIC_BROKER_LOGGER, int(topic_config.ConfigType.STRING))
            for name, level in loggers.loggers().items() if not keys or name in keys]}
    if resource.resource_type in (RESOURCE_GROUP, RESOURCE_CLIENT_METRICS):
        return {**result, **_describe_resource(ctx, resource, include_synonyms)}
    return {**result, "error_code": ErrorCode.invalid_request,
            "error_message": f"Unsupported resource type: {resource.resource_type}"}


def _describe_resource(ctx: RequestContext, resource, include_synonyms: bool) -> dict:
    """A GROUP or CLIENT_METRICS resource (resource_configs.py)."""
    kind, name = resource.resource_type, resource.resource_name
    try:
        resource_configs.check_name(kind, name, describe=True)
    except ResourceConfigError as exc:
        return {"error_code": exc.code, "error_message": str(exc)}
    stored = ctx.broker.resource_configs.get(kind, name)
    entries = resource_configs.describe(kind, stored, ctx.broker.config,
                                        resource.configuration_keys, include_synonyms)
    return {"configs": [_entry(key, value, source, config_type,
                               [_synonym(*s) for s in synonyms])
                        for key, value, source, config_type, synonyms in entries]}


def _alter_resource(ctx: RequestContext, resource, result: dict, validate_only: bool,
                    incremental: bool) -> dict:
    """A GROUP or CLIENT_METRICS resource: the new set validated whole, then stored."""
    kind, name = resource.resource_type, resource.resource_name
    try:
        resource_configs.check_name(kind, name, describe=False)
        if incremental:
            for op in resource.configs:
                resource_configs.check_op(kind, op.name, op.config_operation)
            updated = _apply_ops(ctx.broker.resource_configs.get(kind, name), resource.configs,
                                 lambda _key: "")
        else:
            updated = {c.name: c.value for c in resource.configs}
        resource_configs.validate(kind, updated, ctx.broker.config)
        if not validate_only:
            ctx.broker.resource_configs.replace(kind, name, updated)
    except ResourceConfigError as exc:
        return {**result, "error_code": exc.code, "error_message": str(exc)}
    except topic_config.InvalidConfig as exc:  # an unknown operation
        return {**result, "error_code": ErrorCode.invalid_request, "error_message": str(exc)}
    except TooManyConfigs as exc:
        return {**result, "error_code": ErrorCode.policy_violation, "error_message": str(exc)}
    return result


@handles(ApiKey.DESCRIBE_CONFIGS)
async def describe_configs(ctx: RequestContext, body) -> dict:
    synonyms = bool(getattr(body, "include_synonyms", False))
    results = [_describe_one(ctx, r, synonyms) for r in body.resources]
    if getattr(body, "include_documentation", False):  # v3+
        for result in results:
            docs = _DOCS.get(result["resource_type"], {})
            for entry in result["configs"]:
                entry["documentation"] = docs.get(entry["name"])
    return {"throttle_time": 0, "results": results}


# DescribeConfigs documentation per resource type (BROKER_LOGGER entries have none).
_DOCS = {RESOURCE_TOPIC: config_docs.TOPIC_DOCS, RESOURCE_BROKER: config_docs.BROKER_DOCS,
         RESOURCE_GROUP: config_docs.GROUP_DOCS,
         RESOURCE_CLIENT_METRICS: config_docs.CLIENT_METRICS_DOCS}


def _apply_ops(current: dict[str, str], ops, default_of=None) -> dict[str, str]:
    """The resource's configs after SET / DELETE / APPEND / SUBTRACT; APPEND and SUBTRACT
    start from the current value, else `default_of(name)` (a topic's default)."""
    default_of = default_of or (lambda key: topic_config.TOPIC_CONFIG_DEFAULTS.get(key, ""))
    updated = dict(current)
    for op in ops:
        if op.config_operation == OP_SET:
            updated[op.name] = op.value
        elif op.config_operation == OP_DELETE:
            updated.pop(op.name, None)
        elif op.config_operation in (OP_APPEND, OP_SUBTRACT):
            base = updated.get(op.name, default_of(op.name) or "")
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
        return _alter_not_topic(ctx, resource, result, validate_only, incremental=True)
    info = ctx.broker.topic(resource.resource_name)
    if info is None:
        return _unknown_topic(result, resource.resource_name)
    try:
        updated = _apply_ops(info.configs, resource.configs)
    except topic_config.InvalidConfig as exc:
        return {**result, "error_code": ErrorCode.invalid_config, "error_message": str(exc)}
    return _replace_topic_configs(ctx, info.name, updated, result, validate_only)


def _alter_broker(ctx: RequestContext, resource, result: dict, validate_only: bool,
                  incremental: bool) -> dict:
    """A BROKER resource ("<this node's id>" or "" for the cluster default): the dynamic
    keys only, values checked, stored durably, then applied (Kafka's ConfigAdminManager)."""
    name = resource.resource_name
    current = ctx.broker.resource_configs.get(RESOURCE_BROKER, name)
    try:
        broker_configs.check_alter_name(name, ctx.node_id)
        if incremental:
            layers = layers_of(ctx)
            for op in resource.configs:
                _check_list_op(op, layers)
            updated = _apply_ops(current, resource.configs,
                                 lambda key: next(iter(layers.synonyms(key)), (0, ""))[1])
        else:
            updated = {c.name: c.value for c in resource.configs}
        broker_configs.validate_dynamic(updated, ctx.broker.config)
        _check_log_defaults(ctx, name, updated)
    except (BrokerConfigError, topic_config.InvalidConfig) as exc:
        return {**result, "error_code": ErrorCode.invalid_request, "error_message": str(exc)}
    if not validate_only:
        ctx.broker.resource_configs.replace(RESOURCE_BROKER, name, updated)
    return result


def _check_log_defaults(ctx: RequestContext, name: str, updated: dict[str, str]) -> None:
    """The log defaults the storage would follow must hold together (min.compaction.lag.ms
    not above max.compaction.lag.ms); InvalidConfig otherwise."""
    configs = ctx.broker.resource_configs
    default = updated if name == "" else configs.get(RESOURCE_BROKER, "")
    node = updated if name != "" else configs.get(RESOURCE_BROKER, str(ctx.node_id))
    topic_config.validate_topic_configs(
        dict(ctx.broker.config.log_defaults) | log_defaults_of(default) | log_defaults_of(node))


def _check_list_op(op, layers: Layers) -> None:
    """Kafka allows APPEND / SUBTRACT only on LIST keys (log.cleanup.policy here)."""
    if op.config_operation not in (OP_APPEND, OP_SUBTRACT):
        return
    if op.name not in DYNAMIC_BROKER_KEYS:
        raise BrokerConfigError(f"Unknown config name: {op.name}")
    if broker_config_type(op.name, None) != int(topic_config.ConfigType.LIST):
        verb = "append" if op.config_operation == OP_APPEND else "subtract"
        raise BrokerConfigError(f"Config value {verb} is not allowed for config key: {op.name}")


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
    names = [c.name for c in resource.configs]
    if len(set(names)) != len(names):
        return {**result, "error_code": ErrorCode.invalid_request,
                "error_message": "Error due to duplicate config keys"}
    if resource.resource_type in (RESOURCE_BROKER, RESOURCE_GROUP, RESOURCE_CLIENT_METRICS):
        nulls = [c.name for c in resource.configs if c.value is None]
        if nulls:
            return {**result, "error_code": ErrorCode.invalid_request,
                    "error_message": "Null value not supported for : " + ", ".join(nulls)}
    if resource.resource_type != RESOURCE_TOPIC:
        return _alter_not_topic(ctx, resource, result, validate_only, incremental=False)
    info = ctx.broker.topic(resource.resource_name)
    if info is None:
        return _unknown_topic(result, resource.resource_name)
    return _replace_topic_configs(ctx, info.name, {c.name: c.value for c in resource.configs},
                                  result, validate_only)


def _alter_not_topic(ctx: RequestContext, resource, result: dict, validate_only: bool,
                     incremental: bool) -> dict:
    """A BROKER, GROUP or CLIENT_METRICS resource, or INVALID_REQUEST for an unknown type
    (AlterConfigs and IncrementalAlterConfigs alike)."""
    if resource.resource_type == RESOURCE_BROKER:
        return _alter_broker(ctx, resource, result, validate_only, incremental=incremental)
    if resource.resource_type in (RESOURCE_GROUP, RESOURCE_CLIENT_METRICS):
        return _alter_resource(ctx, resource, result, validate_only, incremental=incremental)
    return {**result, "error_code": ErrorCode.invalid_request,
            "error_message": f"Unknown resource type {resource.resource_type}"}


@handles(ApiKey.ALTER_CONFIGS)
async def alter_configs(ctx: RequestContext, body) -> dict:
    return {"throttle_time": 0,
            "responses": [_alter_legacy_one(ctx, r, body.validate_only) for r in body.resources]}

