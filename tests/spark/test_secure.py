"""A Spark Kafka -> Kafka exactly-once pipeline against a SASL_SSL broker with the ACLs it
needs (docs/security.md), and a clear authorization error when one is missing."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

pytestmark = pytest.mark.timeout(300)

WAIT_S = 60
QUERY_TIMEOUT_S = 180
RECORDS = 300


def _acls(source: str, output: str, progress: str) -> list[AclBinding]:
    def binding(rtype, name, operation, pattern=ResourcePatternType.LITERAL):
        return AclBinding(rtype, name, pattern, "User:app", "*", operation,
                          AclPermissionType.ALLOW)
    return [
        binding(ResourceType.TOPIC, source, AclOperation.READ),
        binding(ResourceType.TOPIC, output, AclOperation.WRITE),
        # the sink's progress topic: created on first use, written in the transactions,
        # read back to skip replayed batches
        binding(ResourceType.TOPIC, progress, AclOperation.ALL),
        binding(ResourceType.TRANSACTIONAL_ID, "onceflow-spark", AclOperation.WRITE,
                ResourcePatternType.PREFIXED),
        # the consumers' group ids (the source and the progress reader assign partitions,
        # librdkafka still looks their coordinator up)
        binding(ResourceType.GROUP, "onceflow-spark", AclOperation.READ,
                ResourcePatternType.PREFIXED),
    ]


def _setup(secure) -> tuple[str, str, str]:
    suffix = uuid.uuid4().hex[:8]
    source, output, progress = f"sp-in-{suffix}", f"sp-out-{suffix}", f"sp-progress-{suffix}"
    admin = AdminClient(secure.client_config("admin"))
    for future in admin.create_topics([NewTopic(source, 2, 1), NewTopic(output, 2, 1)]).values():
        future.result(timeout=WAIT_S)
    producer = Producer(secure.client_config("admin"))
    for i in range(RECORDS):
        producer.produce(source, f"r{i}".encode(), key=str(i).encode())
    assert producer.flush(WAIT_S) == 0
    return source, output, progress


def _options(secure, user: str) -> dict[str, str]:
    return {f"kafka.{k}": str(v) for k, v in secure.client_config(user).items()}


def _run(spark, secure, user: str, source: str, output: str, progress: str, checkpoint):
    reader = spark.readStream.format("onceflow-kafka").option("subscribe", source) \
        .option("startingOffsets", "earliest")
    for key, value in _options(secure, user).items():
        reader = reader.option(key, value)
    frame = reader.load().selectExpr("key", "concat(CAST(value AS STRING), '|copied') AS value")
    writer = frame.writeStream.format("onceflow-kafka").option("topic", output) \
        .option("progressTopic", progress).option("checkpointLocation", str(checkpoint))
    for key, value in _options(secure, user).items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query still running"
    return query


def _read_committed(secure, topic: str) -> Counter:
    consumer = Consumer(secure.client_config("admin") | {
        "group.id": f"check-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed",
        "enable.auto.commit": False})
    values: Counter = Counter()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        while sum(values.values()) < RECORDS:
            message = consumer.poll(5)
            if message is None:
                break
            if message.error() is None:
                values[message.value()] += 1
    finally:
        consumer.close()
    return values


def test_pipeline_with_the_acls_it_needs(spark, onceflow_secure_broker, tmp_path):
    secure = onceflow_secure_broker
    source, output, progress = _setup(secure)
    admin = AdminClient(secure.client_config("admin"))
    for future in admin.create_acls(_acls(source, output, progress)).values():
        future.result(timeout=WAIT_S)
    query = _run(spark, secure, "app", source, output, progress, tmp_path / "ck")
    assert query.exception() is None, query.exception()
    assert _read_committed(secure, output) == Counter(f"r{i}|copied".encode()
                                                      for i in range(RECORDS))


def test_pipeline_without_write_on_its_output_fails_clearly(spark, onceflow_secure_broker,
                                                            tmp_path):
    secure = onceflow_secure_broker
    source, output, progress = _setup(secure)
    acls = [a for a in _acls(source, output, progress) if a.name != output]
    admin = AdminClient(secure.client_config("admin"))
    for future in admin.create_acls(acls).values():
        future.result(timeout=WAIT_S)
    with pytest.raises(Exception) as failure:   # awaitTermination raises the query's error
        _run(spark, secure, "app", source, output, progress, tmp_path / "ck")
    assert "TOPIC_AUTHORIZATION_FAILED" in str(failure.value), str(failure.value)[-2000:]
    assert _read_committed(secure, output) == Counter()
