"""A compacted topic refuses keyless records (INVALID_RECORD, Kafka's LogValidator rule),
whatever the compression, while keyed records - in other batches of the same request,
other partitions - are appended."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic, unique
from tests.kafka_raw import RawClient

PRODUCE = 0


@pytest.fixture(scope="module")
def broker():
    with Broker() as running:
        yield running


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_keyless_record_on_a_compacted_topic_fails_invalid_record(broker, compression):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("compacted"), partitions=2,
                         config={"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": compression,
                         "linger.ms": 50, "retries": 0})
    results: dict[tuple[int, bytes | None], object] = {}

    def report(key, partition):
        return lambda error, _message: results.__setitem__((partition, key), error)

    producer.produce(topic, b"keyed", key=b"k1", partition=0, on_delivery=report(b"k1", 0))
    producer.produce(topic, b"keyless", partition=1, on_delivery=report(None, 1))
    assert producer.flush(30) == 0
    assert results[(0, b"k1")] is None
    error = results[(1, None)]
    assert error is not None and error.code() == KafkaError.INVALID_RECORD, error

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g")})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == 1
        assert consumer.get_watermark_offsets(TopicPartition(topic, 1), timeout=10)[1] == 0
    finally:
        consumer.close()


def test_record_errors_name_each_keyless_record(broker):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("compacted"), partitions=2,
                         config={"cleanup.policy": "compact,delete"})
    mixed = build_batch([SimpleRecord(b"a", b"1"), SimpleRecord(None, b"2"),
                         SimpleRecord(b"c", b"3"), SimpleRecord(None, b"4")])
    keyed = build_batch([SimpleRecord(b"a", b"1")])
    body = {"transactional_id": None, "acks": -1, "timeout": 10_000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": mixed},
                                           {"index": 1, "records": keyed}]}]}
    with RawClient(bootstrap) as client:
        response = client.request(PRODUCE, 9, body)
    bad, good = response.responses[0].partition_responses
    assert bad.error_code == ErrorCode.invalid_record
    assert [e.batch_index for e in bad.record_errors] == [1, 3]
    assert "without key" in bad.record_errors[0].batch_index_error_message
    assert "2 record errors" in bad.error_message
    assert good.error_code == ErrorCode.none and good.base_offset == 0
