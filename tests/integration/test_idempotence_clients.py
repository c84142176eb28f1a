"""Real idempotent producers survive lost ACKs: every record exactly once, in order.

For each client - confluent-kafka (librdkafka), kafka-python and aiokafka, each with its
own idempotence switch on - the test produces RECORD_COUNT records with unique ids to a
4-partition topic while fault injection drops the broker's answer to a Produce request
DROPS times, spread over the run (after 1/4, 2/4 and 3/4 of the records were handed to
the client). The broker appended those batches; the client never hears so, times out
and retries the same batch with the same sequence numbers. The broker must recognise
each retry as a duplicate (the metrics count them) and answer with the original offsets.

Then every partition is read back: each id must appear exactly once, and within each
partition the ids must increase (the test sends them in increasing order from one
thread, and idempotence keeps a partition's order through retries).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.helpers import create_topic

pytestmark = pytest.mark.slow

RECORD_COUNT = 100_000
PARTITIONS = 4
DROPS = 3
ID_DIGITS = 8
VALUE_PADDING = b"x" * 92  # ~100-byte records
# A dropped answer costs one client request timeout; short, so the run stays quick.
REQUEST_TIMEOUT_MS = 2_000
DELIVERY_TIMEOUT_MS = 120_000
BATCH_BYTES = 256 * 1024
LINGER_MS = 5
FLUSH_TIMEOUT_S = 120
READ_TIMEOUT_S = 60


def value_of(record_id: int) -> bytes:
    return b"%0*d" % (ID_DIGITS, record_id) + VALUE_PADDING


def id_of(value: bytes) -> int:
    return int(value[:ID_DIGITS])


def read_ids(bootstrap: str, topic: str, partitions: int) -> dict[int, list[int]]:
    """Every record id of every partition, in offset order (by assignment, no group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "check.crcs": True})
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=READ_TIMEOUT_S)
                for p in range(partitions)]
        expected = sum(high - low for low, high in ends)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ids: dict[int, list[int]] = {p: [] for p in range(partitions)}
        got, deadline = 0, time.monotonic() + READ_TIMEOUT_S
        while got < expected and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=0.5):
                assert not message.error(), message.error()
                ids[message.partition()].append(id_of(message.value()))
                got += 1
        assert got == expected, f"read {got} of the {expected} records the offsets promise"
        return ids
    finally:
        consumer.close()


def exactly_once_problems(ids: dict[int, list[int]], sent: range | set[int]) -> list[str]:
    """What is wrong with the stored ids: missing, duplicated, out of order per partition."""
    problems = []
    counts = Counter(i for partition in ids.values() for i in partition)
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(sent) - counts.keys())
    unknown = sorted(counts.keys() - set(sent))
    if duplicated:
        problems.append(f"{len(duplicated)} ids stored more than once, e.g. {duplicated[:5]}")
    if missing:
        problems.append(f"{len(missing)} ids missing, e.g. {missing[:5]}")
    if unknown:
        problems.append(f"{len(unknown)} ids never sent, e.g. {unknown[:5]}")
    for partition, values in ids.items():
        disorder = [k for k in range(1, len(values)) if values[k - 1] >= values[k]]
        if disorder:
            k = disorder[0]
            problems.append(f"partition {partition} out of order at position {k}: "
                            f"{values[k - 1]} then {values[k]} ({len(disorder)} places)")
    return problems


class DropSchedule:
    """Adds one drop-the-answer rule each time another quarter of the records was sent."""

    def __init__(self, broker, drops: int = DROPS, total: int = RECORD_COUNT) -> None:
        self.faults = broker.faults
        self.every = total // (drops + 1)
        self.rule_ids: list[int] = []

    def on_sent(self, count: int) -> None:
        if count and count % self.every == 0 and len(self.rule_ids) < DROPS:
            self.rule_ids.append(self.faults.drop_responses("produce", count=1))

    def fired(self) -> int:
        return sum(r["fired"] for r in self.faults.rules() if r["id"] in self.rule_ids)


def duplicates(broker, topic: str) -> float:
    registry = broker.server.state.metrics.registry
    return registry.get_sample_value("onceflow_producer_duplicates_total", {"topic": topic}) or 0


def check(broker, topic: str, schedule: DropSchedule) -> None:
    assert schedule.fired() == DROPS, "every planned drop must have hit a Produce answer"
    assert duplicates(broker, topic) >= DROPS, "each dropped answer leads to a recognised retry"
    ids = read_ids(broker.bootstrap_servers, topic, PARTITIONS)
    problems = exactly_once_problems(ids, range(RECORD_COUNT))
    assert not problems, "\n".join(problems)


@pytest.fixture
def broker(onceflow_fresh_broker):
    yield onceflow_fresh_broker
    onceflow_fresh_broker.faults.clear()


@pytest.fixture
def topic(broker) -> str:
    return create_topic(broker.bootstrap_servers, f"idem-{uuid.uuid4().hex[:8]}", PARTITIONS)


def test_confluent_kafka_idempotent_producer_through_lost_acks(broker, topic):
    errors: list[str] = []
    producer = Producer({
        "bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True,
        # librdkafka waits for a Produce answer at most socket.timeout.ms (and at most
        # what is left of the message's delivery.timeout.ms); request.timeout.ms is only
        # the ack timeout it asks the broker to apply.
        "acks": "all", "socket.timeout.ms": REQUEST_TIMEOUT_MS,
        "request.timeout.ms": REQUEST_TIMEOUT_MS, "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
        "linger.ms": LINGER_MS,
        "batch.size": BATCH_BYTES, "max.in.flight.requests.per.connection": 5,
    })
    schedule = DropSchedule(broker)

    def on_delivery(err, _message) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(RECORD_COUNT):
        schedule.on_sent(i)
        while True:
            try:
                producer.produce(topic, value=value_of(i), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0
    assert not errors, errors[:5]
    check(broker, topic, schedule)


def test_kafka_python_idempotent_producer_through_lost_acks(broker, topic):
    from kafka import KafkaProducer

    logging.getLogger("kafka").setLevel(logging.ERROR)  # timeouts are expected here
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, enable_idempotence=True, acks="all",
        request_timeout_ms=REQUEST_TIMEOUT_MS, delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
        linger_ms=LINGER_MS, batch_size=BATCH_BYTES, max_in_flight_requests_per_connection=5,
    )
    schedule = DropSchedule(broker)
    futures = []
    try:
        for i in range(RECORD_COUNT):
            schedule.on_sent(i)
            futures.append(producer.send(topic, value=value_of(i)))
        producer.flush(FLUSH_TIMEOUT_S)
        failed = [f.exception for f in futures if f.failed()]
        assert not failed, failed[:5]
    finally:
        producer.close(timeout=10)
    check(broker, topic, schedule)


def test_aiokafka_idempotent_producer_through_lost_acks(broker, topic):
    from aiokafka import AIOKafkaProducer

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # timeouts are expected here
    schedule = DropSchedule(broker)

    async def produce_all() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap_servers, enable_idempotence=True, acks="all",
            request_timeout_ms=REQUEST_TIMEOUT_MS, linger_ms=LINGER_MS,
            max_batch_size=BATCH_BYTES)
        await producer.start()
        try:
            pending = []
            for i in range(RECORD_COUNT):
                schedule.on_sent(i)
                pending.append(await send(producer, topic, value_of(i)))
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(produce_all(), FLUSH_TIMEOUT_S))
    check(broker, topic, schedule)


async def send(producer, topic: str, value: bytes) -> asyncio.Future:
    """aiokafka's send() gives up after request_timeout_ms when its buffer stays full -
    which it does while a dropped answer is awaited. The record was not taken then, so
    it is offered again (in order: one record at a time)."""
    from aiokafka.errors import KafkaTimeoutError

    while True:
        try:
            return await producer.send(topic, value=value)
        except KafkaTimeoutError:
            continue
