"""`nodes=N`: one process presents itself as an N-broker cluster."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow import Broker
from tests.helpers import create_topic
from tests.kafka_raw import RawClient

TIMEOUT_S = 15
PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster():
    with Broker(nodes=3) as broker:
        yield broker


def test_three_nodes_spread_leaders_and_serve_clients(cluster):
    bootstrap = cluster.bootstrap_servers
    assert len(bootstrap.split(",")) == 3
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"rf3-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(TIMEOUT_S)
    metadata = admin.list_topics(topic, timeout=TIMEOUT_S)
    assert sorted(metadata.brokers) == [0, 1, 2]
    partitions = metadata.topics[topic].partitions
    assert {p.leader for p in partitions.values()} == {0, 1, 2}
    assert all(len(p.replicas) == 3 and p.leader == p.replicas[0] for p in partitions.values())

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(600):
        producer.produce(topic, key=str(i).encode(), value=str(i).encode())
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "nodes-check", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values = []
    while len(values) < 600:
        batch = consumer.consume(1000, timeout=TIMEOUT_S)
        assert batch, "consumer stalled"
        values += [int(m.value()) for m in batch if not m.error()]
    consumer.close()
    assert sorted(values) == list(range(600))


def test_non_leader_node_answers_not_leader(cluster):
    bootstrap = cluster.bootstrap_servers
    topic = f"lead-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1, 3)
    leader = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=TIMEOUT_S) \
        .topics[topic].partitions[0].leader
    other = bootstrap.split(",")[(leader + 1) % 3]
    with RawClient(other) as client:
        response = client.request(1, 12, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "topics": [
                {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                 "partition_max_bytes": 1024}]}],
            "forgotten_topics_data": []})
        assert response.responses[0].partitions[0].error_code == ErrorCode.not_leader_or_follower


def test_replication_factor_above_node_count_rejected(onceflow_broker):
    admin = AdminClient({"bootstrap.servers": onceflow_broker.bootstrap_servers})
    topic = f"rf-{uuid.uuid4().hex[:8]}"
    future = admin.create_topics([NewTopic(topic, 1, 2)])[topic]
    with pytest.raises(Exception, match="INVALID_REPLICATION_FACTOR"):
        future.result(TIMEOUT_S)
