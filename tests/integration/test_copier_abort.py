"""The copier's abort path: an abortable error in the middle of a transaction aborts it,
rewinds the consumer, and the batch is copied again - exactly once in the end.

The copier runs in this process (its `poll_batch` / `copy` steps driven by the test) so
that the test can count its aborts; the broker is told by fault injection to refuse one
Produce request of the copier's transaction with a non-retriable error.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from onceflow import Broker
from onceflow.examples.copier import Copier, transform
from tests.helpers import create_topic, unique

RECORDS = 2_000
PARTITIONS = 2
COPY_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0
TIMEOUT_S = 15.0
# Non-retriable for a Produce: librdkafka fails the records, which makes the open
# transaction abortable (txn_requires_abort) rather than fatal.
ABORTABLE_PRODUCE_ERROR = "INVALID_RECORD"


class CountingProducer:
    """The copier's producer, with its abort_transaction() calls counted."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self.aborts = 0

    def abort_transaction(self, *args: Any) -> None:
        self.aborts += 1
        self._producer.abort_transaction(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


@pytest.fixture
def broker():
    with Broker(group_initial_rebalance_delay_ms=0) as running:
        yield running


def produce_input(bootstrap: str, topic: str) -> None:
    """RECORDS records spread evenly over the partitions. The partition is named: records
    without a key go to librdkafka's sticky partition, which sometimes takes all of them
    (about one topic in ten), leaving the other input partition empty - the copier then
    never commits an offset for it (committed stays OFFSET_INVALID, not the end offset 0),
    so the test could never finish."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, value=f"record-{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(TIMEOUT_S) == 0


def copy_until_committed(copier: Copier, topic: str) -> None:
    """Drive the copier until its group has committed every input offset."""
    ends = {p: copier.consumer.get_watermark_offsets(TopicPartition(topic, p), TIMEOUT_S)[1]
            for p in range(PARTITIONS)}
    assert all(ends.values()), f"an input partition is empty, nothing would commit it: {ends}"
    deadline, copied, offsets = time.monotonic() + COPY_TIMEOUT_S, Counter(), {}
    while time.monotonic() < deadline:
        records = copier.poll_batch()
        if records:
            copier.copy(records, copier.consumer.consumer_group_metadata())
            copied.update(r.partition() for r in records)
        committed = copier.consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], TIMEOUT_S)
        offsets = {tp.partition: (tp.offset, str(tp.error) if tp.error else None)
                   for tp in committed}
        if {p: offset for p, (offset, _) in offsets.items()} == ends:
            return
    positions = copier.consumer.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
    pytest.fail(f"the copier did not commit every input offset in time: committed {offsets}, "
                f"ends {ends}, positions {[tp.offset for tp in positions]}, records copied "
                f"per partition (aborted ones too) {dict(copied)}")


def read_committed_values(bootstrap: str, topic: str) -> Counter:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("verify"),
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen: Counter = Counter()
    deadline = time.monotonic() + READ_TIMEOUT_S
    while sum(seen.values()) < RECORDS and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            assert message.error() is None, message.error()
            seen[message.value()] += 1
    for message in consumer.consume(1000, 1.0):  # anything beyond RECORDS is a duplicate
        seen[message.value()] += 1
    consumer.close()
    return seen


def test_abortable_error_aborts_rewinds_and_copies_exactly_once(broker):
    bootstrap, run = broker.bootstrap_servers, unique("abort")
    source = create_topic(bootstrap, f"{run}-input", PARTITIONS)
    target = create_topic(bootstrap, f"{run}-output", PARTITIONS)
    produce_input(bootstrap, source)

    copier = Copier(bootstrap, source, target, f"{run}-copier", "0")
    counting = CountingProducer(copier.producer)
    copier.producer = counting  # type: ignore[assignment]
    broker.faults.fail_requests("produce", ABORTABLE_PRODUCE_ERROR, count=1)
    try:
        copy_until_committed(copier, source)
    finally:
        copier.consumer.close()

    assert counting.aborts >= 1, "the injected error did not abort a transaction"
    seen = read_committed_values(bootstrap, target)
    assert seen == Counter({transform(f"record-{i}".encode()): 1 for i in range(RECORDS)})
