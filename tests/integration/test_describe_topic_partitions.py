"""DescribeTopicPartitions (KIP-966) over a raw socket: paging by partitions with the cursor,
unknown and bad names, and the authorized operations of a broker without an authorizer."""

from __future__ import annotations

import uuid

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
