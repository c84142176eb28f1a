"""GROUP (type 32) and CLIENT_METRICS (type 16) config resources (issue 15), as Kafka 4
keeps them: overrides stored per resource name (storage.resource_configs), for any name,
whether or not such a group exists yet.

GROUP: Kafka's GroupConfig keys that apply to onceflow's consumer groups (KIP-848):
consumer.session.timeout.ms and consumer.heartbeat.interval.ms, bounded by the broker's
group.consumer.{min,max}.{session.timeout,heartbeat.interval}.ms and the session longer
than the interval; the consumer group coordinator reads them per group. Kafka's share.* and
streams.* group keys are left out (onceflow has no share or streams groups): naming one is
"Unknown group config name". Describe lists each key with the group's value
(GROUP_CONFIG) or the broker's default (DEFAULT_CONFIG).

CLIENT_METRICS (KIP-714): subscriptions with metrics, interval.ms and match, validated
with Kafka's rules and messages and described as stored (CLIENT_METRICS_CONFIG). onceflow
has no telemetry push (GetTelemetrySubscriptions / PushTelemetry), so subscriptions are
kept for tools, nothing more. A resource whose last key is deleted is gone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from onceflow.broker.config import BrokerConfig

RESOURCE_CLIENT_METRICS = 16
RESOURCE_GROUP = 32

SOURCE_DEFAULT = 5
SOURCE_CLIENT_METRICS = 7
SOURCE_GROUP = 8
TYPE_INT, TYPE_LIST = 3, 7

INT_MIN, INT_MAX = -(2**31), 2**31 - 1

# GroupConfig key -> the BrokerConfig field of its broker-wide default.
GROUP_KEYS = {
    "consumer.session.timeout.ms": "consumer_group_session_timeout_ms",
    "consumer.heartbeat.interval.ms": "consumer_group_heartbeat_interval_ms",
}
CLIENT_METRICS_KEYS = {"metrics": TYPE_LIST, "interval.ms": TYPE_INT, "match": TYPE_LIST}
CLIENT_METRICS_INTERVAL_MS_MIN, CLIENT_METRICS_INTERVAL_MS_MAX = 100, 3_600_000
CLIENT_MATCH_PARAMS = frozenset({"client_instance_id", "client_id", "client_software_name",
                                 "client_software_version", "client_source_address",
                                 "client_source_port"})


class ResourceConfigError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def key_type(resource_type: int, key: str) -> int | None:
    if resource_type == RESOURCE_GROUP:
        return TYPE_INT if key in GROUP_KEYS else None
    return CLIENT_METRICS_KEYS.get(key)


def check_name(resource_type: int, name: str, describe: bool) -> None:
    """Kafka's refusals of an empty resource name."""
    if name:
        return
    if resource_type == RESOURCE_GROUP:
        message = ("Group name must not be empty" if describe
                   else "Default group resources are not allowed.")
    else:
        message = ("Client metrics subscription name must not be empty" if describe
                   else "Subscription name can't be empty")
    raise ResourceConfigError(ErrorCode.invalid_request, message)


def _int(key: str, value: str) -> int:
    text = value.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", text) or not INT_MIN <= int(text) <= INT_MAX:
        raise ResourceConfigError(ErrorCode.invalid_config,
                                  f"Invalid value {value} for configuration {key}: "
                                  "Not a number of type INT")
    return int(text)


def validate_group(configs: Mapping[str, str], config: BrokerConfig) -> None:
    """Kafka's GroupConfig.validate over the group's whole new set (INVALID_CONFIG)."""
    for key in configs:
        if key not in GROUP_KEYS:
            raise ResourceConfigError(ErrorCode.invalid_config,
                                      f"Unknown group config name: {key}")
    values = {key: getattr(config, field) for key, field in GROUP_KEYS.items()}
    for key, value in configs.items():
        values[key] = _int(key, value)
        if values[key] < 1:
            raise ResourceConfigError(ErrorCode.invalid_config,
                                      f"Invalid value {value} for configuration {key}: "
                                      "Value must be at least 1")
    interval = values["consumer.heartbeat.interval.ms"]
    session = values["consumer.session.timeout.ms"]
    bounds = (
        (interval, "consumer.heartbeat.interval.ms", "heartbeat.interval.ms",
         config.consumer_group_min_heartbeat_interval_ms,
         config.consumer_group_max_heartbeat_interval_ms),
        (session, "consumer.session.timeout.ms", "session.timeout.ms",
         config.consumer_group_min_session_timeout_ms,
         config.consumer_group_max_session_timeout_ms),
    )
    for value, key, broker_suffix, low, high in bounds:
        if value < low:
            raise ResourceConfigError(ErrorCode.invalid_config, f"{key} must be greater than "
                                      f"or equal to group.consumer.min.{broker_suffix}")
        if value > high:
            raise ResourceConfigError(ErrorCode.invalid_config, f"{key} must be less than or "
                                      f"equal to group.consumer.max.{broker_suffix}")
    if session <= interval:
        raise ResourceConfigError(ErrorCode.invalid_config, "consumer.session.timeout.ms must "
                                  "be greater than consumer.heartbeat.interval.ms")


def validate_client_metrics(configs: Mapping[str, str]) -> None:
    """Kafka's ClientMetricsConfigs.validate over the subscription's whole new set."""
    for key in configs:
        if key not in CLIENT_METRICS_KEYS:
            raise ResourceConfigError(ErrorCode.invalid_request,
                                      f"Unknown client metrics configuration: {key}")
    if "interval.ms" in configs:
        interval = _int("interval.ms", configs["interval.ms"])
        if not CLIENT_METRICS_INTERVAL_MS_MIN <= interval <= CLIENT_METRICS_INTERVAL_MS_MAX:
            raise ResourceConfigError(
                ErrorCode.invalid_request, f"Invalid value {interval} for interval.ms, "
                "interval must be between 100 and 3600000 (1 hour)")
    for pattern in _list(configs.get("match", "")):
        parts = pattern.split("=")
        if len(parts) != 2 or parts[0].strip() not in CLIENT_MATCH_PARAMS:
            raise ResourceConfigError(ErrorCode.invalid_config,
                                      f"Illegal client matching pattern: {pattern}")
        try:
            re.compile(parts[1].strip())
        except re.error:
            raise ResourceConfigError(ErrorCode.invalid_config,
                                      f"Illegal client matching pattern: {pattern}") from None


def _list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def validate(resource_type: int, configs: Mapping[str, str], config: BrokerConfig) -> None:
    if resource_type == RESOURCE_GROUP:
        validate_group(configs, config)
    else:
        validate_client_metrics(configs)


def check_op(resource_type: int, key: str, operation: int) -> None:
    """APPEND (2) / SUBTRACT (3) only on LIST keys (Kafka's controller refuses the rest)."""
    if operation in (2, 3) and key_type(resource_type, key) != TYPE_LIST:
        verb = "APPEND to" if operation == 2 else "SUBTRACT from"
        raise ResourceConfigError(ErrorCode.invalid_config,
                                  f"Can't {verb} key {key} because its type is not LIST.")


def describe(resource_type: int, stored: Mapping[str, str], config: BrokerConfig, keys,
             include_synonyms: bool) -> list[tuple[str, str | None, int, int, list]]:
    """(name, value, source, config_type, synonyms) of each entry Kafka lists."""
    entries = []
    if resource_type == RESOURCE_CLIENT_METRICS:
        for key, value in stored.items():
            if not keys or key in keys:
                entries.append((key, value, SOURCE_CLIENT_METRICS, 0, []))
        return entries
    for key, field in GROUP_KEYS.items():
        if keys and key not in keys:
            continue
        value, source = ((stored[key], SOURCE_GROUP) if key in stored
                         else (str(getattr(config, field)), SOURCE_DEFAULT))
        synonyms = [(key, value, source)] if include_synonyms else []
        entries.append((key, value, source, TYPE_INT, synonyms))
    return entries
