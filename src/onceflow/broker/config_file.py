"""`onceflow broker --config server.properties`: Kafka's broker keys read into a BrokerConfig.

Theory of operation. `parse_properties` reads the Java .properties syntax Kafka's files
use. `BROKER_KEYS` is the registry: each Kafka key the broker acts on, the BrokerConfig
field it sets and how its value parses; `LOG_DEFAULT_KEYS` maps the broker's `log.*`
defaults to the topic configs they default (`log.retention.hours` -> `retention.ms`), which
storage layers under every topic's own configs; `IGNORED_KEYS` are Kafka keys that mean
nothing here (one process, no controller quorum, no thread pools) and pass silently.
Anything else is named in one warning. A bad value fails the whole file with an error
naming the key, before anything starts. Flags given on the command line override the
file (the CLI passes them as `overrides`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from onceflow.broker.config import BrokerConfig
from onceflow.storage.config import InvalidConfig, parse_topic_config

logger = logging.getLogger(__name__)

CONFIG_FILE_BYTES_MAX = 1024 * 1024  # a properties file is small; refuse anything else


class ConfigFileError(ValueError):
    """The file cannot be used: unreadable, or a key with a bad value (named)."""


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties: `key=value`, `key: value` or `key value`; `#`/`!` comments;
    a trailing backslash continues the line; later keys win."""
    out: dict[str, str] = {}
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.lstrip()
        if not line or line[0] in "#!":
            continue
        while line.endswith("\\") and not line.endswith("\\\\"):
            line = line[:-1] + next(lines, "").lstrip()
        match = re.match(r"((?:\\.|[^=:\s\\])+)\s*[=:\s]\s*(.*)$", line)
        key, value = (match.group(1), match.group(2)) if match else (line, "")
        out[_unescape(key)] = _unescape(value.rstrip())
    return out


def _unescape(text: str) -> str:
    escapes = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
    return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(1)), text)


def _int(low: int = 0) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())
        if value < low:
            raise ValueError(f"must be at least {low}")
        return value
    return parse


def _bool(text: str) -> bool:
    if text.strip().lower() not in ("true", "false"):
        raise ValueError("must be true or false")
    return text.strip().lower() == "true"


def _positive_float(text: str) -> float:
    value = float(text.strip())
    if not value > 0:
        raise ValueError("must be more than 0")
    return value


def _listener(text: str, protocols: Mapping[str, str], controllers: set[str]) -> tuple[str, int]:
    """(host, port) of the first listener that is not a controller's; PLAINTEXT only."""
    for item in (part.strip() for part in text.split(",") if part.strip()):
        match = re.fullmatch(r"([A-Za-z0-9_]+)://(\[[^\]]*\]|[^:]*):([0-9]+)", item)
        if match is None:
            raise ValueError(f"{item!r} is not NAME://host:port")
        name, host, port = match.group(1), match.group(2).strip("[]"), int(match.group(3))
        if name in controllers:
            continue
        protocol = protocols.get(name, name)
        if protocol != "PLAINTEXT":
            raise ValueError(f"listener {name} uses {protocol}; only PLAINTEXT is served")
        return host or "0.0.0.0", port
    raise ValueError("no broker listener (every listener is a controller's)")


# Kafka key -> (BrokerConfig field, parser). Kafka's names; values as Kafka spells them.
BROKER_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "num.partitions": ("num_partitions", _int(1)),
    "default.replication.factor": ("default_replication_factor", _int(1)),
    "auto.create.topics.enable": ("auto_create_topics", _bool),
    "message.max.bytes": ("message_max_bytes", _int(0)),
    "socket.request.max.bytes": ("frame_bytes_max", _int(1)),
    "log.retention.check.interval.ms": ("retention_check_interval_ms", _int(1)),
    "log.flush.offset.checkpoint.interval.ms": ("recovery_checkpoint_interval_ms", _int(1)),
    "quota.window.num": ("quota_window_num", _int(1)),
    "quota.window.size.seconds": ("quota_window_size_seconds", _int(1)),
    "log.cleaner.enable": ("log_cleaner_enable", _bool),
    "log.max.open.files": ("log_max_open_files", _int(1)),  # onceflow's own key
    "log.cleaner.backoff.ms": ("log_cleaner_backoff_ms", _int(1)),
    "log.cleaner.dedupe.buffer.size": ("log_cleaner_dedupe_buffer_size", _int(1024)),
    "log.cleaner.io.max.bytes.per.second": ("log_cleaner_io_max_bytes_per_second",
                                            _positive_float),
    "max.incremental.fetch.session.cache.slots": ("fetch_session_cache_slots", _int(0)),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", _int(1)),
    "producer.id.expiration.check.interval.ms": ("producer_id_expiration_check_interval_ms",
                                                 _int(1)),
    "offsets.topic.num.partitions": ("offsets_topic_num_partitions", _int(1)),
    "offsets.topic.segment.bytes": ("offsets_topic_segment_bytes", _int(1)),
    "group.initial.rebalance.delay.ms": ("group_initial_rebalance_delay_ms", _int(0)),
    "group.min.session.timeout.ms": ("group_min_session_timeout_ms", _int(0)),
    "group.max.session.timeout.ms": ("group_max_session_timeout_ms", _int(0)),
    "transaction.state.log.num.partitions": ("transaction_state_num_partitions", _int(1)),
    "transaction.state.log.segment.bytes": ("transaction_state_segment_bytes", _int(1)),
    "transaction.max.timeout.ms": ("transaction_max_timeout_ms", _int(1)),
    "transaction.two.phase.commit.enable": ("transaction_two_phase_commit_enable", _bool),
    "transactional.id.expiration.ms": ("transactional_id_expiration_ms", _int(1)),
    "group.consumer.session.timeout.ms": ("consumer_group_session_timeout_ms", _int(1)),
    "group.consumer.heartbeat.interval.ms": ("consumer_group_heartbeat_interval_ms", _int(1)),
    "max.connections": ("max_connections", _int(0)),
    "max.connections.per.ip": ("max_connections_per_ip", _int(0)),
    "max.connections.per.ip.overrides": ("max_connections_per_ip_overrides", str.strip),
    "group.consumer.min.session.timeout.ms": ("consumer_group_min_session_timeout_ms", _int(1)),
    "group.consumer.max.session.timeout.ms": ("consumer_group_max_session_timeout_ms", _int(1)),
    "group.consumer.min.heartbeat.interval.ms": ("consumer_group_min_heartbeat_interval_ms",
                                                 _int(1)),
    "group.consumer.max.heartbeat.interval.ms": ("consumer_group_max_heartbeat_interval_ms",
                                                 _int(1)),
}
_MINUTES_MS, _HOURS_MS = 60_000, 3_600_000
# Broker log.* default -> (topic config, multiplier to its unit); the first of a group wins
# (Kafka: log.retention.ms over .minutes over .hours, log.roll.ms over .hours).
LOG_DEFAULT_KEYS: dict[str, tuple[str, int]] = {
    "log.retention.ms": ("retention.ms", 1),
    "log.retention.minutes": ("retention.ms", _MINUTES_MS),
    "log.retention.hours": ("retention.ms", _HOURS_MS),
    "log.retention.bytes": ("retention.bytes", 1),
    "log.segment.bytes": ("segment.bytes", 1),
    "log.roll.ms": ("segment.ms", 1),
    "log.roll.hours": ("segment.ms", _HOURS_MS),
    "log.roll.jitter.ms": ("segment.jitter.ms", 1),
    "log.roll.jitter.hours": ("segment.jitter.ms", _HOURS_MS),
    "log.cleanup.policy": ("cleanup.policy", 0),
    "log.cleaner.delete.retention.ms": ("delete.retention.ms", 1),
    "log.cleaner.min.cleanable.ratio": ("min.cleanable.dirty.ratio", 0),
    "log.cleaner.min.compaction.lag.ms": ("min.compaction.lag.ms", 1),
    "log.cleaner.max.compaction.lag.ms": ("max.compaction.lag.ms", 1),
    "log.index.interval.bytes": ("index.interval.bytes", 1),
    "log.index.size.max.bytes": ("segment.index.bytes", 1),
    "log.message.timestamp.type": ("message.timestamp.type", 0),
    "log.message.timestamp.before.max.ms": ("message.timestamp.before.max.ms", 1),
    "log.message.timestamp.after.max.ms": ("message.timestamp.after.max.ms", 1),
    "compression.type": ("compression.type", 0),
    "min.insync.replicas": ("min.insync.replicas", 1),
    "message.max.bytes": ("max.message.bytes", 1),
}
# Keys a running broker takes from (Incremental)AlterConfigs on a BROKER resource: Kafka's
# DynamicBrokerConfig.AllDynamicConfigs restricted to keys onceflow acts on. Every one is
# "cluster-wide" in Kafka's terms: settable for one node ("<id>") or as the cluster default
# (""). The log.* defaults reach storage at once (BrokerState); the rest are read through
# BrokerState.broker_config, whose users subscribe to changes.
DYNAMIC_BROKER_KEYS: dict[str, Callable[[str], Any]] = {
    **{key: (lambda text, key=key: _log_default_value(key, text)) for key in LOG_DEFAULT_KEYS},
    "producer.id.expiration.ms": _int(1),
    "max.connections": _int(0),
    "max.connections.per.ip": _int(0),
}
# Kafka's defaults of the dynamic keys that no BrokerConfig field carries.
DYNAMIC_KEY_DEFAULTS = {"max.connections": "2147483647", "max.connections.per.ip": "2147483647"}
# Handled by hand below (they set several fields or depend on each other).
_SPECIAL_KEYS = {"listeners", "advertised.listeners", "log.dirs", "log.dir",
                 "listener.security.protocol.map", "controller.listener.names",
                 "offsets.retention.minutes"}
# Kafka keys with no meaning for a single-process broker: accepted without a word.
IGNORED_KEYS = frozenset({
    "broker.id", "node.id", "process.roles", "controller.quorum.voters",
    "controller.quorum.bootstrap.servers", "inter.broker.listener.name",
    "num.network.threads", "num.io.threads", "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes", "num.recovery.threads.per.data.dir",
    "offsets.topic.replication.factor", "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr", "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr", "zookeeper.connect",
    "zookeeper.connection.timeout.ms", "log.flush.interval.messages", "log.flush.interval.ms",
    "log.cleaner.threads", "log.cleaner.io.buffer.size", "log.cleaner.io.buffer.load.factor",
})


def load_config_file(path: Path, overrides: Mapping[str, Any]) -> BrokerConfig:
    """The BrokerConfig of a server.properties, with `overrides` (BrokerConfig fields given
    as flags) on top. Raises ConfigFileError naming the file and key."""
    try:
        if path.stat().st_size > CONFIG_FILE_BYTES_MAX:
            raise ConfigFileError(f"{path}: larger than {CONFIG_FILE_BYTES_MAX} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc}") from None
    return config_from_properties(parse_properties(text), overrides, source=str(path))


def config_from_properties(props: Mapping[str, str], overrides: Mapping[str, Any],
                           source: str = "server.properties") -> BrokerConfig:
    fields: dict[str, Any] = {}
    for key, value in props.items():
        if key in BROKER_KEYS:
            name, parse = BROKER_KEYS[key]
            fields[name] = _parsed(source, key, value, parse)
    _special(props, fields, source)
    if "log.cleaner.backoff.ms" in props:  # the coordinators' compactor follows it too
        fields["offsets_compaction_interval_ms"] = fields["log_cleaner_backoff_ms"]
    log_defaults = _log_defaults(props, source)
    unknown = sorted(k for k in props if k not in BROKER_KEYS and k not in LOG_DEFAULT_KEYS
                     and k not in _SPECIAL_KEYS and k not in IGNORED_KEYS)
    if unknown:
        logger.warning("%s: unknown keys ignored: %s", source, ", ".join(unknown))
    fields |= dict(overrides)
    fields["log_defaults"] = tuple(sorted(log_defaults.items()))
    fields["static_keys"] = frozenset(k for k in props if k not in unknown)
    if "data_dir" not in fields:
        raise ConfigFileError(f"{source}: log.dirs is not set and --data-dir not given")
    return BrokerConfig(**fields)


def _parsed(source: str, key: str, value: str, parse: Callable[[str], Any]) -> Any:
    try:
        return parse(value)
    except ValueError as exc:
        raise ConfigFileError(f"{source}: invalid value {value!r} for {key}: {exc}") from None


def _special(props: Mapping[str, str], fields: dict[str, Any], source: str) -> None:
    protocols = dict(pair.split(":", 1) for pair in
                     props.get("listener.security.protocol.map", "").split(",") if ":" in pair)
    controllers = {n.strip() for n in props.get("controller.listener.names", "").split(",")}
    if "listeners" in props:
        fields["host"], fields["port"] = _parsed(
            source, "listeners", props["listeners"],
            lambda text: _listener(text, protocols, controllers))
    if "advertised.listeners" in props:
        fields["advertised_host"], fields["advertised_port"] = _parsed(
            source, "advertised.listeners", props["advertised.listeners"],
            lambda text: _listener(text, protocols, controllers))
    dirs = props.get("log.dirs", props.get("log.dir"))
    if dirs is not None:
        paths = [d.strip() for d in dirs.split(",") if d.strip()]
        if not paths:
            raise ConfigFileError(f"{source}: invalid value {dirs!r} for log.dirs: empty")
        if len(paths) > 1:
            logger.warning("%s: log.dirs lists %d directories; only %s is used", source,
                           len(paths), paths[0])
        fields["data_dir"] = Path(paths[0])
    if "offsets.retention.minutes" in props:
        minutes = _parsed(source, "offsets.retention.minutes",
                          props["offsets.retention.minutes"], _int(1))
        fields["offsets_retention_ms"] = minutes * _MINUTES_MS


def _log_defaults(props: Mapping[str, str], source: str) -> dict[str, str]:
    """Topic config defaults from the broker's log.* keys, checked as topic configs."""
    out: dict[str, str] = {}
    for key, (topic_key, unit) in LOG_DEFAULT_KEYS.items():  # ordered: first of a group wins
        if key not in props or topic_key in out:
            continue
        value = props[key].strip()
        if unit > 1:
            value = str(_parsed(source, key, value, _int(-1)) * unit) \
                if value != "-1" else "-1"
        try:
            parse_topic_config(topic_key, value)
        except InvalidConfig as exc:
            raise ConfigFileError(f"{source}: invalid value {props[key]!r} for {key}: "
                                  f"{exc}") from None
        out[topic_key] = value
    return out


def _log_default_value(key: str, text: str) -> str:
    """The topic config value of broker key `key` set to `text` (in the topic config's unit);
    ValueError with Kafka's reason otherwise."""
    topic_key, unit = LOG_DEFAULT_KEYS[key]
    value = text.strip()
    if unit > 1 and value != "-1":
        try:
            value = str(int(value) * unit)
        except ValueError:
            raise ValueError("Not a number of type LONG") from None
    try:
        parse_topic_config(topic_key, value)
    except InvalidConfig as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from None
    return value


def dynamic_value_error(key: str, value: str) -> str | None:
    """Kafka's message for a bad value of dynamic broker key `key`, or None."""
    try:
        DYNAMIC_BROKER_KEYS[key](value)
    except ValueError as exc:
        return f"Invalid value {value} for configuration {key}: {exc}"
    return None


def log_defaults_of(configs: Mapping[str, str]) -> dict[str, str]:
    """Topic config defaults from broker keys (valid ones; the first of a group wins, as
    log.retention.ms over log.retention.hours)."""
    out: dict[str, str] = {}
    for key, (topic_key, _unit) in LOG_DEFAULT_KEYS.items():
        if key in configs and topic_key not in out:
            try:
                out[topic_key] = _log_default_value(key, configs[key])
            except ValueError:
                logger.warning("dynamic broker config %s=%r ignored: invalid", key, configs[key])
    return out


def effective_broker_configs(config: BrokerConfig) -> dict[str, tuple[str, bool]]:
    """Kafka key -> (effective value, set statically): what DescribeConfigs on the BROKER
    resource reports. The log.* defaults appear under their millisecond/byte key
    (log.retention.hours=1 shows as log.retention.ms=3600000)."""
    values = {key: (kafka_value(getattr(config, name)), key in config.static_keys)
              for key, (name, _) in BROKER_KEYS.items()}
    defaults = dict(config.log_defaults)
    for key, (topic_key, unit) in LOG_DEFAULT_KEYS.items():
        if topic_key in defaults and unit in (0, 1):
            values[key] = (defaults.pop(topic_key), True)
    return values


def kafka_value(value: Any) -> str:
    """A setting's value as Kafka prints it (booleans lower case, no-limit doubles)."""
    if value == float("inf"):
        return "1.7976931348623157E308"  # Java's Double.MAX_VALUE: Kafka's "no limit"
    return str(value).lower() if isinstance(value, bool) else str(value)


__all__ = [
    "BROKER_KEYS",
    "DYNAMIC_BROKER_KEYS",
    "DYNAMIC_KEY_DEFAULTS",
    "LOG_DEFAULT_KEYS",
    "ConfigFileError",
    "config_from_properties",
    "dynamic_value_error",
    "effective_broker_configs",
    "load_config_file",
    "log_defaults_of",
    "parse_properties",
]
