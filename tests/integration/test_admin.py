"""Topic administration, metadata and offsets through confluent-kafka's AdminClient
and Consumer, against the broker over a real socket."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions, NewTopic)

TIMEOUT_S = 15


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def admin(onceflow_broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": onceflow_broker.bootstrap_servers})


def _create(admin: AdminClient, name: str, partitions: int = 1, rf: int = 1, config=None):
    return admin.create_topics([NewTopic(name, partitions, rf, config=config or {})])[name].result(TIMEOUT_S)


def test_create_list_describe_delete(admin):
    name = _name("admin")
    _create(admin, name, 3, config={"retention.ms": "3600000"})
    metadata = admin.list_topics(timeout=TIMEOUT_S)
    assert name in metadata.topics
    assert sorted(metadata.topics[name].partitions) == [0, 1, 2]
    assert metadata.controller_id >= 0
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    assert configs["retention.ms"].value == "3600000"
    assert configs["cleanup.policy"].value == "delete"
    admin.delete_topics([name])[name].result(TIMEOUT_S)
    assert name not in admin.list_topics(timeout=TIMEOUT_S).topics


def test_create_rejects_bad_requests(admin):
    with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS"):
        name = _name("dup")
        _create(admin, name)
        _create(admin, name)
    with pytest.raises(KafkaException, match="INVALID_REPLICATION_FACTOR"):
        _create(admin, _name("rf"), 1, rf=3)
    with pytest.raises(KafkaException, match="TOPIC_EXCEPTION"):
        _create(admin, "bad name with spaces")
    with pytest.raises(KafkaException, match="INVALID_CONFIG"):
        _create(admin, _name("cfg"), config={"retention.ms": "not-a-number"})


def test_incremental_alter_and_partitions(admin):
    name = _name("alter")
    _create(admin, name, 2)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)])
    assert list(described.values())[0].result(TIMEOUT_S)["retention.bytes"].value == "1048576"
    admin.create_partitions([NewPartitions(name, 5)])[name].result(TIMEOUT_S)
    assert len(admin.list_topics(name, timeout=TIMEOUT_S).topics[name].partitions) == 5
    with pytest.raises(KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([NewPartitions(name, 3)])[name].result(TIMEOUT_S)


def test_offsets_by_time_and_delete_records(onceflow_broker, admin):
    bootstrap = onceflow_broker.bootstrap_servers
    name = _name("offsets")
    _create(admin, name, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    base_ms = int(time.time() * 1000) - 100_000
    for i in range(10):
        producer.produce(name, value=str(i).encode(), timestamp=base_ms + i * 1000)
        producer.flush(TIMEOUT_S)   # one batch per record, so timestamps index exactly
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": _name("g"), "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    assert consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=TIMEOUT_S) == (0, 10)
    found = consumer.offsets_for_times([TopicPartition(name, 0, base_ms + 4500)], timeout=TIMEOUT_S)
    assert found[0].offset == 5
    after_end = consumer.offsets_for_times([TopicPartition(name, 0, base_ms + 10**7)], timeout=TIMEOUT_S)
    assert after_end[0].offset == -1
    deleted = admin.delete_records([TopicPartition(name, 0, 3)])
    assert list(deleted.values())[0].result(TIMEOUT_S).low_watermark == 3
    assert consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=TIMEOUT_S) == (3, 10)
    consumer.assign([TopicPartition(name, 0, 0)])   # below the log start: reset to earliest
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < 7 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            values.append(int(message.value()))
    consumer.close()
    assert values == list(range(3, 10))


def test_describe_cluster(onceflow_broker, admin):
    cluster = admin.describe_cluster().result(TIMEOUT_S)
    assert cluster.cluster_id
    assert [node.id for node in cluster.nodes] == [0]
    assert cluster.controller.id == 0
