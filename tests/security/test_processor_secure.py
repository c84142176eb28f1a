"""The exactly-once processor against a SASL_SSL broker with exactly the ACLs it needs
(docs/security.md), and a clear authorization error when one is missing."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from onceflow.processor import Output, Processor, ProcessorConfig, Record

pytestmark = pytest.mark.timeout(180)

WAIT_S = 60
RECORDS = 50


def _wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _acls(source: str, sink: str, group: str, txn_id: str) -> list[AclBinding]:
    def binding(rtype, name, operation):
        return AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:app", "*", operation,
                          AclPermissionType.ALLOW)
    return [binding(ResourceType.TOPIC, source, AclOperation.READ),
            binding(ResourceType.TOPIC, sink, AclOperation.WRITE),
            binding(ResourceType.GROUP, group, AclOperation.READ),
            binding(ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.WRITE)]


def _setup(secure, acls_left_out: int | None = None) -> tuple[str, str, str, str]:
    suffix = uuid.uuid4().hex[:8]
    source, sink, group, txn_id = (f"in-{suffix}", f"out-{suffix}", f"g-{suffix}",
                                   f"tx-{suffix}")
    admin = AdminClient(secure.client_config("admin"))
    for future in admin.create_topics([NewTopic(source, 2, 1), NewTopic(sink, 2, 1)]).values():
        future.result(timeout=WAIT_S)
    acls = _acls(source, sink, group, txn_id)
    if acls_left_out is not None:
        del acls[acls_left_out]
    for future in admin.create_acls(acls).values():
        future.result(timeout=WAIT_S)
    producer = Producer(secure.client_config("admin"))
    for i in range(RECORDS):
        producer.produce(source, f"v{i}".encode(), key=str(i % 5).encode())
    assert producer.flush(WAIT_S) == 0
    return source, sink, group, txn_id


def _processor(secure, source: str, sink: str, group: str, txn_id: str) -> Processor:
    def handle(record: Record) -> Output:
        return Output(sink, record.value.upper(), record.key)

    settings = secure.client_config("app")
    settings.pop("bootstrap.servers")
    return Processor(bootstrap_servers=secure.bootstrap_servers, group_id=group,
                     topics=[source], handler=handle,
                     config=ProcessorConfig(concurrency=4, commit_interval_ms=100,
                                            exactly_once=True, transactional_id=txn_id,
                                            transaction_timeout_ms=10_000),
                     consumer_config=settings, producer_config=settings)


def _committed_outputs(secure, sink: str) -> list[bytes]:
    consumer = Consumer(secure.client_config("admin") | {
        "group.id": f"check-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed",
        "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(sink, p, 0) for p in range(2)])
        deadline = time.monotonic() + WAIT_S
        while len(values) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def test_processor_with_minimal_acls(onceflow_secure_broker):
    secure = onceflow_secure_broker
    source, sink, group, txn_id = _setup(secure)
    with _processor(secure, source, sink, group, txn_id) as processor:
        processor.start()
        assert _wait_until(lambda: processor.statistics().total("processed") >= RECORDS, WAIT_S)
        assert _wait_until(lambda: processor.metrics.transactions["committed"] >= 1, WAIT_S)
    assert sorted(_committed_outputs(secure, sink)) == sorted(f"V{i}".encode()
                                                              for i in range(RECORDS))


@pytest.mark.parametrize("left_out", [1, 3], ids=["no-write-on-output", "no-transactional-id"])
def test_processor_missing_acl_fails_clearly(onceflow_secure_broker, left_out, caplog):
    secure = onceflow_secure_broker
    source, sink, group, txn_id = _setup(secure, acls_left_out=left_out)
    processor = _processor(secure, source, sink, group, txn_id)
    expected = {1: "TOPIC_AUTHORIZATION_FAILED",
                3: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}[left_out]
    try:
        processor.start()
    except KafkaException as exc:   # init_transactions: refused before any record
        assert exc.args[0].code() == getattr(KafkaError, expected)
        return
    try:
        failed = _wait_until(lambda: expected in caplog.text, WAIT_S)
    finally:
        processor.stop()
    assert failed, caplog.text[-2000:]
    # Nothing was consumed for good: no committed offset past the start of the input.
    admin = Consumer(secure.client_config("admin") | {"group.id": group})
    try:
        committed = admin.committed([TopicPartition(source, p) for p in range(2)], timeout=10)
    finally:
        admin.close()
    assert all(tp.offset <= 0 for tp in committed), committed  # none, or the start
