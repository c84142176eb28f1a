"""DescribeConfigs / AlterConfigs / IncrementalAlterConfigs through confluent-kafka's
AdminClient and kafka-python's KafkaAdminClient against the broker over a real socket:
types, sources, synonyms, sensitivity, legacy replace-all and Kafka's errors."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ConfigSource, NewTopic)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kio.schema.errors import ErrorCode

from tests.kafka_raw import RawClient

TIMEOUT_S = 30
INCREMENTAL_ALTER_CONFIGS = 44
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def admin(onceflow_broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": onceflow_broker.bootstrap_servers})


def _create(admin: AdminClient, name: str, config=None) -> None:
    admin.create_topics([NewTopic(name, 1, 1, config=config or {})])[name].result(TIMEOUT_S)


def _describe(admin: AdminClient, name: str, **kwargs) -> dict:
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    return admin.describe_configs([resource], **kwargs)[resource].result(TIMEOUT_S)


def test_topic_configs_types_sources_synonyms(admin):
    name = _name("types")
    _create(admin, name, {"retention.ms": "3600000"})
    configs = _describe(admin, name, request_timeout=TIMEOUT_S)
    retention = configs["retention.ms"]
    assert retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert (retention.value, retention.is_read_only, retention.is_sensitive) == (
        "3600000", False, False)
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    # librdkafka sends include_synonyms; the topic value comes first, the default last.
    synonyms = [(s.name, s.value, s.source) for s in retention.synonyms.values()]
    assert synonyms[0] == ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG.value) in synonyms


def test_incremental_alter_duplicate_keys_apply_nothing(onceflow_broker, admin):
    # librdkafka refuses duplicates itself, so this request goes over a raw socket.
    name = _name("dup")
    _create(admin, name)
    ops = [{"name": "retention.ms", "config_operation": 0, "value": v} for v in ("1000", "2000")]
    body = {"resources": [{"resource_type": 2, "resource_name": name, "configs": ops}],
            "validate_only": False}
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        response = client.request(INCREMENTAL_ALTER_CONFIGS, 1, body)
    (result,) = response.responses
    assert result.error_code == ErrorCode.invalid_request
    assert "duplicate config keys" in result.error_message
    assert _describe(admin, name)["retention.ms"].value == "604800000"


def test_incremental_alter_errors_name_the_key(admin):
    name = _name("bad")
    _create(admin, name)
    for key, value in (("no.such.config", "1"), ("retention.ms", "soon")):
        resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException, match=key.replace(".", r"\.")) as caught:
            admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
        assert caught.value.args[0].name() == "INVALID_CONFIG"
    resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource], validate_only=True)[resource].result(TIMEOUT_S)
    assert _describe(admin, name)["retention.ms"].value == "604800000"


def test_broker_configs_are_typed_and_read_only(onceflow_broker, admin):
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    assert configs["broker.id"].value == "0"
    # Only Kafka's dynamic keys onceflow acts on can be altered (test_dynamic_broker_configs).
    assert not configs["log.retention.ms"].is_read_only
    assert all(entry.is_read_only for key, entry in configs.items()
               if not key.startswith("log.") and key not in (
                   "compression.type", "min.insync.replicas", "message.max.bytes",
                   "producer.id.expiration.ms", "max.connections", "max.connections.per.ip"))
    assert all(entry.value is None for entry in configs.values() if entry.is_sensitive)
    # confluent-kafka does not expose config_type: DescribeConfigs v4 over a raw socket.
    name = _name("typed")
    _create(admin, name)
    body = {"resources": [{"resource_type": 4, "resource_name": "0", "configuration_keys": None},
                          {"resource_type": 2, "resource_name": name,
                           "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": False}
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        response = client.request(DESCRIBE_CONFIGS, 4, body)
    broker, topic = ({c.name: c.config_type for c in r.configs} for r in response.results)
    assert (broker["log.cleaner.enable"], broker["log.cleaner.backoff.ms"]) == (1, 5)
    assert (topic["cleanup.policy"], topic["segment.bytes"], topic["retention.ms"],
            topic["min.cleanable.dirty.ratio"], topic["compression.type"],
            topic["preallocate"]) == (7, 3, 5, 6, 2, 1)  # LIST INT LONG DOUBLE STRING BOOLEAN


def test_kafka_python_legacy_alter_and_describe(onceflow_broker, admin):
    name = _name("kp")
    _create(admin, name, {"retention.ms": "3600000"})
    client = KafkaAdminClient(bootstrap_servers=onceflow_broker.bootstrap_servers,
                              request_timeout_ms=TIMEOUT_S * 1000)
    try:
        resource = KpConfigResource(ConfigResourceType.TOPIC, name, configs={"segment.ms": "7200000"})
        # incremental=False: AlterConfigs v0-2 (kafka-python re-sends the other modified keys).
        result = client.alter_configs([resource], incremental=False, raise_on_unknown=False)
        assert result == {"topic": {name: "OK"}}
        bad = KpConfigResource(ConfigResourceType.TOPIC, name, configs={"segment.ms": "never"})
        result = client.alter_configs([bad], incremental=False, raise_on_unknown=False)
        assert "InvalidConfig" in result["topic"][name] and "segment.ms" in result["topic"][name]
        described = client.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, name)],
                                            config_filter="all")
        entries = described["topic"][name]
        assert str(entries["segment.ms"]["value"]) == "7200000"
        assert str(entries["retention.ms"]["value"]) == "3600000"
    finally:
        client.close()


def test_legacy_alter_replaces_all(onceflow_broker, admin):
    name = _name("legacy")
    _create(admin, name, {"retention.ms": "3600000", "retention.bytes": "1048576"})
    body = {"resources": [{"resource_type": 2, "resource_name": name,
                           "configs": [{"name": "segment.ms", "value": "7200000"}]}],
            "validate_only": False}
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        check = client.request(ALTER_CONFIGS, 2, {**body, "validate_only": True})
        assert check.responses[0].error_code == ErrorCode.none
        assert _describe(admin, name)["segment.ms"].value == "604800000"
        response = client.request(ALTER_CONFIGS, 2, body)
    assert response.responses[0].error_code == ErrorCode.none
    configs = _describe(admin, name)
    assert configs["segment.ms"].value == "7200000"
    # The keys left out return to their defaults.
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["retention.bytes"].value == "-1"


def test_confluent_kafka_legacy_alter_configs(admin):
    """confluent-kafka's (deprecated) alter_configs sends AlterConfigs: the resource's
    configs become exactly the ones given."""
    name = _name("ck-legacy")
    _create(admin, name, {"retention.ms": "3600000"})
    resource = ConfigResource(ConfigResource.Type.TOPIC, name,
                              set_config={"segment.ms": "7200000", "cleanup.policy": "compact"})
    with pytest.warns(DeprecationWarning):
        futures = admin.alter_configs([resource], request_timeout=TIMEOUT_S)
    futures[resource].result(TIMEOUT_S)
    configs = _describe(admin, name)
    assert (configs["segment.ms"].value, configs["cleanup.policy"].value) == ("7200000", "compact")
    assert configs["segment.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    bad = ConfigResource(ConfigResource.Type.TOPIC, name, set_config={"segment.ms": "soon"})
    with pytest.warns(DeprecationWarning):
        failed = admin.alter_configs([bad], request_timeout=TIMEOUT_S)[bad]
    with pytest.raises(KafkaException, match="segment.ms"):
        failed.result(TIMEOUT_S)
    assert _describe(admin, name)["segment.ms"].value == "7200000"


LOGGER = "onceflow.broker.handlers.loggers"


def _logger_ops(client: RawClient, ops, name: str = "0", validate_only: bool = False):
    body = {"resources": [{"resource_type": 8, "resource_name": name, "configs": [
        {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}],
        "validate_only": validate_only}
    (result,) = client.request(INCREMENTAL_ALTER_CONFIGS, 1, body).responses
    return result.error_code, result.error_message


def _logger_levels(client: RawClient, name: str = "0") -> dict:
    body = {"resources": [{"resource_type": 8, "resource_name": name,
                           "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": False}
    (result,) = client.request(DESCRIBE_CONFIGS, 4, body).results
    assert result.error_code == ErrorCode.none, result.error_message
    assert all(c.config_source == 6 for c in result.configs)  # DYNAMIC_BROKER_LOGGER_CONFIG
    return {c.name: c.value for c in result.configs}


def test_broker_logger_levels(onceflow_broker):
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        levels = _logger_levels(client)
        assert "root" in levels and LOGGER in levels
        before = levels[LOGGER]
        assert _logger_ops(client, [(LOGGER, 0, "TRACE")], validate_only=True)[0] == 0
        assert _logger_levels(client)[LOGGER] == before
        try:
            assert _logger_ops(client, [(LOGGER, 0, "TRACE")]) == (ErrorCode.none, None)
            assert _logger_levels(client)[LOGGER] == "TRACE"
        finally:
            assert _logger_ops(client, [(LOGGER, 1, None)]) == (ErrorCode.none, None)
        assert _logger_levels(client)[LOGGER] == before
        code, message = _logger_ops(client, [(LOGGER, 0, "LOUD")])
        assert code == ErrorCode.invalid_config and "DEBUG, ERROR, FATAL, INFO, TRACE, WARN" in message
        assert _logger_ops(client, [("no.such.logger", 0, "INFO")]) == (
            ErrorCode.invalid_config, "Logger no.such.logger does not exist!")
        assert _logger_ops(client, [("root", 1, None)])[0] == ErrorCode.invalid_request
        assert _logger_ops(client, [(LOGGER, 2, "INFO")])[0] == ErrorCode.invalid_request
        assert _logger_ops(client, [(LOGGER, 0, "INFO")], name="7")[0] == ErrorCode.invalid_request


def test_documentation_when_asked(onceflow_broker, admin):
    name = _name("docs")
    _create(admin, name)
    resources = [{"resource_type": 2, "resource_name": name, "configuration_keys": None},
                 {"resource_type": 4, "resource_name": "0", "configuration_keys": None},
                 {"resource_type": 32, "resource_name": name, "configuration_keys": None}]
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        asked, not_asked = (client.request(DESCRIBE_CONFIGS, 4, {
            "resources": resources, "include_synonyms": False, "include_documentation": flag})
            for flag in (True, False))
    for result in asked.results:
        undocumented = [c.name for c in result.configs if not c.documentation]
        assert result.configs and undocumented == [], (result.resource_type, undocumented)
    topic = {c.name: c.documentation for c in asked.results[0].configs}
    assert "segments" in topic["retention.bytes"]
    assert all(c.documentation is None for r in not_asked.results for c in r.configs)
