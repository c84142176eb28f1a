"""Dynamic broker configs (issue 15) through confluent-kafka's AdminClient against a
three-node broker: per-node ("<id>") and cluster-default ("") BROKER resources, Kafka's
sources and synonyms, refusals, persistence across a restart, and a dynamic
log.retention.ms default that reaches a topic without its own retention.ms."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from tests.helpers import create_topic, unique, wait_for
from tests.kafka_raw import RawClient

TIMEOUT_S = 30
CHECK_INTERVAL_MS = 200  # log.retention.check.interval.ms
DESCRIBE_CONFIGS = 32
INCREMENTAL_ALTER_CONFIGS = 44
BOOTSTRAP: list[str] = []  # the module's broker, for the raw requests


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("dyn"), nodes=3,
                retention_check_interval_ms=CHECK_INTERVAL_MS) as running:
        BOOTSTRAP[:] = [running.bootstrap_servers]
        yield running
        BOOTSTRAP.clear()


@pytest.fixture(scope="module")
def admin(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def _alter(admin: AdminClient, resource: ConfigResource) -> None:
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)


def _describe(admin: AdminClient, resource_type, name: str) -> dict:
    if name == "" and resource_type == ConfigResource.Type.BROKER:
        return {k: (v.value, v.config_source)
                for k, v in _raw_describe(BOOTSTRAP[0], "", None, synonyms=False).items()}
    resource = ConfigResource(resource_type, name)
    return admin.describe_configs([resource])[resource].result(TIMEOUT_S)


def _raw(bootstrap: str, api_key: int, version: int, body: dict):
    with RawClient(bootstrap.split(",")[0]) as client:
        return client.request(api_key, version, body)


def _alter_keys(admin, name: str, pairs: dict[str, str | None],
                bootstrap: str | None = None) -> None:
    """SET (DELETE for None) on a BROKER resource. librdkafka refuses the empty name of
    the cluster default locally, so "" goes over a raw socket (errors as KafkaException)."""
    if name == "":
        ops = [{"name": k, "config_operation": 0 if v is not None else 1, "value": v}
               for k, v in pairs.items()]
        body = {"resources": [{"resource_type": 4, "resource_name": "", "configs": ops}],
                "validate_only": False}
        (result,) = _raw(bootstrap or BOOTSTRAP[0], INCREMENTAL_ALTER_CONFIGS, 1,
                         body).responses
        if result.error_code != ErrorCode.none:
            raise KafkaException(KafkaError(int(result.error_code), result.error_message))
        return
    resource = ConfigResource(ConfigResource.Type.BROKER, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET if v is not None
                    else AlterConfigOpType.DELETE) for k, v in pairs.items()])
    _alter(admin, resource)


def _raw_describe(bootstrap: str, name: str, keys: list[str] | None,
                  synonyms: bool = True) -> dict:
    """DescribeConfigs v4 with synonyms on the first node (librdkafka keys synonyms by name,
    so their order and repeats are checked over a raw socket)."""
    body = {"resources": [{"resource_type": 4, "resource_name": name,
                           "configuration_keys": keys}],
            "include_synonyms": synonyms, "include_documentation": False}
    (result,) = _raw(bootstrap, DESCRIBE_CONFIGS, 4, body).results
    if result.error_code != ErrorCode.none:
        raise KafkaException(KafkaError(int(result.error_code), result.error_message))
    return {c.name: c for c in result.configs}


def test_default_then_node_layers_sources_and_synonyms(broker, admin):
    _alter_keys(admin, "", {"log.retention.bytes": "5000000", "log.segment.bytes": "2000000"})
    _alter_keys(admin, "0", {"log.retention.bytes": "7000000"})
    try:
        node0 = _describe(admin, ConfigResource.Type.BROKER, "0")
        entry = node0["log.retention.bytes"]
        assert (entry.value, entry.source, entry.is_read_only) == (
            "7000000", ConfigSource.DYNAMIC_BROKER_CONFIG.value, False)
        assert node0["log.segment.bytes"].source == \
            ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        assert node0["num.partitions"].is_read_only
        raw = _raw_describe(broker.bootstrap_servers, "0", ["log.retention.bytes"])
        assert [(s.name, s.value, s.source) for s in raw["log.retention.bytes"].synonyms] == [
            ("log.retention.bytes", "7000000", ConfigSource.DYNAMIC_BROKER_CONFIG.value),
            ("log.retention.bytes", "5000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value),
            ("log.retention.bytes", "-1", ConfigSource.DEFAULT_CONFIG.value)]
        # Node 1 sees the cluster default, not node 0's own value.
        node1 = _describe(admin, ConfigResource.Type.BROKER, "1")
        assert (node1["log.retention.bytes"].value, node1["log.retention.bytes"].source) == (
            "5000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        # The default resource lists only its own keys.
        default = _describe(admin, ConfigResource.Type.BROKER, "")
        assert default == {
            "log.retention.bytes": ("5000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value),
            "log.segment.bytes": ("2000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)}
        # A topic without overrides shows the dynamic default, with its source.
        topic = create_topic(broker.bootstrap_servers, unique("dyn"))
        configs = _describe(admin, ConfigResource.Type.TOPIC, topic)
        assert (configs["segment.bytes"].value, configs["segment.bytes"].source) == (
            "2000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    finally:
        _alter_keys(admin, "", {"log.retention.bytes": None, "log.segment.bytes": None})
        _alter_keys(admin, "0", {"log.retention.bytes": None})
    assert _describe(admin, ConfigResource.Type.BROKER, "") == {}
    assert _describe(admin, ConfigResource.Type.BROKER, "0")["log.retention.bytes"].source == \
        ConfigSource.DEFAULT_CONFIG.value


@pytest.mark.parametrize(("name", "pairs", "message"), [
    ("0", {"auto.create.topics.enable": "false"}, "Cannot update these configs dynamically"),
    ("", {"num.partitions": "3"}, "Cannot update these configs dynamically"),
    ("", {"log.retention.ms": "soon"}, "Invalid value soon for configuration log.retention.ms"),
    ("0", {"log.cleanup.policy": "sometimes"}, "log.cleanup.policy"),
    ("", {"log.cleaner.min.compaction.lag.ms": "10", "log.cleaner.max.compaction.lag.ms": "5"},
     "min.compaction.lag.ms > max.compaction.lag.ms"),
])
def test_refused_keys_and_values_change_nothing(admin, name, pairs, message):
    with pytest.raises(KafkaException, match=message) as caught:
        _alter_keys(admin, name, pairs)
    assert caught.value.args[0].name() == "INVALID_REQUEST"
    assert _describe(admin, ConfigResource.Type.BROKER, "") == {}


def test_names_other_than_this_node_are_refused(broker):
    # Raw, on node 0's connection: librdkafka routes a node's resource to that node itself.
    with pytest.raises(KafkaException, match="Broker id must be an integer, but it is: x"):
        _raw_describe(broker.bootstrap_servers, "x", None)
    with pytest.raises(KafkaException, match="expected 0 or empty string, but received 2"):
        _raw_describe(broker.bootstrap_servers, "2", None)
    body = {"resources": [{"resource_type": 4, "resource_name": "2", "configs": [
        {"name": "log.retention.ms", "config_operation": 0, "value": "1000"}]}],
        "validate_only": False}
    (result,) = _raw(broker.bootstrap_servers, INCREMENTAL_ALTER_CONFIGS, 1, body).responses
    assert (result.error_code, result.error_message) == (
        ErrorCode.invalid_request, "Unexpected broker id, expected 0, but received 2")


def _earliest(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g")})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
    finally:
        consumer.close()


def test_dynamic_retention_default_reaches_topics_without_override(broker, admin):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("ret"), config={"segment.ms": "50"})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for _ in range(5):  # several segments (segment.ms rolls on the next append)
        producer.produce(topic, b"v" * 100)
        assert producer.flush(TIMEOUT_S) == 0
        time.sleep(0.06)
    assert _earliest(bootstrap, topic) == 0  # 7 days of retention: nothing goes
    _alter_keys(admin, "", {"log.retention.ms": "100"})
    try:
        wait_for(lambda: _earliest(bootstrap, topic) > 0, "the dynamic retention to apply",
                 TIMEOUT_S)
        configs = _describe(admin, ConfigResource.Type.TOPIC, topic)
        assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
            "100", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    finally:
        _alter_keys(admin, "", {"log.retention.ms": None})


def test_dynamic_configs_survive_a_restart(tmp_path):
    with Broker(tmp_path) as first:
        admin = AdminClient({"bootstrap.servers": first.bootstrap_servers})
        _alter_keys(admin, "", {"log.retention.ms": "3600000"}, first.bootstrap_servers)
        _alter_keys(admin, "0", {"log.cleanup.policy": "compact"})
        resource = ConfigResource(ConfigResource.Type.BROKER, "0", incremental_configs=[
            ConfigEntry("log.cleanup.policy", "delete",
                        incremental_operation=AlterConfigOpType.APPEND)])
        _alter(admin, resource)
    with Broker(tmp_path) as second:
        admin = AdminClient({"bootstrap.servers": second.bootstrap_servers})
        configs = _describe(admin, ConfigResource.Type.BROKER, "0")
        assert list(_raw_describe(second.bootstrap_servers, "", None)) == ["log.retention.ms"]
        assert (configs["log.retention.ms"].value, configs["log.retention.ms"].source) == (
            "3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert (configs["log.cleanup.policy"].value, configs["log.cleanup.policy"].source) == (
            "compact,delete", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        topic = create_topic(second.bootstrap_servers, unique("after"))
        assert second.server.state.store.log_config(topic).retention_ms == 3_600_000


def test_a_setting_of_the_embedded_broker_is_its_default(admin):
    # The module's broker runs with log.retention.check.interval.ms=200 (not Kafka's 300000).
    entry = _describe(admin, ConfigResource.Type.BROKER, "0")["log.retention.check.interval.ms"]
    assert (entry.value, entry.source, entry.is_read_only) == (
        str(CHECK_INTERVAL_MS), ConfigSource.DEFAULT_CONFIG.value, True)


def test_each_node_describes_where_it_is(broker, admin):
    """A node's BROKER resource lists its id and its listeners read-only, as a KRaft broker
    does; advertised.listeners is the address Metadata gives clients for that node."""
    metadata = admin.list_topics(timeout=TIMEOUT_S).brokers
    for node_id in (0, 1, 2):
        configs = _describe(admin, ConfigResource.Type.BROKER, str(node_id))
        node = metadata[node_id]
        assert configs["node.id"].value == configs["broker.id"].value == str(node_id)
        assert configs["advertised.listeners"].value == f"PLAINTEXT://{node.host}:{node.port}"
        assert configs["listener.security.protocol.map"].value == "PLAINTEXT:PLAINTEXT"
        assert configs["listeners"].value.startswith("PLAINTEXT://")
        assert all(configs[key].is_read_only and
                   configs[key].source == ConfigSource.STATIC_BROKER_CONFIG.value
                   for key in ("node.id", "listeners", "advertised.listeners", "log.dirs"))
