"""Topic configs: Kafka's names, types, defaults and validation, and the `LogConfig` they make.

`TOPIC_CONFIGS` is the one table of every topic-level config a Kafka 4.x broker knows (the
facts - names, types, defaults, valid ranges - follow Apache Kafka's LogConfig/TopicConfig).
DescribeConfigs lists it; CreateTopics/AlterConfigs validate against it through
`validate_topic_configs`, which raises `InvalidConfigError` (the broker answers INVALID_CONFIG)
for an unknown name or a bad value. `LogConfig.from_topic_configs` layers Kafka's defaults, the
broker's overrides and the topic's configs, and keeps the fields storage and the produce path
use, retention and the log cleaner (storage/cleaner.py) use. Configs the broker accepts but
does not act on (remote storage, throttling, flush intervals, preallocation) are validated
and reported, nothing more.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from onceflow.storage.layout import InvalidConfigError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # Java int: Kafka INT configs
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1  # Java long: Kafka LONG configs
_INTEGER = re.compile(r"[+-]?[0-9]+")  # what Java's parseInt/parseLong accept

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
INTERNAL_SEGMENT_BYTES = "internal.segment.bytes"  # Kafka 4's test-only override, not listed


class ConfigType(enum.IntEnum):
    """Values are DescribeConfigs' `config_type` ids (Kafka's ConfigResource types)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One topic config: how DescribeConfigs reports it and how a value is checked."""

    name: str
    type: ConfigType
    default: str  # as Kafka reports it (strings, lists comma-separated)
    check: Callable[[Any], str | None] | None = None  # returns why a parsed value is invalid


def at_least(low: int | float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"Value must be at least {low}"


def between(low: int | float, high: int | float) -> Callable[[Any], str | None]:
    return lambda v: (
        None if low <= v <= high else f"Value must be no less than {low} and no more than {high}"
    )


def one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"String must be one of: {', '.join(choices)}"


def subset_of(*choices: str) -> Callable[[Any], str | None]:
    def check(values: list[str]) -> str | None:
        bad = [v for v in values if v not in choices]
        return f"Invalid value {bad[0]}; must be in {list(choices)}" if bad else None

    return check


def gzip_level(v: int) -> str | None:
    return None if v == -1 or 1 <= v <= 9 else "Value must be between 1 and 9, or -1 (default)"


_B, _I, _L, _D, _S, _LI = (
    ConfigType.BOOLEAN,
    ConfigType.INT,
    ConfigType.LONG,
    ConfigType.DOUBLE,
    ConfigType.STRING,
    ConfigType.LIST,
)
_KEYS = [
    ConfigKey("cleanup.policy", _LI, CLEANUP_DELETE, subset_of(CLEANUP_COMPACT, CLEANUP_DELETE)),
    ConfigKey("compression.gzip.level", _I, "-1", gzip_level),
    ConfigKey("compression.lz4.level", _I, "9", between(1, 17)),
    ConfigKey("compression.type", _S, "producer", one_of(*COMPRESSION_TYPES)),
    ConfigKey("compression.zstd.level", _I, "3", between(-131072, 22)),
    ConfigKey("delete.retention.ms", _L, "86400000", at_least(0)),
    ConfigKey("file.delete.delay.ms", _L, "60000", at_least(0)),
    ConfigKey("flush.messages", _L, str(LONG_MAX), at_least(1)),
    ConfigKey("flush.ms", _L, str(LONG_MAX), at_least(0)),
    ConfigKey("follower.replication.throttled.replicas", _LI, ""),
    ConfigKey("index.interval.bytes", _I, "4096", at_least(0)),
    ConfigKey("leader.replication.throttled.replicas", _LI, ""),
    ConfigKey("local.retention.bytes", _L, "-2", at_least(-2)),
    ConfigKey("local.retention.ms", _L, "-2", at_least(-2)),
    ConfigKey("max.compaction.lag.ms", _L, str(LONG_MAX), at_least(1)),
    ConfigKey("max.message.bytes", _I, "1048588", at_least(0)),
    ConfigKey("message.downconversion.enable", _B, "true"),
    ConfigKey("message.timestamp.after.max.ms", _L, "3600000", at_least(0)),
    ConfigKey("message.timestamp.before.max.ms", _L, str(LONG_MAX), at_least(0)),
    ConfigKey("message.timestamp.type", _S, CREATE_TIME, one_of(CREATE_TIME, LOG_APPEND_TIME)),
    ConfigKey("min.cleanable.dirty.ratio", _D, "0.5", between(0, 1)),
    ConfigKey("min.compaction.lag.ms", _L, "0", at_least(0)),
    ConfigKey("min.insync.replicas", _I, "1", at_least(1)),
    ConfigKey("preallocate", _B, "false"),
    ConfigKey("remote.log.copy.disable", _B, "false"),
    ConfigKey("remote.log.delete.on.disable", _B, "false"),
    ConfigKey("remote.storage.enable", _B, "false"),
    ConfigKey("retention.bytes", _L, "-1"),
    ConfigKey("retention.ms", _L, "604800000", at_least(-1)),
    ConfigKey("segment.bytes", _I, "1073741824", at_least(1024 * 1024)),
    ConfigKey("segment.index.bytes", _I, "10485760", at_least(4)),
    ConfigKey("segment.jitter.ms", _L, "0", at_least(0)),
    ConfigKey("segment.ms", _L, "604800000", at_least(1)),
    ConfigKey("unclean.leader.election.enable", _B, "false"),
]
TOPIC_CONFIGS: Mapping[str, ConfigKey] = {key.name: key for key in _KEYS}
_INTERNAL_KEYS = {INTERNAL_SEGMENT_BYTES: ConfigKey(INTERNAL_SEGMENT_BYTES, _I, "", at_least(1))}


def topic_config_defaults() -> dict[str, str]:
    """Kafka's default of every listed topic config (DescribeConfigs source DEFAULT_CONFIG)."""
    return {name: key.default for name, key in TOPIC_CONFIGS.items()}


TOPIC_CONFIG_DEFAULTS: Mapping[str, str] = MappingProxyType(topic_config_defaults())
InvalidConfig = InvalidConfigError  # the name the broker's config handlers use


def _parse(key: ConfigKey, raw: str) -> Any:
    """A config value as Kafka's ConfigDef would parse it (values are trimmed first)."""
    text = raw.strip()
    if key.type is ConfigType.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise ValueError("Expected value to be either true or false")
        return text.lower() == "true"
    if key.type in (ConfigType.INT, ConfigType.LONG):
        low, high = (INT_MIN, INT_MAX) if key.type is ConfigType.INT else (LONG_MIN, LONG_MAX)
        if not _INTEGER.fullmatch(text) or not low <= int(text) <= high:
            raise ValueError(f"Not a number of type {key.type.name}")
        return int(text)
    if key.type is ConfigType.DOUBLE:
        return float(text)
    if key.type is ConfigType.LIST:
        return [item.strip() for item in text.split(",")] if text else []
    return text


def parse_topic_config(name: str, raw: str) -> Any:
    """The parsed value of one topic config; raises InvalidConfigError."""
    key = TOPIC_CONFIGS.get(name) or _INTERNAL_KEYS.get(name)
    if key is None:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    if not isinstance(raw, str):
        raise InvalidConfigError(f"Invalid value {raw!r} for configuration {name}: not a string")
    try:
        value = _parse(key, raw)
    except ValueError as exc:
        raise InvalidConfigError(f"Invalid value {raw} for configuration {name}: {exc}") from None
    problem = key.check(value) if key.check else None
    if problem is not None:
        raise InvalidConfigError(f"Invalid value {raw} for configuration {name}: {problem}")
    return value


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Checks topic config overrides (None values are dropped: "use the default").
    Returns them unchanged otherwise; raises InvalidConfigError."""
    out = {name: raw for name, raw in configs.items() if raw is not None}
    parsed = {name: parse_topic_config(name, raw) for name, raw in out.items()}
    merged = {name: _parse(key, key.default) for name, key in TOPIC_CONFIGS.items()} | parsed
    if merged["min.compaction.lag.ms"] > merged["max.compaction.lag.ms"]:
        raise InvalidConfigError(
            "conflict topic config setting min.compaction.lag.ms > max.compaction.lag.ms"
        )
    return out


@dataclass(frozen=True, slots=True)
class LogConfig:
    """What storage and the produce path use, built from topic configs (Kafka names in
    comments). Frozen: altering configs swaps the whole object, which threads see atomically.
    Constructing one directly (tests) skips Kafka's minimums, e.g. tiny `segment_bytes`."""

    segment_bytes: int = 1073741824  # segment.bytes
    segment_ms: int = 604800000  # segment.ms
    retention_bytes: int = -1  # retention.bytes (negative = no size limit)
    retention_ms: int = 604800000  # retention.ms (-1 = no time limit)
    max_message_bytes: int = 1048588  # max.message.bytes
    index_interval_bytes: int = 4096  # index.interval.bytes
    message_timestamp_type: str = CREATE_TIME  # message.timestamp.type
    cleanup_policy: str = CLEANUP_DELETE  # cleanup.policy, comma-separated
    segment_index_bytes: int = 10485760  # segment.index.bytes (bounds index entries)
    message_timestamp_before_max_ms: int = LONG_MAX  # message.timestamp.before.max.ms
    message_timestamp_after_max_ms: int = 3600000  # message.timestamp.after.max.ms
    min_insync_replicas: int = 1  # min.insync.replicas
    compression_type: str = "producer"  # compression.type
    segment_jitter_ms: int = 0  # segment.jitter.ms
    delete_retention_ms: int = 86400000  # delete.retention.ms (tombstones, markers)
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = LONG_MAX  # max.compaction.lag.ms

    @property
    def deletes(self) -> bool:
        """Retention applies (cleanup.policy contains delete)."""
        return CLEANUP_DELETE in self.cleanup_policy.split(",")

    @property
    def compacts(self) -> bool:
        return CLEANUP_COMPACT in self.cleanup_policy.split(",")

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @classmethod
    def from_topic_configs(
        cls, configs: Mapping[str, str | None], defaults: Mapping[str, str] | None = None
    ) -> LogConfig:
        """Kafka's defaults, overridden by `defaults` (the broker's log.* settings, under their
        topic config names), overridden by the topic's `configs`. Raises InvalidConfigError."""
        layered = topic_config_defaults() | validate_topic_configs(defaults or {})
        layered |= validate_topic_configs(configs)
        values = {name: parse_topic_config(name, raw) for name, raw in layered.items()}
        segment_bytes = values.get(INTERNAL_SEGMENT_BYTES, values["segment.bytes"])
        kwargs = {f.name: values[_KAFKA_NAME[f.name]] for f in fields(cls) if f.name in _KAFKA_NAME}
        kwargs["cleanup_policy"] = ",".join(values["cleanup.policy"])
        return cls(segment_bytes=segment_bytes, **kwargs)


_KAFKA_NAME = {
    "segment_ms": "segment.ms",
    "retention_bytes": "retention.bytes",
    "retention_ms": "retention.ms",
    "max_message_bytes": "max.message.bytes",
    "index_interval_bytes": "index.interval.bytes",
    "message_timestamp_type": "message.timestamp.type",
    "segment_index_bytes": "segment.index.bytes",
    "message_timestamp_before_max_ms": "message.timestamp.before.max.ms",
    "message_timestamp_after_max_ms": "message.timestamp.after.max.ms",
    "min_insync_replicas": "min.insync.replicas",
    "compression_type": "compression.type",
    "segment_jitter_ms": "segment.jitter.ms",
    "delete_retention_ms": "delete.retention.ms",
    "min_cleanable_dirty_ratio": "min.cleanable.dirty.ratio",
    "min_compaction_lag_ms": "min.compaction.lag.ms",
    "max_compaction_lag_ms": "max.compaction.lag.ms",
}
