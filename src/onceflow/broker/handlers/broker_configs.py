"""BROKER config resources: describe every broker key with Kafka's four layers, and alter
the dynamic ones (issue 15).

A broker key's value comes from, highest first: the node's dynamic config (resource name
"<node id>", DYNAMIC_BROKER_CONFIG), the cluster-wide dynamic default (resource name "",
DYNAMIC_DEFAULT_BROKER_CONFIG), server.properties (STATIC_BROKER_CONFIG), Kafka's default
(DEFAULT_CONFIG). Synonyms list, in that order of layers, every key of the entry's synonym
group present in a layer (log.retention.ms, .minutes, .hours), starting at the entry's own
key, as Kafka's ConfigHelper does. Describing "" lists only the cluster default's keys.

Only the keys of config_file.DYNAMIC_BROKER_KEYS can be altered (not read_only); any other
key is refused with Kafka's INVALID_REQUEST "Cannot update these configs dynamically", a bad
value with INVALID_REQUEST naming the key (Kafka answers INVALID_REQUEST here, KAFKA-13609).
The change is persisted (storage.resource_configs) before it applies; BrokerState turns
log.* defaults into the storage's new defaults at once.
"""

from __future__ import annotations

import dataclasses

from onceflow.broker.config import BrokerConfig
from onceflow.broker.config_file import (
    BROKER_KEYS,
    DYNAMIC_BROKER_KEYS,
    DYNAMIC_KEY_DEFAULTS,
    LOG_DEFAULT_KEYS,
    dynamic_value_error,
    effective_broker_configs,
    kafka_value,
)
from onceflow.storage import config as topic_config

RESOURCE_BROKER = 4

# Kafka's ConfigSource ids.
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


class BrokerConfigError(Exception):
    """A BROKER resource request Kafka refuses with INVALID_REQUEST (the message is Kafka's)."""


# Broker key -> its synonym group in precedence order (Kafka's brokerConfigSynonyms).
SYNONYM_GROUPS: dict[str, list[str]] = {}
for _key, (_topic_key, _unit) in LOG_DEFAULT_KEYS.items():
    _group = [k for k, (t, _) in LOG_DEFAULT_KEYS.items() if t == _topic_key]
    SYNONYM_GROUPS[_key] = _group if len(_group) > 1 else [_key]


def in_unit(value: str, unit: int) -> str:
    """A topic config value in a broker key's unit (ms -> hours for log.retention.hours)."""
    return value if unit in (0, 1) or value == "-1" else str(int(value) // unit)


def kafka_default(key: str) -> str | None:
    """Kafka's default of a broker key; None where Kafka has none (log.retention.ms: the
    default is carried by the last key of its group, log.retention.hours=168)."""
    if key in LOG_DEFAULT_KEYS:
        topic_key, unit = LOG_DEFAULT_KEYS[key]
        group = [k for k, (t, _) in LOG_DEFAULT_KEYS.items() if t == topic_key]
        if key != group[-1]:
            return None
        return in_unit(topic_config.TOPIC_CONFIG_DEFAULTS[topic_key], unit)
    if key in DYNAMIC_KEY_DEFAULTS:
        return DYNAMIC_KEY_DEFAULTS[key]
    if key in BROKER_KEYS:
        default = _FIELD_DEFAULTS.get(BROKER_KEYS[key][0], dataclasses.MISSING)
        if default is not dataclasses.MISSING:
            return kafka_value(default)
    return None


_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(BrokerConfig)}


def static_value(config: BrokerConfig, key: str) -> str | None:
    """The key's value from server.properties (--config), or None when not set there."""
    if key not in config.static_keys:
        return None
    if key in LOG_DEFAULT_KEYS:
        topic_key, unit = LOG_DEFAULT_KEYS[key]
        value = dict(config.log_defaults).get(topic_key)
        return None if value is None else in_unit(value, unit)
    found = effective_broker_configs(config).get(key)
    return None if found is None else found[0]


@dataclasses.dataclass(frozen=True, slots=True)
class Layers:
    """The four layers of broker configs one node sees."""

    node: dict[str, str]       # DYNAMIC_BROKER_CONFIG of this node
    default: dict[str, str]    # DYNAMIC_DEFAULT_BROKER_CONFIG
    config: BrokerConfig       # STATIC_BROKER_CONFIG / DEFAULT_CONFIG

    def synonyms(self, key: str, per_broker: bool = True,
                 drop_before_key: bool = True) -> list[tuple[str, str | None, int]]:
        """(name, value, source) of every layer holding a key of `key`'s group, highest
        first, dropping those before `key` itself (Kafka's order for a broker entry)."""
        group = SYNONYM_GROUPS.get(key, [key])
        found = []
        levels = [(self.default, SOURCE_DYNAMIC_DEFAULT_BROKER)]
        if per_broker:
            levels = [(self.node, SOURCE_DYNAMIC_BROKER), *levels,
                      ({k: static_value(self.config, k) for k in group}, SOURCE_STATIC_BROKER),
                      ({k: self.default_value(k) for k in group}, SOURCE_DEFAULT)]
        for values, source in levels:
            found += [(k, values[k], source) for k in group if values.get(k) is not None]
        while drop_before_key and found and found[0][0] != key:
            found.pop(0)
        return found

    def default_value(self, key: str) -> str | None:
        """The DEFAULT_CONFIG layer: a broker field's value when no server.properties key set
        it (Kafka's default, or what a command-line flag or an embedded broker's setting
        made it), else Kafka's default of the key."""
        if key in BROKER_KEYS and key not in LOG_DEFAULT_KEYS:
            return kafka_value(getattr(self.config, BROKER_KEYS[key][0]))
        return kafka_default(key)

    def topic_synonyms(self, topic_key: str) -> list[tuple[str, str | None, int]]:
        """The broker layers under a topic config (its group's first key leads)."""
        group = [k for k, (t, _) in LOG_DEFAULT_KEYS.items() if t == topic_key]
        if not group:
            return []
        return self.synonyms(group[0], drop_before_key=False)


def broker_keys(config: BrokerConfig) -> list[str]:
    """Every key a BROKER resource lists: the broker's own keys, then the dynamic ones."""
    keys = ["broker.id", *effective_broker_configs(config)]
    keys += [k for k in DYNAMIC_BROKER_KEYS if k not in keys]
    return keys


def check_describe_name(name: str, node_id: int) -> None:
    if name == "":
        return
    if not name.lstrip("-").isdigit():
        raise BrokerConfigError(f"Broker id must be an integer, but it is: {name}")
    if int(name) != node_id:
        raise BrokerConfigError(f"Unexpected broker id, expected {node_id} or empty string, "
                                f"but received {name}")


def check_alter_name(name: str, node_id: int) -> None:
    if name == "":
        return
    if not name.lstrip("-").isdigit():
        raise BrokerConfigError(f"Node id must be an integer, but it is: {name}")
    if int(name) != node_id:
        raise BrokerConfigError(f"Unexpected broker id, expected {node_id}, but received {name}")


def validate_dynamic(configs: dict[str, str], config: BrokerConfig) -> None:
    """Kafka's DynamicBrokerConfig.validateConfigs over a resource's whole new set."""
    refused = [k for k in configs if k not in DYNAMIC_BROKER_KEYS]
    if refused:
        raise BrokerConfigError("Cannot update these configs dynamically: "
                                f"Set({', '.join(refused)})")
    for key, value in configs.items():
        problem = dynamic_value_error(key, value)
        if problem is not None:
            raise BrokerConfigError(problem)
    if (configs.get("max.connections.per.ip", "").strip() == "0"
            and not config.max_connections_per_ip_overrides.strip()):
        raise BrokerConfigError("max.connections.per.ip can be set to zero only if "
                                "max.connections.per.ip.overrides property is set")

