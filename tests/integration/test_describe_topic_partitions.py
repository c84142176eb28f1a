"""DescribeTopicPartitions (KIP-966) over a raw socket: paging by partitions with the cursor,
unknown and bad names, and the authorized operations of a broker without an authorizer."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from tests.kafka_raw import RawClient

TIMEOUT_S = 30
DESCRIBE_TOPIC_PARTITIONS = 75
ALL_TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))


def _request(client: RawClient, names, limit: int, cursor=None):
    return client.request(DESCRIBE_TOPIC_PARTITIONS, 0, {
        "topics": [{"name": n} for n in names], "response_partition_limit": limit,
        "cursor": cursor})


def test_paging_with_cursor(onceflow_broker):
    prefix = f"dtp-{uuid.uuid4().hex[:8]}"
    first, second = f"{prefix}-a", f"{prefix}-b"
    admin = AdminClient({"bootstrap.servers": onceflow_broker.bootstrap_servers})
    for name, count in ((first, 3), (second, 2)):
        admin.create_topics([NewTopic(name, count, 1)])[name].result(TIMEOUT_S)
    missing = f"{prefix}-c"
    seen, cursor, pages = [], None, 0
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        while True:
            response = _request(client, [second, missing, first], 2, cursor)
            pages += 1
            for topic in response.topics:
                seen += [(topic.name, p.partition_index) for p in topic.partitions]
                if topic.error_code == ErrorCode.none:
                    assert topic.topic_authorized_operations == ALL_TOPIC_OPERATIONS
                else:
                    assert (topic.name, topic.error_code) == (
                        missing, ErrorCode.unknown_topic_or_partition)
            if response.next_cursor is None:
                break
            cursor = {"topic_name": response.next_cursor.topic_name,
                      "partition_index": response.next_cursor.partition_index}
            assert pages < 10
        assert seen == [(first, 0), (first, 1), (first, 2), (second, 0), (second, 1)]
        assert pages == 3
        bad = _request(client, [first], 10, {"topic_name": second, "partition_index": 0})
        assert [t.error_code for t in bad.topics] == [ErrorCode.invalid_request]
        invalid = _request(client, ["bad name"], 10)
        assert invalid.topics[0].error_code == ErrorCode.invalid_topic_exception


def test_authorized_operations_without_authorizer(onceflow_broker):
    admin = AdminClient({"bootstrap.servers": onceflow_broker.bootstrap_servers})
    name = f"ops-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT_S)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(TIMEOUT_S)
    assert sorted(op.name for op in cluster.authorized_operations) == sorted(
        ["CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE",
         "ALTER", "DESCRIBE"])
    [topic] = admin.describe_topics(TopicCollection([name]), include_authorized_operations=True)\
        .values()
    assert sorted(op.name for op in topic.result(TIMEOUT_S).authorized_operations) == sorted(
        ["READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS",
         "ALTER_CONFIGS"])
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": onceflow_broker.bootstrap_servers,
                         "group.id": group, "group.protocol": "classic"})
    try:
        consumer.subscribe([name])
        deadline = time.monotonic() + TIMEOUT_S
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.5)
        assert consumer.assignment(), "the consumer never joined its group"
        [described] = admin.describe_consumer_groups([group], include_authorized_operations=True)\
            .values()
        assert sorted(op.name for op in described.result(TIMEOUT_S).authorized_operations) == \
            sorted(["READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"])
    finally:
        consumer.close()


DESCRIBE_CLUSTER = 60


def test_describe_cluster_v2(onceflow_broker):
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        response = client.request(DESCRIBE_CLUSTER, 2, {
            "include_cluster_authorized_operations": False, "endpoint_type": 1,
            "include_fenced_brokers": True})
    assert response.error_code == ErrorCode.none
    assert [(b.broker_id, b.is_fenced) for b in response.brokers] == [(0, False)]
    assert response.cluster_authorized_operations == -(2**31)
